#!/usr/bin/env python3
"""Exact (float64) logits of the default model, as a second reference next to llama.cpp.

llama.cpp multiplies Q4_1 weights with activations rounded to 8 bits, so its logits
carry noise of up to ~1.3 (see README.md here). This script runs the Llama forward pass
in float64 numpy on the GGUF's dequantized weights — no rounding anywhere but the
weights' own — over each prompt of greedy_ref.txt followed by llama.cpp's 16 greedy
tokens (teacher forcing, one causal pass), and records for every step the logits of
the union of its own top-10 and llama.cpp's top-10 ids.

Output tests/ref/exact_ref.txt, one line per (prompt, step):
    E <prompt index> <step> <id>:<logit> ...   (descending by logit, %.6f)
Needs: pip install gguf numpy. Run: python3 tests/ref/exact_ref.py [--model PATH]
"""
import argparse
import os

import numpy as np
from gguf import GGUFReader, quants

HERE = os.path.dirname(os.path.abspath(__file__))


def load(path):
    r = GGUFReader(path)
    arch = str(bytes(r.fields["general.architecture"].parts[-1]), "utf-8")
    hp = {k: r.fields[f"{arch}.{k}"].parts[-1][0] for k in
          ("block_count", "embedding_length", "attention.head_count", "attention.head_count_kv",
           "rope.freq_base", "attention.layer_norm_rms_epsilon")}
    w = {}
    for t in r.tensors:
        a = quants.dequantize(t.data, t.tensor_type).astype(np.float64)
        w[t.name] = a.reshape([int(x) for x in reversed(t.shape)])
    return hp, w


def forward(hp, w, ids):
    n_layer, n_embd = int(hp["block_count"]), int(hp["embedding_length"])
    n_head, n_kv = int(hp["attention.head_count"]), int(hp["attention.head_count_kv"])
    hd, eps, base = n_embd // n_head, float(hp["attention.layer_norm_rms_epsilon"]), float(hp["rope.freq_base"])
    T = len(ids)
    pos = np.arange(T, dtype=np.float64)
    theta = pos[:, None] * base ** (-np.arange(0, hd, 2) / hd)[None, :]
    cos, sin = np.cos(theta)[:, None, :], np.sin(theta)[:, None, :]

    def norm(x, g):
        return x / np.sqrt((x * x).mean(-1, keepdims=True) + eps) * g

    def rope(x):  # GGUF "normal" mode: adjacent pairs rotate
        out = np.empty_like(x)
        out[..., 0::2] = x[..., 0::2] * cos - x[..., 1::2] * sin
        out[..., 1::2] = x[..., 0::2] * sin + x[..., 1::2] * cos
        return out

    out_w = w.get("output.weight", w["token_embd.weight"])
    causal = np.triu(np.full((T, T), -np.inf), 1)
    x = w["token_embd.weight"][ids]
    for l in range(n_layer):
        p = f"blk.{l}."
        h = norm(x, w[p + "attn_norm.weight"])
        q = rope((h @ w[p + "attn_q.weight"].T).reshape(T, n_head, hd))
        k = rope((h @ w[p + "attn_k.weight"].T).reshape(T, n_kv, hd))
        v = (h @ w[p + "attn_v.weight"].T).reshape(T, n_kv, hd)
        att = np.empty((T, n_head, hd))
        for i in range(n_head):
            j = i // (n_head // n_kv)
            s = q[:, i] @ k[:, j].T / np.sqrt(hd) + causal
            s = np.exp(s - s.max(-1, keepdims=True))
            att[:, i] = (s / s.sum(-1, keepdims=True)) @ v[:, j]
        x = x + att.reshape(T, n_embd) @ w[p + "attn_output.weight"].T
        h = norm(x, w[p + "ffn_norm.weight"])
        g, u = h @ w[p + "ffn_gate.weight"].T, h @ w[p + "ffn_up.weight"].T
        x = x + (g / (1 + np.exp(-g)) * u) @ w[p + "ffn_down.weight"].T
    return norm(x, w["output_norm.weight"]) @ out_w.T


def read_cases(path):
    cases = []
    for line in open(path):
        f = line.split()
        if not f or f[0].startswith("#"):
            continue
        if f[0] == "P":
            cases.append({"ids": [], "gen": [], "top": {}})
        elif f[0] == "I":
            cases[-1]["ids"] = [int(t) for t in f[1:]]
        elif f[0] == "G":
            cases[-1]["gen"] = [int(t) for t in f[1:]]
        elif f[0] == "L":
            cases[-1]["top"][int(f[1])] = [int(p.split(":")[0]) for p in f[2:]]
    return cases


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", default=os.path.join(HERE, "../../models/SmolLM2-135M-Instruct.Q4_1.gguf"))
    a = ap.parse_args()
    hp, w = load(a.model)
    cases = read_cases(os.path.join(HERE, "greedy_ref.txt"))
    lines = ["# exact float64 logits (tests/ref/exact_ref.py) of the prompts in greedy_ref.txt,",
             "# teacher-forced with llama.cpp's greedy tokens: E <prompt> <step> <id>:<logit> ..."]
    for c, case in enumerate(cases):
        ids = case["ids"] + case["gen"][:-1]
        logits = forward(hp, w, np.array(ids))
        n = len(case["ids"])
        for step in range(len(case["gen"])):
            row = logits[n - 1 + step]
            keep = set(np.argsort(-row)[:10].tolist()) | set(case["top"][step])
            pairs = sorted(keep, key=lambda i: -row[i])
            lines.append(f"E {c} {step} " + " ".join(f"{i}:{row[i]:.6f}" for i in pairs))
        print(f"prompt {c}: exact argmax at step 0 = {int(np.argmax(logits[n - 1]))}")
    with open(os.path.join(HERE, "exact_ref.txt"), "w") as f:
        f.write("\n".join(lines) + "\n")


if __name__ == "__main__":
    main()
