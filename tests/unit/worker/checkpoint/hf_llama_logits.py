#!/usr/bin/python3
"""A Hugging Face Llama checkpoint with random weights, and its logits
(hf_llama_test's reference).

Usage: hf_llama_logits.py DIR

DIR/shape.txt (written by the test): "key value" lines layers heads kv_heads
dim ffn_dim vocab rope_theta norm_eps tie (0/1) batch seq_len, and optionally
rope_factor rope_low rope_high rope_original (Llama 3.1/3.2's rope_scaling of
type llama3, computed as transformers' _compute_llama3_parameters), head_dim
(a head size other than dim / heads) and qk_norm 1 (Qwen3: an RMSNorm over
each head of q and k before rotary; the checkpoint is then a
Qwen3ForCausalLM's), and experts top_k expert_ffn norm_topk first_dense for
MoE layers (a MixtralForCausalLM's block_sparse_moe without q/k norms, a
Qwen3MoeForCausalLM's mlp with them: the router's softmax, the top_k
experts, their gates renormalised when norm_topk). Writes into
DIR, as a Hugging Face LlamaForCausalLM checkpoint would hold them:
  config.json, model.safetensors (or, with "shards N" in shape.txt, N
  files and model.safetensors.index.json) (BF16 weights: the reader's widening is
  exercised), tokens.bin (int32, batch*seq_len), logits.bin (float32,
  batch*seq_len*vocab) and reference.txt naming what computed the logits:
  transformers' LlamaForCausalLM itself when it is importable (the GPU
  machines have it), else this file's own forward written the way
  modeling_llama.py computes it (rotate_half rotary, repeat_kv, RMSNorm in
  fp32, SiLU-gated MLP), in float32 from the bf16-rounded weights.
"""
import json
import math
import struct
import sys

import torch
import torch.nn.functional as F


def rotate_half(x):
    half = x.shape[-1] // 2
    return torch.cat((-x[..., half:], x[..., :half]), dim=-1)


def llama3_inv_freq(inv_freq, rs):
    """transformers' _compute_llama3_parameters (modeling_rope_utils.py)."""
    factor, low, high = rs["factor"], rs["low_freq_factor"], rs["high_freq_factor"]
    old_context_len = rs["original_max_position_embeddings"]
    low_freq_wavelen = old_context_len / low
    high_freq_wavelen = old_context_len / high
    wavelen = 2 * math.pi / inv_freq
    inv_freq_llama = torch.where(wavelen > low_freq_wavelen, inv_freq / factor, inv_freq)
    smooth_factor = (old_context_len / wavelen - low) / (high - low)
    smoothed = (1 - smooth_factor) * inv_freq_llama / factor + smooth_factor * inv_freq_llama
    is_medium = ~(wavelen < high_freq_wavelen) * ~(wavelen > low_freq_wavelen)
    return torch.where(is_medium, smoothed, inv_freq_llama)


def forward(W, cfg, idx, linear=None):
    """The logits of idx. linear(x, module): a projection's output (e.g.
    with an adapter), module its name without ".weight"; default x·W^T."""
    if linear is None:
        def linear(x, module):
            return F.linear(x, W[module + ".weight"])
    L, NH, KVH = cfg["num_hidden_layers"], cfg["num_attention_heads"], cfg["num_key_value_heads"]
    C, eps, theta = cfg["hidden_size"], cfg["rms_norm_eps"], cfg["rope_theta"]
    B, T = idx.shape
    hs = cfg.get("head_dim") or C // NH
    qk_norm = cfg["model_type"] in ("qwen3", "qwen3_moe")
    inv_freq = 1.0 / (theta ** (torch.arange(0, hs, 2, dtype=torch.int64).float() / hs))
    if cfg.get("rope_scaling"):
        inv_freq = llama3_inv_freq(inv_freq, cfg["rope_scaling"])
    freqs = torch.arange(T).float()[:, None] * inv_freq[None, :]
    emb = torch.cat((freqs, freqs), dim=-1)
    cos, sin = emb.cos(), emb.sin()

    def norm(x, w):
        return w * (x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps))

    mask = torch.tril(torch.ones(T, T, dtype=torch.bool))
    x = W["model.embed_tokens.weight"][idx]
    for l in range(L):
        p = f"model.layers.{l}."
        h = norm(x, W[p + "input_layernorm.weight"])
        q = linear(h, p + "self_attn.q_proj").view(B, T, NH, hs)
        k = linear(h, p + "self_attn.k_proj").view(B, T, KVH, hs)
        if qk_norm:  # Qwen3Attention: q_norm(q_proj(x).view(...)) before rotary
            q = norm(q, W[p + "self_attn.q_norm.weight"])
            k = norm(k, W[p + "self_attn.k_norm.weight"])
        q, k = q.transpose(1, 2), k.transpose(1, 2)
        v = linear(h, p + "self_attn.v_proj").view(B, T, KVH, hs).transpose(1, 2)
        q = q * cos + rotate_half(q) * sin
        k = k * cos + rotate_half(k) * sin
        k = k.repeat_interleave(NH // KVH, dim=1)
        v = v.repeat_interleave(NH // KVH, dim=1)
        att = (q @ k.transpose(-2, -1)) / math.sqrt(hs)
        att = att.masked_fill(~mask, float("-inf")).softmax(dim=-1)
        y = (att @ v).transpose(1, 2).reshape(B, T, NH * hs)
        x = x + linear(y, p + "self_attn.o_proj")
        h = norm(x, W[p + "post_attention_layernorm.weight"])
        if moe_layer(cfg, l):
            x = x + moe_mlp(W, cfg, p, h)
            continue
        g = linear(h, p + "mlp.gate_proj")
        u = linear(h, p + "mlp.up_proj")
        x = x + linear(F.silu(g) * u, p + "mlp.down_proj")
    x = norm(x, W["model.norm.weight"])
    head = W["model.embed_tokens.weight"] if cfg["tie_word_embeddings"] else W["lm_head.weight"]
    return x @ head.t()


def moe_layer(cfg, l):
    if cfg["model_type"] == "mixtral":
        return True
    return cfg["model_type"] == "qwen3_moe" and l not in cfg["mlp_only_layers"]


def moe_mlp(W, cfg, p, h):
    """MixtralSparseMoeBlock / Qwen3MoeSparseMoeBlock: softmax over the
    router's logits in fp32, the top k, renormalised (Mixtral always), each
    expert's SwiGLU on its tokens, weighted."""
    mixtral = cfg["model_type"] == "mixtral"
    E = cfg["num_local_experts"] if mixtral else cfg["num_experts"]
    K = cfg["num_experts_per_tok"]
    pre = p + ("block_sparse_moe." if mixtral else "mlp.")
    B, T, C = h.shape
    x = h.reshape(-1, C)
    weights = F.linear(x, W[pre + "gate.weight"]).float().softmax(dim=-1)
    top, chosen = torch.topk(weights, K, dim=-1)
    if mixtral or cfg["norm_topk_prob"]:
        top = top / top.sum(dim=-1, keepdim=True)
    out = torch.zeros_like(x)
    names = ("w1", "w3", "w2") if mixtral else ("gate_proj", "up_proj", "down_proj")
    for e in range(E):
        tok, slot = torch.where(chosen == e)
        if tok.numel() == 0:
            continue
        q = pre + f"experts.{e}."
        g = F.linear(x[tok], W[q + names[0] + ".weight"])
        u = F.linear(x[tok], W[q + names[1] + ".weight"])
        y = F.linear(F.silu(g) * u, W[q + names[2] + ".weight"])
        out = out.index_add(0, tok, y * top[tok, slot, None])
    return out.view(B, T, C)


def write_safetensors(path, tensors):
    """tensors: name -> float32 torch tensor, written as BF16."""
    header, blobs, offset = {}, [], 0
    for name, t in tensors.items():
        data = t.to(torch.bfloat16).contiguous().view(torch.int16).numpy().tobytes()
        header[name] = {"dtype": "BF16", "shape": list(t.shape),
                        "data_offsets": [offset, offset + len(data)]}
        blobs.append(data)
        offset += len(data)
    header["__metadata__"] = {"format": "pt"}
    text = json.dumps(header).encode()
    text += b" " * ((8 - len(text) % 8) % 8)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(text)))
        f.write(text)
        for b in blobs:
            f.write(b)


def main():
    d = sys.argv[1]
    s = {}
    for line in open(f"{d}/shape.txt"):
        k, v = line.split()
        s[k] = v
    L, NH, KVH = int(s["layers"]), int(s["heads"]), int(s["kv_heads"])
    C, FF, V = int(s["dim"]), int(s["ffn_dim"]), int(s["vocab"])
    B, T, tie = int(s["batch"]), int(s["seq_len"]), s["tie"] == "1"
    qwen3 = s.get("qk_norm") == "1"
    hs = int(s["head_dim"]) if "head_dim" in s else C // NH
    cfg = {"architectures": ["LlamaForCausalLM"], "model_type": "llama", "hidden_size": C,
           "intermediate_size": FF, "num_hidden_layers": L, "num_attention_heads": NH,
           "num_key_value_heads": KVH, "vocab_size": V, "max_position_embeddings": 64,
           "rms_norm_eps": float(s["norm_eps"]), "rope_theta": float(s["rope_theta"]),
           "rope_scaling": None, "tie_word_embeddings": tie, "hidden_act": "silu",
           "attention_bias": False, "mlp_bias": False, "torch_dtype": "bfloat16"}
    if qwen3:
        cfg.update({"architectures": ["Qwen3ForCausalLM"], "model_type": "qwen3", "head_dim": hs,
                    "use_sliding_window": False})
    E = int(s.get("experts", 0))
    mixtral, qwen3_moe = E > 0 and not qwen3, E > 0 and qwen3
    if E > 0:
        K, He, dense = int(s["top_k"]), int(s["expert_ffn"]), int(s["first_dense"])
        if mixtral:
            cfg.update({"architectures": ["MixtralForCausalLM"], "model_type": "mixtral",
                        "intermediate_size": He, "num_local_experts": E, "num_experts_per_tok": K,
                        "output_router_logits": False, "router_aux_loss_coef": 0.02})
        else:
            cfg.update({"architectures": ["Qwen3MoeForCausalLM"], "model_type": "qwen3_moe",
                        "num_experts": E, "num_experts_per_tok": K, "moe_intermediate_size": He,
                        "norm_topk_prob": s["norm_topk"] == "1", "decoder_sparse_step": 1,
                        "mlp_only_layers": list(range(dense)), "output_router_logits": False,
                        "router_aux_loss_coef": 0.001})
    if "rope_factor" in s:
        cfg["rope_scaling"] = {"rope_type": "llama3", "factor": float(s["rope_factor"]),
                               "low_freq_factor": float(s["rope_low"]),
                               "high_freq_factor": float(s["rope_high"]),
                               "original_max_position_embeddings": int(s["rope_original"])}
    torch.manual_seed(0)
    Q, KV = NH * hs, KVH * hs
    shapes = {"model.embed_tokens.weight": (V, C), "model.norm.weight": (C,)}
    for l in range(L):
        p = f"model.layers.{l}."
        shapes.update({p + "input_layernorm.weight": (C,), p + "post_attention_layernorm.weight": (C,),
                       p + "self_attn.q_proj.weight": (Q, C), p + "self_attn.k_proj.weight": (KV, C),
                       p + "self_attn.v_proj.weight": (KV, C), p + "self_attn.o_proj.weight": (C, Q)})
        if E > 0 and moe_layer(cfg, l):
            pre = p + ("block_sparse_moe." if mixtral else "mlp.")
            names = ("w1", "w3", "w2") if mixtral else ("gate_proj", "up_proj", "down_proj")
            shapes[pre + "gate.weight"] = (E, C)
            for e in range(E):
                q = pre + f"experts.{e}."
                shapes.update({q + names[0] + ".weight": (He, C), q + names[1] + ".weight": (He, C),
                               q + names[2] + ".weight": (C, He)})
        else:
            shapes.update({p + "mlp.gate_proj.weight": (FF, C), p + "mlp.up_proj.weight": (FF, C),
                           p + "mlp.down_proj.weight": (C, FF)})
        if qwen3:
            shapes.update({p + "self_attn.q_norm.weight": (hs,), p + "self_attn.k_norm.weight": (hs,)})
    if not tie:
        shapes["lm_head.weight"] = (V, C)
    W = {}
    for name, shape in sorted(shapes.items()):
        t = torch.randn(shape) * (0.3 if len(shape) == 2 else 0.1) + (1.0 if len(shape) == 1 else 0.0)
        W[name] = t.to(torch.bfloat16).float()  # what the BF16 file holds
    shards = int(s.get("shards", 1))
    if shards == 1:
        write_safetensors(f"{d}/model.safetensors", W)
    else:  # transformers' sharded layout: files of consecutive tensors and their index
        names = sorted(W)
        per = -(-len(names) // shards)
        weight_map = {}
        for k in range(shards):
            file = f"model-{k + 1:05d}-of-{shards:05d}.safetensors"
            part = {n: W[n] for n in names[k * per:(k + 1) * per]}
            write_safetensors(f"{d}/{file}", part)
            weight_map.update({n: file for n in part})
        total = sum(2 * t.numel() for t in W.values())
        with open(f"{d}/model.safetensors.index.json", "w") as f:
            json.dump({"metadata": {"total_size": total}, "weight_map": weight_map}, f, indent=2)
    with open(f"{d}/config.json", "w") as f:
        json.dump(cfg, f, indent=2)
    idx = torch.randint(0, V, (B, T))
    idx.to(torch.int32).numpy().tofile(f"{d}/tokens.bin")
    reference = "this script's modeling_llama-style forward"
    try:
        import transformers  # noqa: F401 (the GPU machines have it)
        if mixtral:
            from transformers import MixtralForCausalLM as Model
        elif qwen3_moe:
            from transformers import Qwen3MoeForCausalLM as Model
        elif qwen3:
            from transformers import Qwen3ForCausalLM as Model
        else:
            from transformers import LlamaForCausalLM as Model
        # from_pretrained, the way a user loads the checkpoint, not
        # load_state_dict: transformers 5 turns per-expert tensors into its
        # fused experts while loading, and load_state_dict(strict=False) of
        # the file's names would leave the experts at their random init.
        model, info = Model.from_pretrained(d, output_loading_info=True)
        missing = [k for k in info.get("missing_keys", ()) if not (tie and k == "lm_head.weight")]
        unread = list(info.get("unexpected_keys", ())) + list(info.get("mismatched_keys", ()))
        if missing or unread:
            sys.exit(f"hf_llama_logits.py: transformers left tensors unread: missing {missing}, "
                     f"unexpected or mismatched {unread}")
        model = model.float().eval()  # the file's bf16 values, exactly
        with torch.no_grad():
            logits = model(idx).logits
        reference = f"transformers {transformers.__version__} {Model.__name__}"
    except ImportError:
        with torch.no_grad():
            logits = forward(W, cfg, idx)
    logits.float().numpy().tofile(f"{d}/logits.bin")
    with open(f"{d}/reference.txt", "w") as f:
        f.write(reference + "\n")


if __name__ == "__main__":
    main()
