#!/usr/bin/python3
"""PyTorch DDP peer for ddp_scaling_bench: the same fp32 GPT-2 training step
(zero_grad, forward, backward with DDP's bucketed gradient all-reduce over
Gloo, AdamW; no clipping) on `--ranks` CPU processes of `--threads` threads.

Run with /usr/bin/python3 (the pyenv python3 has no torch). The processes
rendezvous over tcp://127.0.0.1:<free port>. Rank 0 prints one line per
result, "key value":
  ms_per_step      wall time per optimizer step (slowest rank), median over
                   the timed steps (robust to other load on a shared machine)
  tok_s            tokens per second summed over ranks
  allreduce_ms     one bare all_reduce of the whole fp32 gradient, in 25 MiB
                   buckets like DDP's default (median of 3, after the run)
  grad_mib         size of that gradient
"""
import argparse
import os
import socket
import statistics
import time

import torch
import torch.distributed as dist
import torch.multiprocessing as mp
from torch.nn.parallel import DistributedDataParallel as DDP

from torch_gpt import GPT  # bench/torch_gpt.py, beside this script


def worker(rank, a, port):
    torch.set_num_threads(a.threads)
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}",
                            rank=rank, world_size=a.ranks)
    torch.manual_seed(0)  # same initial weights on every rank (DDP also broadcasts them)
    model = DDP(GPT(a.layers, a.heads, a.dim, a.context, a.vocab))
    params = list(model.parameters())
    decay = [p for p in params if p.dim() >= 2]
    no_decay = [p for p in params if p.dim() < 2]
    opt = torch.optim.AdamW([{"params": decay, "weight_decay": 0.1},
                             {"params": no_decay, "weight_decay": 0.0}],
                            lr=1e-4, betas=(0.9, 0.95), eps=1e-8)
    g = torch.Generator().manual_seed(1 + rank)  # each rank its own shard of the batch
    idx = torch.randint(0, a.vocab, (a.batch, a.seq), generator=g)
    tgt = torch.randint(0, a.vocab, (a.batch, a.seq), generator=g)

    def step():
        opt.zero_grad(set_to_none=True)
        model(idx, tgt).backward()
        opt.step()

    for _ in range(a.warmup):
        step()
    dist.barrier()
    wall = torch.zeros(a.steps, dtype=torch.float64)
    for i in range(a.steps):
        t0 = time.perf_counter()
        step()
        wall[i] = time.perf_counter() - t0
    dist.all_reduce(wall, op=dist.ReduceOp.MAX)  # a step lasts as long as its slowest rank

    # The bare cost of DDP's communication: the whole gradient once, in
    # 25 MiB buckets issued asynchronously (as DDP does), waited for together.
    numel = sum(p.numel() for p in params)
    flat = torch.ones(numel, dtype=torch.float32)
    bucket = 25 * 1024 * 1024 // 4
    times = []
    for _ in range(3):
        dist.barrier()
        t = time.perf_counter()
        works = [dist.all_reduce(flat[o:o + bucket], async_op=True)
                 for o in range(0, numel, bucket)]
        for w in works:
            w.wait()
        times.append((time.perf_counter() - t) * 1e3)

    if rank == 0:
        ms = statistics.median(wall.tolist()) * 1e3
        print(f"ms_per_step {ms:.2f}")
        print(f"tok_s {a.ranks * a.batch * a.seq / (ms / 1e3):.1f}")
        print(f"allreduce_ms {statistics.median(times):.2f}")
        print(f"grad_mib {numel * 4 / 2**20:.1f}", flush=True)
    del works, flat
    dist.barrier()
    # Tearing down DDP's Reducer and the Gloo process group can deadlock in
    # torch 1.13 (~ProcessGroupGloo holds its queue lock while a worker thread
    # waits for the GIL to free a tensor); everything is reported, so leave.
    os._exit(0)


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def main():
    p = argparse.ArgumentParser()
    for k in ("layers", "heads", "dim", "context", "vocab", "batch", "seq", "steps"):
        p.add_argument("--" + k, type=int, required=True)
    p.add_argument("--ranks", type=int, default=2)
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--warmup", type=int, default=2)
    a = p.parse_args()
    os.environ.setdefault("OMP_NUM_THREADS", str(a.threads))
    mp.spawn(worker, args=(a, free_port()), nprocs=a.ranks, join=True)


if __name__ == "__main__":
    main()
