"""The models the PyTorch peers of the benchmarks train (train_step_bench.py,
ddp_torch_peer.py, gpu_train_torch_peer.py): the same architectures as the C++
engine, in plain torch.nn. GPT: pre-LN blocks, tanh GELU, causal attention,
LM head tied to wte. Llama: RMSNorm, rotary q/k, grouped-query attention,
SwiGLU, no biases, untied head unless tied."""
import math

import torch
import torch.nn as nn
import torch.nn.functional as F


class Block(nn.Module):
    """Pre-LN transformer block: x + attn(ln1(x)), then x + mlp(ln2(x))."""

    def __init__(self, C, NH, sdpa=False):
        super().__init__()
        self.NH, self.sdpa = NH, sdpa
        self.ln1, self.ln2 = nn.LayerNorm(C), nn.LayerNorm(C)
        self.qkv, self.proj = nn.Linear(C, 3 * C), nn.Linear(C, C)
        self.fc, self.fc_proj = nn.Linear(C, 4 * C), nn.Linear(4 * C, C)

    def forward(self, x):
        B, T, C = x.shape
        q, k, v = self.qkv(self.ln1(x)).split(C, dim=2)
        q, k, v = (t.view(B, T, self.NH, C // self.NH).transpose(1, 2) for t in (q, k, v))
        if self.sdpa:  # PyTorch's fused attention (flash on a GPU)
            y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        else:
            att = (q @ k.transpose(-2, -1)) * (1.0 / math.sqrt(C // self.NH))
            mask = torch.tril(torch.ones(T, T, dtype=torch.bool, device=x.device))
            att = att.masked_fill(~mask, float("-inf")).softmax(dim=-1)
            y = att @ v
        y = y.transpose(1, 2).contiguous().view(B, T, C)
        x = x + self.proj(y)
        return x + self.fc_proj(F.gelu(self.fc(self.ln2(x)), approximate="tanh"))


class GPT(nn.Module):
    """GPT-2: token + position embeddings, L blocks, final LN, head tied to wte."""

    def __init__(self, L, NH, C, ctx, V, sdpa=False):
        super().__init__()
        self.wte, self.wpe = nn.Embedding(V, C), nn.Embedding(ctx, C)
        self.blocks = nn.ModuleList(Block(C, NH, sdpa) for _ in range(L))
        self.lnf = nn.LayerNorm(C)

    def forward(self, idx, tgt):
        x = self.wte(idx) + self.wpe(torch.arange(idx.shape[1], device=idx.device))
        for b in self.blocks:
            x = b(x)
        logits = self.lnf(x) @ self.wte.weight.t()  # tied head
        return F.cross_entropy(logits.view(-1, logits.shape[-1]), tgt.view(-1))


class RMSNorm(nn.Module):
    def __init__(self, C, eps):
        super().__init__()
        self.eps, self.weight = eps, nn.Parameter(torch.ones(C))

    def forward(self, x):
        return x * torch.rsqrt(x.float().pow(2).mean(-1, keepdim=True) + self.eps).to(x.dtype) \
            * self.weight


def rotary(x, cos, sin):
    """x (B, H, T, hs): pair (2i, 2i+1) rotated by the angle of its position."""
    x0, x1 = x[..., 0::2], x[..., 1::2]
    return torch.stack([x0 * cos - x1 * sin, x0 * sin + x1 * cos], dim=-1).flatten(-2)


class LlamaBlock(nn.Module):
    """x + attn(rmsnorm(x)) with rotary q/k and kv_heads key/value heads, then
    x + down(silu(gate(h)) * up(h)) with h = rmsnorm(x)."""

    def __init__(self, C, NH, KVH, FF, eps):
        super().__init__()
        self.NH, self.KVH, self.hs = NH, KVH, C // NH
        self.ln1, self.ln2 = RMSNorm(C, eps), RMSNorm(C, eps)
        self.qkv = nn.Linear(C, C + 2 * KVH * self.hs, bias=False)
        self.proj = nn.Linear(C, C, bias=False)
        self.fc = nn.Linear(C, 2 * FF, bias=False)  # [gate; up]
        self.fc_proj = nn.Linear(FF, C, bias=False)

    def forward(self, x, cos, sin):
        B, T, C = x.shape
        kv = self.KVH * self.hs
        q, k, v = self.qkv(self.ln1(x)).split([C, kv, kv], dim=2)
        q = rotary(q.view(B, T, self.NH, self.hs).transpose(1, 2), cos, sin)
        k = rotary(k.view(B, T, self.KVH, self.hs).transpose(1, 2), cos, sin)
        v = v.view(B, T, self.KVH, self.hs).transpose(1, 2)
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True,
                                           enable_gqa=self.KVH != self.NH)
        x = x + self.proj(y.transpose(1, 2).contiguous().view(B, T, C))
        gate, up = self.fc(self.ln2(x)).chunk(2, dim=-1)
        return x + self.fc_proj(F.silu(gate) * up)


class Llama(nn.Module):
    """Token embedding, L Llama blocks, final RMSNorm, LM head (untied unless tie)."""

    def __init__(self, L, NH, KVH, C, FF, ctx, V, theta=500000.0, eps=1e-5, tie=False):
        super().__init__()
        self.wte = nn.Embedding(V, C)
        self.blocks = nn.ModuleList(LlamaBlock(C, NH, KVH, FF, eps) for _ in range(L))
        self.lnf = RMSNorm(C, eps)
        self.head = None if tie else nn.Linear(C, V, bias=False)
        hs = C // NH
        freq = theta ** (-2.0 * torch.arange(hs // 2, dtype=torch.float64) / hs)
        angle = torch.arange(ctx, dtype=torch.float64)[:, None] * freq[None, :]
        self.register_buffer("cos", angle.cos().float(), persistent=False)
        self.register_buffer("sin", angle.sin().float(), persistent=False)

    def forward(self, idx, tgt):
        T = idx.shape[1]
        cos, sin = self.cos[:T], self.sin[:T]
        x = self.wte(idx)
        for b in self.blocks:
            x = b(x, cos, sin)
        x = self.lnf(x)
        logits = x @ self.wte.weight.t() if self.head is None else self.head(x)
        return F.cross_entropy(logits.view(-1, logits.shape[-1]).float(), tgt.view(-1))
