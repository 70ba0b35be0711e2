#!/usr/bin/env python3
"""Prefill and decode speed of kvtier next to llama.cpp, in one run, as ratios.

Both engines get the same GGUF, the same 512 prompt ids (written once by
llamacpp_peer.py --dump-ids), the same decode prompt ("The capital of France is",
llama.cpp's ids for it), the same thread count, and run alternately ROUNDS times so
that machine noise hits both alike. Each engine reports the median of its reps per
round; the ratio printed is the median over rounds of kvtier / llama.cpp.

Usage: python3 bench/compare_llamacpp.py [--build build] [--threads 2] [--rounds 3]
       [--model models/SmolLM2-135M-Instruct.Q4_1.gguf] [--weights native|f16|f32] [--peer-no-repack]
       [--activations int16|int8]
Needs: pip install llama-cpp-python; bench_engine built (cmake --build build).
"""
import argparse
import json
import os
import platform
import shutil
import statistics
import subprocess
import sys
import tempfile

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
DECODE_IDS = "504 3575 282 4649 314"  # "The capital of France is" (tests/ref/greedy_ref.txt)


def run_json(cmd):
    out = subprocess.run(cmd, check=True, capture_output=True, text=True)
    return json.loads(out.stdout.strip().splitlines()[-1])


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--build", default=os.path.join(ROOT, "build"))
    ap.add_argument("--model", default=os.path.join(ROOT, "models/SmolLM2-135M-Instruct.Q4_1.gguf"))
    ap.add_argument("--threads", type=int, default=os.cpu_count())
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--prompt-tokens", type=int, default=512)
    ap.add_argument("--gen-tokens", type=int, default=64)
    ap.add_argument("--weights", default="native", choices=["native", "f16", "f32"])
    ap.add_argument("--peer-no-repack", action="store_true",
                    help="llama.cpp keeps its weights as stored, as llama-server -nr (no AMX/VNNI repack)")
    ap.add_argument("--activations", default="int16", choices=["int16", "int8"],
                    help="kvtier's [model] activations (int8: rounded as llama.cpp rounds them)")
    a = ap.parse_args()

    tmp = tempfile.mkdtemp(prefix="kvt_bench_")
    ids_file, dec_file = os.path.join(tmp, "prompt.ids"), os.path.join(tmp, "decode.ids")
    with open(dec_file, "w") as f:
        f.write(DECODE_IDS + "\n")
    peer = [sys.executable, os.path.join(ROOT, "bench/llamacpp_peer.py"), "--model", a.model,
            "--threads", str(a.threads), "--prompt-tokens", str(a.prompt_tokens),
            "--gen-tokens", str(a.gen_tokens), "--reps", str(a.reps)] + (["--no-repack"] if a.peer_no_repack else [])
    ours = [os.path.join(a.build, "bench_engine"), "--model", a.model, "--prompt-ids-file", ids_file,
            "--decode-ids-file", dec_file, "--threads", str(a.threads), "--gen-tokens", str(a.gen_tokens),
            "--reps", str(a.reps), "--weights", a.weights, "--activations", a.activations]

    cpu = next((l.split(":", 1)[1].strip() for l in open("/proc/cpuinfo") if l.startswith("model name")), "?")
    print(f"machine: {platform.node()} {cpu}, {os.cpu_count()} cores; threads {a.threads}; "
          f"model {os.path.basename(a.model)}; kvtier activations {a.activations}")
    run_json(peer + ["--dump-ids", ids_file])  # also a warm-up of llama.cpp
    pre, dec = [], []
    for r in range(a.rounds):
        k = run_json(ours)
        l = run_json(peer + ["--prompt-ids-file", ids_file])
        pre.append(k["prefill_tok_s"] / l["prefill_tok_s"])
        dec.append(k["decode_tok_s"] / l["decode_tok_s"])
        print(f"round {r}: prefill kvtier {k['prefill_tok_s']:.1f} vs llama.cpp {l['prefill_tok_s']:.1f} tok/s "
              f"({pre[-1]:.2f}x); decode kvtier {k['decode_tok_s']:.1f} vs llama.cpp {l['decode_tok_s']:.1f} "
              f"tok/s ({dec[-1]:.2f}x)")
    print(json.dumps({"prefill_ratio": round(statistics.median(pre), 3),
                      "decode_ratio": round(statistics.median(dec), 3),
                      "threads": a.threads, "n_prompt": a.prompt_tokens, "n_gen": a.gen_tokens,
                      "weights": a.weights, "peer_repack": not a.peer_no_repack, "kvtier_device": k.get("device"),
                      "llama_cpp_python": l.get("llama_cpp_python"), "activations": a.activations}))
    shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    main()
