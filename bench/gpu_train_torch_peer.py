#!/usr/bin/python3
"""PyTorch peer for gpu_train_bench: GPT-2 124M (or, with --arch llama and
its shape, a Llama model) training steps on one GPU the way a PyTorch user
writes them (bench/torch_gpt.py's models with SDPA attention (grouped-query
for Llama), autocast bf16, fused AdamW, gradient clipping at 1.0), eager or
torch.compile; or on --ranks GPUs (one process each, NCCL, the global batch
split over them) under DistributedDataParallel (--mode ddp) or FSDP2
(--mode fsdp2: fully_shard per block, then the root; ZeRO-3's sharding).
One line per batch size (the global batch), from rank 0:
  torch <mode> B=<b> tok_s <x> ms_per_step <y> peak_gib <z>
with <mode> eager, compile, ddpN or fsdp2xN (N ranks; peak_gib: GPU 0's).
Example: gpu_train_torch_peer.py --mode eager --batch 16 32 --steps 20"""
import argparse
import os
import socket
import time

import torch

from torch_gpt import GPT, Llama  # bench/torch_gpt.py, beside this script


def wrap(a, model, rank):
    """The model as the mode trains it: itself (eager), compiled, or spread
    over the process group (ddp, fsdp2)."""
    if a.mode == "compile":
        return torch.compile(model)
    if a.mode == "ddp":
        return torch.nn.parallel.DistributedDataParallel(model, device_ids=[rank])
    if a.mode == "fsdp2":
        from torch.distributed.fsdp import fully_shard
        for block in model.blocks:
            fully_shard(block)
        return fully_shard(model)
    return model


def run(a, batch, rank=0):
    torch.manual_seed(0)
    if a.arch == "llama":
        model = Llama(a.layers, a.heads, a.kv_heads, a.dim, a.ffn_dim, a.seq, a.vocab,
                      theta=a.rope_theta, eps=a.norm_eps, tie=a.tie_embeddings).cuda()
    else:
        model = GPT(a.layers, a.heads, a.dim, a.seq, a.vocab, sdpa=True).cuda()
    step_model = wrap(a, model, rank)
    if a.mode == "fsdp2":
        model = step_model  # its parameters are the shards now
    decay = [p for p in model.parameters() if p.dim() >= 2]
    no_decay = [p for p in model.parameters() if p.dim() < 2]
    opt = torch.optim.AdamW([{"params": decay, "weight_decay": 0.1},
                             {"params": no_decay, "weight_decay": 0.0}],
                            lr=6e-4, betas=(0.9, 0.95), eps=1e-8, fused=True)
    local = batch // a.ranks  # this rank's share of the global batch
    idx = torch.randint(0, a.vocab, (local, a.seq), device="cuda")
    tgt = torch.randint(0, a.vocab, (local, a.seq), device="cuda")
    torch.cuda.reset_peak_memory_stats()

    def step():
        opt.zero_grad(set_to_none=True)
        with torch.autocast("cuda", dtype=torch.bfloat16):
            loss = step_model(idx, tgt)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        return loss

    def barrier():
        torch.cuda.synchronize()
        if a.ranks > 1:
            torch.distributed.barrier()

    for _ in range(a.warmup):
        step()
    barrier()
    t0 = time.perf_counter()
    for _ in range(a.steps):
        loss = step()
    loss.item()
    barrier()  # the slowest rank's time
    ms = (time.perf_counter() - t0) / a.steps * 1e3
    peak = torch.cuda.max_memory_allocated() / 2**30
    name = a.mode if a.ranks == 1 else (f"ddp{a.ranks}" if a.mode == "ddp" else f"fsdp2x{a.ranks}")
    if rank == 0:
        print(f"torch {name} B={batch} tok_s {batch * a.seq / (ms / 1e3):.0f} "
              f"ms_per_step {ms:.2f} peak_gib {peak:.2f}", flush=True)
    del model, opt, step_model
    torch.cuda.empty_cache()


def rank_main(rank, a, port):
    """One process of a --ranks run: GPU `rank`, NCCL."""
    torch.cuda.set_device(rank)
    torch.backends.cuda.matmul.allow_tf32 = True
    torch.distributed.init_process_group("nccl", init_method=f"tcp://127.0.0.1:{port}",
                                         rank=rank, world_size=a.ranks)
    try:
        for b in a.batch:
            run(a, b, rank)
    finally:
        torch.distributed.destroy_process_group()


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--mode", choices=("eager", "compile", "ddp", "fsdp2"), default="eager")
    p.add_argument("--ranks", type=int, default=1,
                   help="GPUs (processes) for ddp and fsdp2; the batch is split over them")
    p.add_argument("--batch", type=int, nargs="+", default=[16, 32])
    p.add_argument("--steps", type=int, default=20, help="timed steps")
    p.add_argument("--warmup", type=int, default=5, help="untimed steps first (compile happens here)")
    for name, v in (("layers", 12), ("heads", 12), ("dim", 768), ("seq", 1024), ("vocab", 50257)):
        p.add_argument("--" + name, type=int, default=v)
    p.add_argument("--arch", choices=("gpt2", "llama"), default="gpt2")
    p.add_argument("--kv-heads", type=int, default=0, help="llama: key/value heads")
    p.add_argument("--ffn-dim", type=int, default=0, help="llama: SwiGLU width")
    p.add_argument("--rope-theta", type=float, default=500000.0)
    p.add_argument("--norm-eps", type=float, default=1e-5)
    p.add_argument("--tie-embeddings", action="store_true", help="llama: LM head = wte")
    a = p.parse_args()
    if a.arch == "llama" and (a.kv_heads < 1 or a.ffn_dim < 1):
        p.error("--arch llama needs --kv-heads and --ffn-dim")
    if a.mode in ("ddp", "fsdp2"):
        if a.ranks < 2 or torch.cuda.device_count() < a.ranks:
            p.error(f"--mode {a.mode} needs --ranks >= 2 GPUs; this machine has "
                    f"{torch.cuda.device_count()}")
        if any(b % a.ranks for b in a.batch):
            p.error(f"every --batch must divide over --ranks {a.ranks}")
        with socket.socket() as s:  # a free port for the rendezvous
            s.bind(("127.0.0.1", 0))
            port = s.getsockname()[1]
        os.environ.setdefault("NCCL_DEBUG", "WARN")
        torch.multiprocessing.spawn(rank_main, args=(a, port), nprocs=a.ranks)
        return
    a.ranks = 1
    torch.backends.cuda.matmul.allow_tf32 = True
    for b in a.batch:
        run(a, b)


if __name__ == "__main__":
    main()
