#!/usr/bin/python3
"""PyTorch peer for train_step_bench: the same fp32 GPT training step
(zero_grad, forward, backward, AdamW; no clipping) on the CPU.
Run with /usr/bin/python3 (the pyenv python3 has no torch). Prints
"tok_s <value>" and "ms_per_step <value>"."""
import argparse
import time

import torch

from torch_gpt import GPT  # bench/torch_gpt.py, beside this script


def main():
    p = argparse.ArgumentParser()
    for a in ("layers", "heads", "dim", "context", "vocab", "batch", "seq", "threads", "steps"):
        p.add_argument("--" + a, type=int, required=True)
    a = p.parse_args()
    torch.set_num_threads(a.threads)
    torch.manual_seed(0)
    model = GPT(a.layers, a.heads, a.dim, a.context, a.vocab)
    decay = [p for p in model.parameters() if p.dim() >= 2]
    no_decay = [p for p in model.parameters() if p.dim() < 2]
    opt = torch.optim.AdamW([{"params": decay, "weight_decay": 0.1},
                             {"params": no_decay, "weight_decay": 0.0}],
                            lr=1e-4, betas=(0.9, 0.95), eps=1e-8)
    idx = torch.randint(0, a.vocab, (a.batch, a.seq))
    tgt = torch.randint(0, a.vocab, (a.batch, a.seq))
    total = 0.0
    for s in range(-1, a.steps):
        t0 = time.perf_counter()
        opt.zero_grad(set_to_none=True)
        loss = model(idx, tgt)
        loss.backward()
        opt.step()
        if s >= 0:
            total += time.perf_counter() - t0
    ms = total / a.steps * 1e3
    print(f"ms_per_step {ms:.2f}")
    print(f"tok_s {a.batch * a.seq / (ms / 1e3):.1f}")


if __name__ == "__main__":
    main()
