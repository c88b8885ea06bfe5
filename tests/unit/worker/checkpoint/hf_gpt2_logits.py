#!/usr/bin/python3
"""GPT-2 in plain PyTorch, from a directory `shardtrain export` wrote
(hf_gpt2_test): reads config.json and model.safetensors (the format by hand:
8-byte little-endian header length, JSON header, raw F32 tensors; no
safetensors or transformers package) and computes GPT-2's logits the way
transformers' GPT2LMHeadModel does: Conv1D layers (x @ W + b, W is (in, out)),
gelu_new (GELU's tanh form), LayerNorm eps from the config, causal softmax
attention, the LM head tied to wte.

Usage: hf_gpt2_logits.py EXPORT_DIR TOKENS_FILE LOGITS_FILE
  TOKENS_FILE: int32 B, T, then B*T int32 ids
  LOGITS_FILE (written): B*T*vocab_size float32
"""
import json
import math
import struct
import sys

import numpy as np
import torch


def read_safetensors(path):
    with open(path, "rb") as f:
        data = f.read()
    (n,) = struct.unpack("<Q", data[:8])
    header = json.loads(data[8:8 + n])
    body = data[8 + n:]
    out = {}
    for name, e in header.items():
        if name == "__metadata__":
            continue
        assert e["dtype"] == "F32", (name, e["dtype"])
        b, end = e["data_offsets"]
        a = np.frombuffer(body[b:end], dtype="<f4").reshape(e["shape"])
        out[name] = torch.tensor(a.copy())
    return out


def main():
    d, tokens_path, logits_path = sys.argv[1:4]
    torch.set_num_threads(2)
    cfg = json.load(open(f"{d}/config.json"))
    W = read_safetensors(f"{d}/model.safetensors")
    L, NH, C = cfg["n_layer"], cfg["n_head"], cfg["n_embd"]
    eps = cfg["layer_norm_epsilon"]
    assert cfg["activation_function"] == "gelu_new" and cfg["tie_word_embeddings"]
    raw = np.fromfile(tokens_path, dtype="<i4")
    B, T = int(raw[0]), int(raw[1])
    idx = torch.tensor(raw[2:].reshape(B, T).astype(np.int64))

    def p(name):
        return W["transformer." + name]

    def ln(x, name):
        return torch.nn.functional.layer_norm(x, (C,), p(name + ".weight"), p(name + ".bias"), eps)

    def conv1d(x, name):
        return x @ p(name + ".weight") + p(name + ".bias")

    def gelu_new(x):
        return 0.5 * x * (1.0 + torch.tanh(math.sqrt(2.0 / math.pi) * (x + 0.044715 * x.pow(3))))

    with torch.no_grad():
        h = p("wte.weight")[idx] + p("wpe.weight")[torch.arange(T)]
        mask = torch.tril(torch.ones(T, T, dtype=torch.bool))
        for l in range(L):
            pre = f"h.{l}."
            q, k, v = conv1d(ln(h, pre + "ln_1"), pre + "attn.c_attn").split(C, dim=2)
            q, k, v = (t.view(B, T, NH, C // NH).transpose(1, 2) for t in (q, k, v))
            att = (q @ k.transpose(-2, -1)) / math.sqrt(C // NH)
            att = att.masked_fill(~mask, float("-inf")).softmax(dim=-1)
            y = (att @ v).transpose(1, 2).reshape(B, T, C)
            h = h + conv1d(y, pre + "attn.c_proj")
            h = h + conv1d(gelu_new(conv1d(ln(h, pre + "ln_2"), pre + "mlp.c_fc")), pre + "mlp.c_proj")
        logits = ln(h, "ln_f") @ p("wte.weight").T
    logits.numpy().astype("<f4").tofile(logits_path)


if __name__ == "__main__":
    main()
