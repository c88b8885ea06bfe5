#!/usr/bin/python3
"""Logits of a Hugging Face Llama checkpoint with a PEFT LoRA adapter, as
PEFT's LoRA layer computes them (hf_peft_test's reference).

Usage: peft_lora_logits.py DIR

DIR/base: config.json and model.safetensors (a LlamaForCausalLM, as
`shardtrain export` writes it); DIR/adapter: adapter_config.json and
adapter_model.safetensors (as `shardtrain export --adapter` writes them);
DIR/tokens.bin: int32 ids, DIR/shape.txt: "batch B" and "seq_len T". Writes
DIR/logits.bin (float32, B*T*vocab). Each adapted projection is PEFT's
lora.Linear.forward: result = base_layer(x) + lora_B(lora_A(dropout(x))) *
scaling with scaling = lora_alpha / r (use_rslora false, dropout 0), the
adapter's tensors found by PEFT's names
base_model.model.<module>.lora_A.weight / lora_B.weight; the rest of the
model is hf_llama_logits.py's forward (modeling_llama.py's computation).
Needs only torch (Debian's python3-torch); PEFT itself is not imported.
"""
import json
import os
import struct
import sys

import torch
import torch.nn.functional as F

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import hf_llama_logits  # noqa: E402


def read_safetensors(path):
    with open(path, "rb") as f:
        n = struct.unpack("<Q", f.read(8))[0]
        header = json.loads(f.read(n))
        data = f.read()
    out = {}
    for name, t in header.items():
        if name == "__metadata__":
            continue
        a, b = t["data_offsets"]
        raw = bytearray(data[a:b])
        if t["dtype"] == "F32":
            x = torch.frombuffer(raw, dtype=torch.float32)
        elif t["dtype"] == "BF16":
            x = torch.frombuffer(raw, dtype=torch.bfloat16).float()
        else:
            raise SystemExit(f"{path}: {name}: dtype {t['dtype']}")
        out[name] = x.reshape(t["shape"]).clone()
    return out


def main():
    d = sys.argv[1]
    s = dict(line.split() for line in open(f"{d}/shape.txt"))
    B, T = int(s["batch"]), int(s["seq_len"])
    cfg = json.load(open(f"{d}/base/config.json"))
    W = read_safetensors(f"{d}/base/model.safetensors")
    acfg = json.load(open(f"{d}/adapter/adapter_config.json"))
    assert acfg["peft_type"] == "LORA" and not acfg.get("use_rslora"), acfg
    assert acfg.get("lora_dropout", 0) == 0 and acfg.get("bias", "none") == "none", acfg
    scaling = acfg["lora_alpha"] / acfg["r"]
    A = read_safetensors(f"{d}/adapter/adapter_model.safetensors")
    targets = set(acfg["target_modules"])
    used = set()

    def linear(x, module):
        result = F.linear(x, W[module + ".weight"])
        if module.rsplit(".", 1)[1] not in targets:
            return result
        key = "base_model.model." + module
        lora_a, lora_b = A[key + ".lora_A.weight"], A[key + ".lora_B.weight"]
        used.update((key + ".lora_A.weight", key + ".lora_B.weight"))
        return result + F.linear(F.linear(x, lora_a), lora_b) * scaling

    idx = torch.frombuffer(bytearray(open(f"{d}/tokens.bin", "rb").read()),
                           dtype=torch.int32).long().view(B, T)
    with torch.no_grad():
        logits = hf_llama_logits.forward(W, cfg, idx, linear)
    unused = sorted(set(A) - used)
    if unused:
        raise SystemExit(f"adapter tensors PEFT would not load: {unused[:3]}")
    open(f"{d}/logits.bin", "wb").write(logits.float().contiguous().numpy().tobytes())
    print(f"peft reference: {len(used)} adapter tensors, r {acfg['r']}, alpha "
          f"{acfg['lora_alpha']}, targets {sorted(targets)}")


if __name__ == "__main__":
    main()
