#!/usr/bin/env python3
"""bench/bench_retention.py — a retained prompt's TTFT after a flood of other prompts.

One kvtierd with every tier small (T0, T1 and T2 together hold far less than a
flood), and two prompts of the same length: R, sent with cache_control
{"type": "ephemeral", "ttl": "1h"} (retained), and U, sent without (the
baseline: cached like any prompt, then evicted by the flood). Each round:

  1. R and U are sent once (so both are cached, R retained);
  2. a flood of F distinct prompts of the same length passes through every
     tier, evicting whatever is not retained (the daemon's /v1/stats shows
     T2 evictions);
  3. R and U again, in alternating order: TTFT (server-measured, submit ->
     first token, usage.kvtier.ttft_ms) and cached tokens of each.

Reported: median TTFT of R and of U over the rounds and their ratio, with the
cached tokens each got (R all its full blocks, U none). Same daemon, same run.

Usage: bench/bench_retention.py [--build DIR] [--rounds 5] [--flood 24] [--tokens 480]
Writes JSON to --out (default bench/results/retention-<date>.json).
"""
import argparse
import datetime
import json
import os
import platform
import shutil
import statistics
import sys
import tempfile

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(ROOT, "tests", "daemon"))
from kvtierd_proc import Daemon, http  # noqa: E402
MODEL = os.path.join(ROOT, "models", "SmolLM2-135M-Instruct.Q4_1.gguf")

WORDS = ("harbour archive river glacier meadow lantern compass ledger orchard canyon beacon quarry "
         "tundra estuary summit valley delta reef dune marsh fjord prairie basin ridge").split()


def text(seed, n_words):
    """A deterministic prompt of n_words words, distinct per seed."""
    out, x = [], seed * 2654435761 % (1 << 32) or 1
    for _ in range(n_words):
        x = (x * 1103515245 + 12345) % (1 << 31)
        out.append(WORDS[x % len(WORDS)])
    return "Document %d: " % seed + " ".join(out) + "."


def complete(d, prompt, retain):
    body = {"prompt": prompt, "max_tokens": 1, "temperature": 0}
    if retain:
        body["cache_control"] = {"type": "ephemeral", "ttl": "1h"}
    st, r = http("POST", d.url + "/v1/completions", body)
    if st != 200:
        raise RuntimeError("completions: %s %s" % (st, r))
    return r["usage"]


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--build", default=os.path.join(ROOT, "build"))
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--flood", type=int, default=24, help="other prompts per round")
    ap.add_argument("--words", type=int, default=400, help="words per prompt (about 1.2 tokens each)")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--out", default=None)
    a = ap.parse_args()
    tmp = tempfile.mkdtemp(prefix="kvt_bench_retention_")
    # T0 holds ~2 prompts' blocks beyond one sequence, T1 ~1, T2 ~4: a flood of 24 goes through all three
    conf = ("[server]\nlisten = 127.0.0.1:0\n[model]\npath = %s\ndevice = cpu\ncontext = 1024\nthreads = %d\n"
            "[tier.hbm]\ncapacity = 40M\n[tier.host]\ncapacity = 8M\n[tier.nvme]\ncapacity = 16M\n"
            "[index]\ndata_dir = @DATA@\n" % (MODEL, a.threads))
    d = Daemon(a.build, os.path.join(tmp, "d"), conf)
    d.start()
    res = {"R": [], "U": [], "R_cached": [], "U_cached": [], "t2_evictions": []}
    try:
        R, U = text(1, a.words), text(2, a.words)
        ur, uu = complete(d, R, True), complete(d, U, False)
        n_tok = ur["prompt_tokens"]
        print("prompt tokens: R %d, U %d; R retained %d tokens" % (n_tok, uu["prompt_tokens"],
                                                                  ur["kvtier"]["cache_creation_input_tokens"]))
        seed = 100
        for rnd in range(a.rounds):
            ev0 = http("GET", d.url + "/v1/stats")[1]["tiers"][2]["evictions"]
            for _ in range(a.flood):
                complete(d, text(seed, a.words), False)
                seed += 1
            ev1 = http("GET", d.url + "/v1/stats")[1]["tiers"][2]["evictions"]
            order = [("R", R, True), ("U", U, False)]
            if rnd % 2:
                order.reverse()
            for name, p, retain in order:
                u = complete(d, p, retain)
                res[name].append(u["kvtier"]["ttft_ms"])
                res[name + "_cached"].append(u["prompt_tokens_details"]["cached_tokens"])
            res["t2_evictions"].append(ev1 - ev0)
            print("round %d: T2 evictions during the flood %d; TTFT R %.1f ms (cached %d), U %.1f ms (cached %d)"
                  % (rnd, ev1 - ev0, res["R"][-1], res["R_cached"][-1], res["U"][-1], res["U_cached"][-1]),
                  flush=True)
    finally:
        d.stop()
        shutil.rmtree(tmp, ignore_errors=True)
    mr, mu = statistics.median(res["R"]), statistics.median(res["U"])
    summary = {"date": datetime.date.today().isoformat(), "machine": platform.processor() or platform.machine(),
               "cpus": os.cpu_count(), "threads": a.threads, "prompt_tokens": n_tok, "flood": a.flood,
               "rounds": a.rounds, "ttft_retained_ms": mr, "ttft_unretained_ms": mu,
               "ratio_retained_over_unretained": mr / mu if mu else None, "per_round": res}
    print("median TTFT: retained %.1f ms, unretained %.1f ms: retained / unretained = %.3f (%.1fx faster)"
          % (mr, mu, mr / mu, mu / mr))
    out = a.out or os.path.join(ROOT, "bench", "results", "retention-%s.json" % summary["date"])
    os.makedirs(os.path.dirname(out), exist_ok=True)
    with open(out, "w") as f:
        json.dump(summary, f, indent=1)
    print("wrote", out)


if __name__ == "__main__":
    main()
