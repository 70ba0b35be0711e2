#!/usr/bin/env python3
"""Exact float64 forward pass of kvtier's synthetic GGUF of each architecture -> arch_exact_ref.txt.

Written from the architectures' definitions (the published model code's math, as
engine/model/arch.c lists it), not from kvtier's code: the one difference from
float64 throughout is that K and V are rounded to fp16 before attention, as
every KV cache here (kvtier's and llama.cpp's) stores them. The files come from
`test_arch_ref --write DIR` (F32 weights, so nothing else is rounded).

    L <family> <position> <logits of every vocabulary id, %.9g>

Usage:  python3 tests/ref/exact_arch_ref.py --bin build/test_arch_ref   (numpy, gguf)
"""
import argparse
import os
import subprocess
import tempfile

import numpy as np
from gguf import GGUFReader

HERE = os.path.dirname(os.path.abspath(__file__))
N_PROMPT = 40
POSITIONS = [0, 1, 7, 8, 9, 15, 16, 23, 31, 32, 39]

# what each family changes (see engine/model/arch.c for the sources)
TRAITS = {
    "llama":  dict(bias=False, qk_norm=False, post=False, scale=False, neox=False, gelu=False, swa=False),
    "qwen2":  dict(bias=True, qk_norm=False, post=False, scale=False, neox=True, gelu=False, swa=False),
    "qwen3":  dict(bias=False, qk_norm=True, post=False, scale=False, neox=True, gelu=False, swa=False),
    "gemma3": dict(bias=False, qk_norm=True, post=True, scale=True, neox=True, gelu=True, swa=True),
}


def field(r, key, default=None):
    f = r.fields.get(key)
    if f is None:
        return default
    v = f.contents()
    return v


def rms(x, w, eps):
    return x / np.sqrt(np.mean(x * x, axis=-1, keepdims=True) + eps) * w


def rope(x, pos, base, neox, factors):
    """x [heads, hd]; pair i rotates by pos * base^(-2i/hd) / factors[i]."""
    hd = x.shape[-1]
    half = hd // 2
    i = np.arange(half)
    th = pos * base ** (-2.0 * i / hd) / factors
    c, s = np.cos(th), np.sin(th)
    y = x.copy()
    if neox:
        a, b = x[:, :half], x[:, half:]
        y[:, :half], y[:, half:] = a * c - b * s, a * s + b * c
    else:
        a, b = x[:, 0::2], x[:, 1::2]
        y[:, 0::2], y[:, 1::2] = a * c - b * s, a * s + b * c
    return y


def forward(path):
    r = GGUFReader(path)
    arch = field(r, "general.architecture")
    t = TRAITS[arch]
    k = lambda s, d=None: field(r, f"{arch}.{s}", d)
    W = {x.name: np.array(x.data, dtype=np.float64) for x in r.tensors}
    n_layer, E = k("block_count"), k("embedding_length")
    H, HKV = k("attention.head_count"), k("attention.head_count_kv")
    hd = k("attention.key_length", E // H)
    eps, base = k("attention.layer_norm_rms_epsilon"), k("rope.freq_base")
    window = k("attention.sliding_window", 0) if t["swa"] else 0
    factors = W.get("rope_freqs.weight", np.ones(hd // 2))
    emb = W["token_embd.weight"]
    out_w = W.get("output.weight", emb)
    ids = [(i * 37 + 11) % 300 for i in range(N_PROMPT)]
    x = emb[ids] * (np.sqrt(E) if t["scale"] else 1.0)
    rows = {}
    for l in range(n_layer):
        p = f"blk.{l}."
        local = window and l % 6 < 5
        lbase = 10000.0 if local else base
        h = rms(x, W[p + "attn_norm.weight"], eps)
        q, kk, v = h @ W[p + "attn_q.weight"].T, h @ W[p + "attn_k.weight"].T, h @ W[p + "attn_v.weight"].T
        if t["bias"]:
            q, kk, v = q + W[p + "attn_q.bias"], kk + W[p + "attn_k.bias"], v + W[p + "attn_v.bias"]
        q, kk, v = q.reshape(-1, H, hd), kk.reshape(-1, HKV, hd), v.reshape(-1, HKV, hd)
        if t["qk_norm"]:
            q, kk = rms(q, W[p + "attn_q_norm.weight"], eps), rms(kk, W[p + "attn_k_norm.weight"], eps)
        fac = np.ones(hd // 2) if local else factors
        q = np.stack([rope(q[i], i, lbase, t["neox"], fac) for i in range(N_PROMPT)])
        kk = np.stack([rope(kk[i], i, lbase, t["neox"], fac) for i in range(N_PROMPT)])
        kk = kk.astype(np.float16).astype(np.float64)  # as the KV cache stores them
        v = v.astype(np.float16).astype(np.float64)
        att = np.zeros((N_PROMPT, H, hd))
        for i in range(N_PROMPT):
            lo = max(0, i - window + 1) if local else 0
            for hh in range(H):
                kh = hh // (H // HKV)
                s = kk[lo:i + 1, kh] @ q[i, hh] / np.sqrt(hd)
                w = np.exp(s - s.max())
                att[i, hh] = (w / w.sum()) @ v[lo:i + 1, kh]
        a = att.reshape(N_PROMPT, -1) @ W[p + "attn_output.weight"].T
        x = x + (rms(a, W[p + "post_attention_norm.weight"], eps) if t["post"] else a)
        h = rms(x, W[p + "ffn_norm.weight"], eps)
        g, u = h @ W[p + "ffn_gate.weight"].T, h @ W[p + "ffn_up.weight"].T
        if t["gelu"]:
            g = 0.5 * g * (1 + np.tanh(np.sqrt(2 / np.pi) * (g + 0.044715 * g ** 3)))
        else:
            g = g / (1 + np.exp(-g))
        f = (g * u) @ W[p + "ffn_down.weight"].T
        x = x + (rms(f, W[p + "post_ffw_norm.weight"], eps) if t["post"] else f)
    logits = rms(x, W["output_norm.weight"], eps) @ out_w.T
    for pos in POSITIONS:
        rows[pos] = logits[pos]
    return rows


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--bin", required=True, help="the built test_arch_ref")
    ap.add_argument("--out", default=os.path.join(HERE, "arch_exact_ref.txt"))
    args = ap.parse_args()
    lines = [
        "# float64 logits (K/V rounded to fp16) of the synthetic GGUFs of test_arch_ref --write; "
        "made by tests/ref/exact_arch_ref.py",
        "# L <family> <position> <logits of every vocabulary id, %.9g>",
    ]
    with tempfile.TemporaryDirectory(prefix="kvt-arch-exact-") as d:
        paths = subprocess.run([args.bin, "--write", d], check=True, capture_output=True,
                               text=True).stdout.split()
        for path in paths:
            fam = os.path.basename(path)[:-len(".gguf")]
            for pos, lg in forward(path).items():
                lines.append(f"L {fam} {pos} " + " ".join(f"{x:.9g}" for x in lg))
    with open(args.out, "w") as f:
        f.write("\n".join(lines) + "\n")
    print(f"wrote {args.out}: {len(paths)} families x {len(POSITIONS)} positions")


if __name__ == "__main__":
    main()
