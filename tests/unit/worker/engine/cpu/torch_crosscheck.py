#!/usr/bin/python3
"""PyTorch reference for shardtrain's CPU engine (model_crosscheck_test).

Usage: torch_crosscheck.py DIR grad|adamw

DIR holds what the C++ test wrote:
  config.txt   "key value" lines: arch (gpt2 | llama) layers heads dim context
               vocab padded_vocab batch seq_len; for llama also kv_heads
               ffn_dim rope_theta norm_eps tie_embeddings head_dim qk_norm
               (Qwen3: an RMSNorm over each head of q and k before rotary);
               with Mixture-of-Experts layers also experts top_k
               expert_ffn_dim shared_experts scoring (softmax | sigmoid)
               norm_topk_prob first_dense_layers aux_loss_coef z_loss_coef
               (and for adamw:
               steps lr_0..lr_{n-1} beta1 beta2 eps weight_decay)
  layout.txt   one tensor per line: name offset numel decay d0 [d1]
  params.bin   flat float32 parameters
grad:  tokens.bin, targets.bin (int32, B*T) -> writes loss.txt (the mean
       cross-entropy), logits.bin (B*T*V float32) and grads.bin (flat
       float32, same layout): the gradient of the cross-entropy plus every
       MoE layer's balancing losses, in float32.

The Llama block is written here as Meta's reference and Hugging Face's
LlamaForCausalLM compute it (RMSNorm, rotary q/k, grouped-query attention
by repeating each key/value head over its group, SwiGLU), with rotary pairs
(2i, 2i+1) of each head, shardtrain's convention (Meta's; Hugging Face's
rotate_half pairs (i, i + hs/2), a permutation of the q/k weight rows).
adamw: grads_<k>.bin for k < steps -> runs torch.optim.AdamW (decay group =
       the tensors with decay=1, no-decay group weight_decay=0) and writes
       adamw_params.bin.
"""
import math
import sys

import numpy as np
import torch
import torch.nn.functional as F


def main():
    d, mode = sys.argv[1], sys.argv[2]
    torch.set_num_threads(2)
    cfg = {}
    for line in open(f"{d}/config.txt"):
        k, v = line.split()
        cfg[k] = v
    layout = []
    for line in open(f"{d}/layout.txt"):
        f = line.split()
        layout.append((f[0], int(f[1]), int(f[2]), f[3] == "1",
                       [int(x) for x in f[4:]]))
    flat = np.fromfile(f"{d}/params.bin", dtype=np.float32)
    P = {}
    for name, off, n, _, shape in layout:
        P[name] = torch.tensor(flat[off:off + n].reshape(shape),
                               dtype=torch.float32, requires_grad=True)
    total = sum(n for _, _, n, _, _ in layout)

    def flatten(get):
        out = np.zeros(total, dtype=np.float32)
        for name, off, n, _, _ in layout:
            out[off:off + n] = get(name).detach().numpy().reshape(-1)
        return out

    if mode == "grad":
        V, B, T = int(cfg["vocab"]), int(cfg["batch"]), int(cfg["seq_len"])
        idx = torch.from_numpy(
            np.fromfile(f"{d}/tokens.bin", dtype=np.int32).astype(np.int64)).view(B, T)
        tgt = torch.from_numpy(
            np.fromfile(f"{d}/targets.bin", dtype=np.int32).astype(np.int64)).view(B, T)
        mask = torch.tril(torch.ones(T, T, dtype=torch.bool))
        balance = []  # each MoE layer's balancing losses
        if cfg.get("arch", "gpt2") == "llama":
            logits = llama_logits(P, cfg, idx, mask, balance)
        else:
            logits = gpt2_logits(P, cfg, idx, mask, balance)
        loss = F.cross_entropy(logits.reshape(-1, V), tgt.reshape(-1))
        (loss + sum(balance)).backward()
        with open(f"{d}/loss.txt", "w") as f:
            f.write(f"{loss.item():.9g}\n")
        logits.detach().numpy().astype(np.float32).tofile(f"{d}/logits.bin")
        flatten(lambda n: P[n].grad).tofile(f"{d}/grads.bin")
    elif mode == "adamw":
        steps = int(cfg["steps"])
        decay = [P[n] for n, _, _, dec, _ in layout if dec]
        no_decay = [P[n] for n, _, _, dec, _ in layout if not dec]
        wd = float(cfg["weight_decay"])
        opt = torch.optim.AdamW(
            [{"params": decay, "weight_decay": wd},
             {"params": no_decay, "weight_decay": 0.0}],
            lr=float(cfg["lr_0"]), betas=(float(cfg["beta1"]), float(cfg["beta2"])),
            eps=float(cfg["eps"]), foreach=False)
        for s in range(steps):
            g = np.fromfile(f"{d}/grads_{s}.bin", dtype=np.float32)
            for name, off, n, _, shape in layout:
                P[name].grad = torch.tensor(g[off:off + n].reshape(shape))
            for group in opt.param_groups:
                group["lr"] = float(cfg[f"lr_{s}"])
            opt.step()
        flatten(lambda n: P[n]).tofile(f"{d}/adamw_params.bin")
    else:
        raise SystemExit(f"unknown mode {mode}")


def moe_layer(cfg, l):
    return int(cfg.get("experts", 0)) > 0 and l >= int(cfg.get("first_dense_layers", 0))


def mlp(P, cfg, p, h, width, arch):
    """A dense MLP of hidden `width` on h (..., C): GPT-2's GELU with biases
    or Llama's SwiGLU of [gate; up]. p: the tensors' name prefix."""
    b = (lambda n: P[n + ".bias"]) if arch == "gpt2" else (lambda n: None)
    if arch == "gpt2":
        a = F.gelu(F.linear(h, P[p + "fc.weight"], b(p + "fc")), approximate="tanh")
    else:
        gate, up = F.linear(h, P[p + "fc.weight"]).split(width, dim=-1)
        a = F.silu(gate) * up
    return F.linear(a, P[p + "proj.weight"], b(p + "proj"))


def moe_mlp(P, cfg, p, h, arch, balance):
    """A Mixtral-style MoE MLP (Hugging Face's MixtralSparseMoeBlock, with a
    sigmoid scoring and shared experts as DeepSeek-V3 / Qwen2-MoE add them):
    the top_k experts by score, their gates (renormalised when
    norm_topk_prob) weighing their outputs; appends the balancing losses,
    Megatron-Core's Switch loss coef·E·Σ_e (load_e / (N·K))·mean_t p_te and
    the z-loss coef·mean_t logsumexp(logits_t)², to `balance`."""
    E, K, He = int(cfg["experts"]), int(cfg["top_k"]), int(cfg["expert_ffn_dim"])
    shape = h.shape
    x = h.reshape(-1, shape[-1])
    N = x.shape[0]
    logits = F.linear(x, P[p + "mlp.router.weight"])
    sigmoid = cfg["scoring"] == "sigmoid"
    scores = torch.sigmoid(logits) if sigmoid else torch.softmax(logits, dim=-1)
    top, chosen = torch.topk(scores, K, dim=-1)
    gates = top / top.sum(-1, keepdim=True) if cfg["norm_topk_prob"] == "1" else top
    out = torch.zeros_like(x)
    for e in range(E):
        tok, slot = torch.where(chosen == e)
        if tok.numel() == 0:
            continue
        y = mlp(P, cfg, f"{p}mlp.experts.{e}.", x[tok], He, arch)
        out = out.index_add(0, tok, y * gates[tok, slot, None])
    S = int(cfg["shared_experts"])
    if S > 0:
        out = out + mlp(P, cfg, p + "mlp.", x, S * He, arch)
    load = torch.bincount(chosen.reshape(-1), minlength=E).to(torch.float32)
    probs = scores / scores.sum(-1, keepdim=True) if sigmoid else scores
    aux = float(cfg["aux_loss_coef"]) * E * (load / (N * K) * probs.mean(0)).sum()
    z = float(cfg["z_loss_coef"]) * (torch.logsumexp(logits, dim=-1) ** 2).mean()
    balance.append(aux + z)
    return out.view(shape)


def block_mlp(P, cfg, l, h, arch, balance):
    p = f"block.{l}."
    if moe_layer(cfg, l):
        return moe_mlp(P, cfg, p, h, arch, balance)
    width = int(cfg["ffn_dim"]) if arch == "llama" else 4 * int(cfg["dim"])
    return mlp(P, cfg, p + "mlp.", h, width, arch)


def gpt2_logits(P, cfg, idx, mask, balance):
    """GPT-2: learned positions, LayerNorm, GELU MLP, biases, tied head."""
    L, NH, C, V = int(cfg["layers"]), int(cfg["heads"]), int(cfg["dim"]), int(cfg["vocab"])
    B, T = idx.shape
    hs = C // NH
    x = P["wte"][idx] + P["wpe"][:T]
    for l in range(L):
        p = f"block.{l}."
        h = F.layer_norm(x, (C,), P[p + "ln1.weight"], P[p + "ln1.bias"], 1e-5)
        qkv = F.linear(h, P[p + "attn.qkv.weight"], P[p + "attn.qkv.bias"])
        q, k, v = qkv.split(C, dim=2)
        q = q.view(B, T, NH, hs).transpose(1, 2)
        k = k.view(B, T, NH, hs).transpose(1, 2)
        v = v.view(B, T, NH, hs).transpose(1, 2)
        att = (q @ k.transpose(-2, -1)) * (1.0 / math.sqrt(hs))
        att = att.masked_fill(~mask, float("-inf")).softmax(dim=-1)
        y = (att @ v).transpose(1, 2).contiguous().view(B, T, C)
        x = x + F.linear(y, P[p + "attn.proj.weight"], P[p + "attn.proj.bias"])
        h = F.layer_norm(x, (C,), P[p + "ln2.weight"], P[p + "ln2.bias"], 1e-5)
        x = x + block_mlp(P, cfg, l, h, "gpt2", balance)
    x = F.layer_norm(x, (C,), P["lnf.weight"], P["lnf.bias"], 1e-5)
    return x @ P["wte"][:V].t()  # tied head; padded rows excluded


def rms_norm(x, w, eps):
    return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps) * w


def rotary(x, theta):
    """x (B, H, T, hs): pair (2i, 2i+1) at position t rotated by t·theta^(-2i/hs)."""
    T, hs = x.shape[2], x.shape[3]
    freq = theta ** (-2.0 * torch.arange(hs // 2, dtype=torch.float64) / hs)
    angle = torch.arange(T, dtype=torch.float64)[:, None] * freq[None, :]
    cos, sin = angle.cos().float(), angle.sin().float()
    x0, x1 = x[..., 0::2], x[..., 1::2]
    return torch.stack([x0 * cos - x1 * sin, x0 * sin + x1 * cos], dim=-1).flatten(-2)


def llama_logits(P, cfg, idx, mask, balance):
    """Llama: RMSNorm, rotary q/k, grouped-query attention, SwiGLU, no biases."""
    L, NH, C, V = int(cfg["layers"]), int(cfg["heads"]), int(cfg["dim"]), int(cfg["vocab"])
    KVH = int(cfg["kv_heads"])
    theta, eps = float(cfg["rope_theta"]), float(cfg["norm_eps"])
    B, T = idx.shape
    hs = int(cfg.get("head_dim", C // NH))
    qk_norm = cfg.get("qk_norm") == "1"
    x = P["wte"][idx]
    for l in range(L):
        p = f"block.{l}."
        h = rms_norm(x, P[p + "ln1.weight"], eps)
        q, k, v = F.linear(h, P[p + "attn.qkv.weight"]).split([NH * hs, KVH * hs, KVH * hs], dim=2)
        q, k = q.view(B, T, NH, hs), k.view(B, T, KVH, hs)
        if qk_norm:  # Qwen3Attention: q_norm / k_norm over each head, then rotary
            q = rms_norm(q, P[p + "attn.q_norm.weight"], eps)
            k = rms_norm(k, P[p + "attn.k_norm.weight"], eps)
        q = rotary(q.transpose(1, 2), theta)
        k = rotary(k.transpose(1, 2), theta)
        v = v.view(B, T, KVH, hs).transpose(1, 2)
        k = k.repeat_interleave(NH // KVH, dim=1)  # Hugging Face's repeat_kv
        v = v.repeat_interleave(NH // KVH, dim=1)
        att = (q @ k.transpose(-2, -1)) * (1.0 / math.sqrt(hs))
        att = att.masked_fill(~mask, float("-inf")).softmax(dim=-1)
        y = (att @ v).transpose(1, 2).contiguous().view(B, T, NH * hs)
        x = x + F.linear(y, P[p + "attn.proj.weight"])
        h = rms_norm(x, P[p + "ln2.weight"], eps)
        x = x + block_mlp(P, cfg, l, h, "llama", balance)
    x = rms_norm(x, P["lnf.weight"], eps)
    head = P["wte"] if cfg["tie_embeddings"] == "1" else P["lm_head"]
    return x @ head[:V].t()  # padded rows excluded


if __name__ == "__main__":
    main()
