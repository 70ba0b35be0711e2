#!/usr/bin/env python3
"""bench/bench_daemon.py — the multi-turn workload against kvtierd, caching on vs off.

N conversations x T turns share one long system prompt (a real English text,
/usr/share/common-licenses/GPL-3). The tiers are sized so T0 cannot hold the
working set: between two turns of a conversation every other conversation
runs a turn, so its blocks are demoted to T1 and T2 and promoted back.

The same workload runs twice in one go, on two daemons of the same build:
caching on (the default config), then caching off (cache.enabled = false:
every prompt is prefilled in full). Reported:

  - TTFT per turn (mean over conversations, server-measured submit -> first
    token), on and off, and their ratio;
  - cache efficiency: cached tokens / reusable tokens, where a request's
    reusable tokens are the full blocks of the longest prefix the daemon has
    already computed for it (the previous turn's prompt + reply; for a first
    turn the system prompt, computed once by a warm-up request);
  - resume after restart: the caching-on daemon is stopped (SIGTERM) and
    restarted; for K conversations of >= 1k tokens, `POST /resume`, then the
    next turn's TTFT, against the TTFT of the same prompt on the caching-off
    daemon (a full re-prefill); also the next turn with no explicit resume
    (blocks promoted from NVMe on demand) and resume + TTFT together.

Usage: bench/bench_daemon.py [--build DIR] [--conversations 32] [--turns 8] ...
Prints a table and writes JSON to --out (default bench/results/daemon-<date>.json).
"""
import argparse
import datetime
import json
import os
import shutil
import statistics
import sys
import tempfile
import threading
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(ROOT, "tests", "daemon"))
from kvtierd_proc import Daemon, http  # noqa: E402
MODEL = os.path.join(ROOT, "models", "SmolLM2-135M-Instruct.Q4_1.gguf")
BT = 16


def post(url, body):
    st, r = http("POST", url, body)
    if st != 200:
        raise RuntimeError("%s: %s %s" % (url, st, r))
    return r


def chatml(system, turns):
    """turns: [(user, reply or None)]; the prompt up to the assistant's next reply."""
    s = "<|im_start|>system\n%s<|im_end|>\n" % system
    for user, reply in turns:
        s += "<|im_start|>user\n%s<|im_end|>\n<|im_start|>assistant\n" % user
        if reply is not None:
            s += reply + "<|im_end|>\n"
    return s


def texts(n_users, sys_chars, user_chars):
    words = open("/usr/share/common-licenses/GPL-3").read().split()
    text = " ".join(words)
    system = "You are a careful assistant. Answer from this license text when asked.\n" + text[:sys_chars]
    users, pos = [], sys_chars
    for i in range(n_users):
        chunk = text[pos:pos + user_chars]
        pos += user_chars
        users.append("Question %d. What does this passage mean: \"%s\"" % (i + 1, chunk))
    return system, users


def run_workload(d, a, system, users, label):
    """Turn by turn over all conversations (clients at a time). Returns per-request records."""
    convs = [[] for _ in range(a.conversations)]  # (user, reply, usage, finish)
    recs = []
    lock = threading.Lock()
    # the system prompt once (its blocks are what every first turn may reuse)
    w = post(d.url + "/v1/completions", {"prompt": chatml(system, []), "max_tokens": 1, "temperature": 0})
    sys_tokens = w["usage"]["prompt_tokens"]

    def one(c, t):
        user = users[c * a.turns + t]
        prompt = chatml(system, [(u, r) for (u, r, _, _) in convs[c]] + [(user, None)])
        t0 = time.time()
        r = post(d.url + "/v1/completions", {"prompt": prompt, "max_tokens": a.max_tokens, "temperature": 0,
                                             "session_id": "c%d" % c})
        wall = time.time() - t0
        u = r["usage"]
        fin = r["choices"][0]["finish_reason"]
        if t == 0:
            reusable_prefix = sys_tokens
        else:
            pu, pf = convs[c][-1][2], convs[c][-1][3]
            reusable_prefix = pu["prompt_tokens"] + pu["completion_tokens"] + (1 if pf == "stop" else 0)
        reusable = min(reusable_prefix, u["prompt_tokens"] - 1) // BT * BT
        # tokens served from cache were computed before, so they are reusable too (a first turn shares
        # a block past the system prompt with other conversations' first turns)
        reusable = max(reusable, u["prompt_tokens_details"]["cached_tokens"])
        with lock:
            convs[c].append((user, r["choices"][0]["text"], u, fin))
            recs.append({"run": label, "conv": c, "turn": t, "prompt_tokens": u["prompt_tokens"],
                         "cached_tokens": u["prompt_tokens_details"]["cached_tokens"],
                         "by_tier": u["kvtier"]["cached_tokens_by_tier"], "reusable_tokens": reusable,
                         "ttft_ms": u["kvtier"]["ttft_ms"], "wall_s": wall})

    for t in range(a.turns):
        todo = list(range(a.conversations))
        threads = []

        def worker():
            while True:
                with lock:
                    if not todo:
                        return
                    c = todo.pop(0)
                one(c, t)
        for _ in range(a.clients):
            th = threading.Thread(target=worker)
            th.start()
            threads.append(th)
        for th in threads:
            th.join()
        print("  %s: turn %d done" % (label, t + 1), flush=True)
    return convs, recs


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--build", default=os.path.join(ROOT, "build"))
    ap.add_argument("--conversations", type=int, default=32)
    ap.add_argument("--turns", type=int, default=8)
    ap.add_argument("--max-tokens", type=int, default=24)
    ap.add_argument("--clients", type=int, default=4)
    ap.add_argument("--system-chars", type=int, default=2400, help="about 500 tokens")
    ap.add_argument("--user-chars", type=int, default=320)
    ap.add_argument("--hbm", default="48M")
    ap.add_argument("--host", default="96M")
    ap.add_argument("--nvme", default="2G")
    ap.add_argument("--resume-convs", type=int, default=4)
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--out", default=None)
    a = ap.parse_args()
    system, users = texts(a.conversations * (a.turns + 1), a.system_chars, a.user_chars)
    tmp = tempfile.mkdtemp(prefix="kvt_bench_daemon_")
    conf = ("[server]\nlisten = 127.0.0.1:0\nmax_tokens_limit = 4096\n[model]\npath = %s\ndevice = %s\ncontext = 4096\n"
            "[cache]\nenabled = %%s\n[tier.hbm]\ncapacity = %s\n[tier.host]\ncapacity = %s\n[tier.nvme]\ncapacity = %s\n"
            "[index]\ndata_dir = @DATA@\n" % (MODEL, a.device, a.hbm, a.host, a.nvme))
    on = Daemon(a.build, os.path.join(tmp, "on"), conf % "true")
    off = Daemon(a.build, os.path.join(tmp, "off"), conf % "false")
    t_start = time.time()
    on.start()
    convs_on, recs = run_workload(on, a, system, users, "on")
    st_on = http("GET", on.url + "/v1/stats")[1]
    on.stop()
    off.start()
    _, recs_off = run_workload(off, a, system, users, "off")
    recs += recs_off

    # resume after restart, against a re-prefill of the same prompt
    on.start()
    resume = []
    cands = [c for c in range(a.conversations)]
    for i, c in enumerate(cands[:2 * a.resume_convs]):
        hist = [(u, r) for (u, r, _, _) in convs_on[c]]
        user = "Thank you. Please go on."  # a short next turn: what is left to prefill is the new message
        prompt = chatml(system, hist + [(user, None)])
        explicit = i < a.resume_convs
        t0 = time.time()
        rep = post(on.url + "/v1/sessions/c%d/resume" % c, {}) if explicit else None
        t_resume = time.time() - t0
        r = post(on.url + "/v1/completions", {"prompt": prompt, "max_tokens": 1, "temperature": 0})
        rr = post(off.url + "/v1/completions", {"prompt": prompt, "max_tokens": 1, "temperature": 0})
        resume.append({"conv": c, "explicit_resume": explicit, "prompt_tokens": r["usage"]["prompt_tokens"],
                       "cached_tokens": r["usage"]["prompt_tokens_details"]["cached_tokens"],
                       "by_tier": r["usage"]["kvtier"]["cached_tokens_by_tier"],
                       "resume_s": t_resume if explicit else 0.0, "resume_report": rep,
                       "ttft_ms": r["usage"]["kvtier"]["ttft_ms"], "reprefill_ttft_ms": rr["usage"]["kvtier"]["ttft_ms"]})
    on.stop()
    off.stop()

    # report
    print("\nTTFT per turn (ms, mean over %d conversations; server-measured)" % a.conversations)
    print("turn  prompt  cached/reusable   on TTFT   off TTFT   on/off")
    per_turn = []
    for t in range(a.turns):
        ron = [r for r in recs if r["run"] == "on" and r["turn"] == t]
        roff = [r for r in recs if r["run"] == "off" and r["turn"] == t]
        m_on, m_off = statistics.mean(r["ttft_ms"] for r in ron), statistics.mean(r["ttft_ms"] for r in roff)
        cached, reusable = sum(r["cached_tokens"] for r in ron), sum(r["reusable_tokens"] for r in ron)
        per_turn.append({"turn": t + 1, "prompt_tokens_mean": statistics.mean(r["prompt_tokens"] for r in ron),
                         "cached": cached, "reusable": reusable, "ttft_on_ms": m_on, "ttft_off_ms": m_off})
        print("%4d  %6.0f  %6d/%-8d  %8.1f  %9.1f  %7.3f" % (t + 1, per_turn[-1]["prompt_tokens_mean"], cached,
                                                           reusable, m_on, m_off, m_on / m_off))
    ron = [r for r in recs if r["run"] == "on"]
    cached, reusable = sum(r["cached_tokens"] for r in ron), sum(r["reusable_tokens"] for r in ron)
    by = {k: sum(r["by_tier"][k] for r in ron) for k in ("hbm", "host", "nvme")}
    eff = cached / reusable if reusable else 0.0
    print("\ncache efficiency: %d of %d reusable tokens served from cache = %.4f (target >= 0.99); by tier %s"
          % (cached, reusable, eff, by))
    print("tiers after the caching-on run: " + ", ".join(
        "%s %d blocks, %d promotions, %d demotions" % (t["name"], t["blocks"], t["promotions"], t["demotions"])
        for t in st_on["tiers"]))
    print("\nresume after restart (next turn, max_tokens 1)")
    print("conv  tokens  cached  by tier                         resume s  TTFT ms  re-prefill ms  TTFT/re-prefill  (resume+TTFT)/re-prefill")
    for x in resume:
        ratio = x["ttft_ms"] / x["reprefill_ttft_ms"]
        tot = (x["resume_s"] * 1000 + x["ttft_ms"]) / x["reprefill_ttft_ms"]
        x["ratio"], x["ratio_with_resume"] = ratio, tot
        print("%4d  %6d  %6d  %-30s  %8.3f  %7.1f  %13.1f  %15.4f  %10.4f%s" % (
            x["conv"], x["prompt_tokens"], x["cached_tokens"], json.dumps(x["by_tier"]), x["resume_s"], x["ttft_ms"],
            x["reprefill_ttft_ms"], ratio, tot, "" if x["explicit_resume"] else "  (no explicit resume)"))
    exp = [x for x in resume if x["explicit_resume"]]
    if exp:
        print("median TTFT after resume / re-prefill TTFT: %.4f (target <= 0.05, conversations >= 1k tokens: %s)"
              % (statistics.median(x["ratio"] for x in exp), all(x["prompt_tokens"] >= 1000 for x in exp)))
    out = a.out or os.path.join(ROOT, "bench", "results", "daemon-%s.json" % datetime.date.today().isoformat())
    os.makedirs(os.path.dirname(out), exist_ok=True)
    with open(out, "w") as f:
        json.dump({"args": vars(a), "per_turn": per_turn, "cache_efficiency": eff, "cached_by_tier": by,
                   "resume": resume, "stats_on": st_on, "requests": recs,
                   "seconds": time.time() - t_start}, f, indent=1)
    print("wrote", out, "in %.0f s" % (time.time() - t_start))
    shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    main()
