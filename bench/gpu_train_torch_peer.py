#!/usr/bin/python3
"""PyTorch peer for gpu_train_bench: GPT-2 124M training steps on one GPU the
way a PyTorch user writes them (bench/torch_gpt.py's model with SDPA
attention, autocast bf16, fused AdamW, gradient clipping at 1.0), eager or
torch.compile. One line per batch size:
  torch <mode> B=<b> tok_s <x> ms_per_step <y> peak_gib <z>
Example: gpu_train_torch_peer.py --mode eager --batch 16 32 --steps 20"""
import argparse
import time

import torch

from torch_gpt import GPT  # bench/torch_gpt.py, beside this script


def run(a, batch):
    torch.manual_seed(0)
    model = GPT(a.layers, a.heads, a.dim, a.seq, a.vocab, sdpa=True).cuda()
    decay = [p for p in model.parameters() if p.dim() >= 2]
    no_decay = [p for p in model.parameters() if p.dim() < 2]
    opt = torch.optim.AdamW([{"params": decay, "weight_decay": 0.1},
                             {"params": no_decay, "weight_decay": 0.0}],
                            lr=6e-4, betas=(0.9, 0.95), eps=1e-8, fused=True)
    step_model = torch.compile(model) if a.mode == "compile" else model
    idx = torch.randint(0, a.vocab, (batch, a.seq), device="cuda")
    tgt = torch.randint(0, a.vocab, (batch, a.seq), device="cuda")
    torch.cuda.reset_peak_memory_stats()

    def step():
        opt.zero_grad(set_to_none=True)
        with torch.autocast("cuda", dtype=torch.bfloat16):
            loss = step_model(idx, tgt)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        return loss

    for _ in range(a.warmup):
        step()
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    for _ in range(a.steps):
        loss = step()
    loss.item()
    torch.cuda.synchronize()
    ms = (time.perf_counter() - t0) / a.steps * 1e3
    peak = torch.cuda.max_memory_allocated() / 2**30
    print(f"torch {a.mode} B={batch} tok_s {batch * a.seq / (ms / 1e3):.0f} "
          f"ms_per_step {ms:.2f} peak_gib {peak:.2f}", flush=True)
    del model, opt, step_model
    torch.cuda.empty_cache()


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--mode", choices=("eager", "compile"), default="eager")
    p.add_argument("--batch", type=int, nargs="+", default=[16, 32])
    p.add_argument("--steps", type=int, default=20, help="timed steps")
    p.add_argument("--warmup", type=int, default=5, help="untimed steps first (compile happens here)")
    for name, v in (("layers", 12), ("heads", 12), ("dim", 768), ("seq", 1024), ("vocab", 50257)):
        p.add_argument("--" + name, type=int, default=v)
    a = p.parse_args()
    torch.backends.cuda.matmul.allow_tf32 = True
    for b in a.batch:
        run(a, b)


if __name__ == "__main__":
    main()
