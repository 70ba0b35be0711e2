#!/usr/bin/env python3
"""PyTorch's scaled_dot_product_attention on the decode shapes bench_gpu measured.

Reads bench_gpu's JSON lines (a file or stdin), times torch SDPA (fp16, one
query token, GQA through enable_gqa where this torch has it, else K/V expanded
to every query head, which reads more bytes) with CUDA events over the same
kind of loop, and prints one JSON line per shape with kvtier's fp16 time over
torch's (below 1: kvtier faster). Needs torch with CUDA; says so and exits 0
otherwise, so the device check goes on.
"""
import json
import sys


def main():
    src = open(sys.argv[1]) if len(sys.argv) > 1 else sys.stdin
    rows = [json.loads(l) for l in src if l.startswith("{")]
    try:
        import torch
        import torch.nn.functional as F
    except ImportError:
        print(json.dumps({"bench": "sdpa", "skipped": "no torch"}))
        return
    if not torch.cuda.is_available():
        print(json.dumps({"bench": "sdpa", "skipped": "torch sees no GPU"}))
        return
    dev = torch.device("cuda")
    for r in rows:
        if r.get("bench") != "decode_attention":
            continue
        H, G, D, T = r["kv_heads"], r["group"], r["head_dim"], r["context"]
        q = torch.randn(1, H * G, 1, D, device=dev, dtype=torch.float16)
        k = torch.randn(1, H, T, D, device=dev, dtype=torch.float16)
        v = torch.randn(1, H, T, D, device=dev, dtype=torch.float16)
        try:
            fn = lambda: F.scaled_dot_product_attention(q, k, v, enable_gqa=True)
            fn()
            how = "enable_gqa"
        except TypeError:
            ke, ve = k.repeat_interleave(G, 1), v.repeat_interleave(G, 1)
            fn = lambda: F.scaled_dot_product_attention(q, ke, ve)
            how = "expanded"
        for _ in range(10):
            fn()
        iters = 200
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        torch.cuda.synchronize()
        a.record()
        for _ in range(iters):
            fn()
        b.record()
        torch.cuda.synchronize()
        us = a.elapsed_time(b) * 1000.0 / iters
        print(json.dumps({"bench": "sdpa", "kernel": r.get("kernel", 1), "context": T, "kv_heads": H,
                          "group": G, "head_dim": D,
                          "gqa": how, "torch": torch.__version__, "torch_us": round(us, 2),
                          "kvtier_f16_us": r["f16_us"], "kvtier_over_torch": round(r["f16_us"] / us, 3),
                          "kvtier_fp8_over_torch": round(r["fp8_us"] / us, 3)}))


if __name__ == "__main__":
    main()
