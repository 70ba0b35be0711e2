#!/usr/bin/env python3
"""bench/bench_threads.py — CPU decode speed when the process may not use every core.

Runs build/bench_engine (decode tokens/s of --gen-tokens greedy steps, median
of --reps after a warm-up) on the default model in these settings, in rounds
(each round runs every setting once, alternating, so drift on a shared
machine hits them alike); the figure is the median over rounds:

  pinned: under `taskset -c <cpu0>` (one CPU allowed)
      auto    threads = 0 (the affinity mask says 1)
      t1      --threads 1 (the baseline)
      t2fixed --threads 2 --fixed-threads 1 (what threads = 0 started before:
              one thread per online CPU, and no adapting)
  busy: another process spins on the second CPU (taskset -c <cpu1>) the whole time
      t1      --threads 1
      t2fixed --threads 2 --fixed-threads 1 (today's pool: 2 threads, no adapting)
      auto    threads = 0 (2 threads here, adapting to the busy core)

Targets (issue 21): pinned auto >= 0.9x t1; busy auto >= 0.9x the better of t1
and t2fixed.

Usage: bench/bench_threads.py [--build build] [--rounds 3] [--reps 3] [--gen-tokens 64]
"""
import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
MODEL = os.path.join(ROOT, "models", "SmolLM2-135M-Instruct.Q4_1.gguf")


def run(cmd):
    out = subprocess.run(cmd, check=True, capture_output=True, text=True).stdout
    return json.loads(out.strip().splitlines()[-1])


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--build", default=os.path.join(ROOT, "build"))
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--gen-tokens", type=int, default=64)
    a = ap.parse_args()
    cpus = sorted(os.sched_getaffinity(0))
    if len(cpus) < 2:
        sys.exit("bench_threads: needs 2 CPUs in the affinity mask")
    ids = os.path.join(tempfile.mkdtemp(prefix="kvt-bench-threads-"), "ids")
    with open(ids, "w") as f:
        f.write(" ".join(str(100 + 37 * i % 5000) for i in range(64)))
    base = [os.path.join(a.build, "bench_engine"), "--model", MODEL, "--prompt-ids-file", ids, "--reps", str(a.reps),
            "--gen-tokens", str(a.gen_tokens)]
    pin = ["taskset", "-c", str(cpus[0])]
    settings = {
        "pinned": {"auto": pin + base + ["--threads", "0"], "t1": pin + base + ["--threads", "1"],
                   "t2fixed": pin + base + ["--threads", "2", "--fixed-threads", "1"]},
        "busy": {"t1": base + ["--threads", "1"], "t2fixed": base + ["--threads", "2", "--fixed-threads", "1"],
                 "auto": base + ["--threads", "0"]},
    }
    res = {k: {s: [] for s in v} for k, v in settings.items()}
    for r in range(a.rounds):
        for name, cmds in settings.items():
            hog = None
            if name == "busy":
                hog = subprocess.Popen(["taskset", "-c", str(cpus[1]), sys.executable, "-c", "while True: pass"])
            try:
                for s, cmd in cmds.items():
                    j = run(cmd)
                    res[name][s].append(j["decode_tok_s"])
                    print("round %d %-6s %-7s %7.1f tok/s (%s)" % (r, name, s, j["decode_tok_s"], j["device"]),
                          flush=True)
            finally:
                if hog:
                    hog.kill()
                    hog.wait()
    med = {k: {s: statistics.median(v) for s, v in d.items()} for k, d in res.items()}
    p, b = med["pinned"], med["busy"]
    print("\npinned (taskset -c %d): auto %.1f, t1 %.1f, t2fixed %.1f tok/s -> auto / t1 = %.2fx (target >= 0.9x); "
          "t2fixed / t1 = %.2fx" % (cpus[0], p["auto"], p["t1"], p["t2fixed"], p["auto"] / p["t1"],
                                     p["t2fixed"] / p["t1"]))
    best = max(b["t1"], b["t2fixed"])
    print("busy (CPU %d spinning): t1 %.1f, t2fixed %.1f, auto %.1f tok/s -> auto / best of t1,t2fixed = %.2fx "
          "(target >= 0.9x); t2fixed / t1 = %.2fx" % (cpus[1], b["t1"], b["t2fixed"], b["auto"], b["auto"] / best,
                                                     b["t2fixed"] / b["t1"]))
    print(json.dumps({"median_decode_tok_s": med, "rounds": res}))


if __name__ == "__main__":
    main()
