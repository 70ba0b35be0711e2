#!/usr/bin/env python3
"""bench/bench_sched.py — scheduling under load: long prompts next to short questions.

Two daemons of the same build, run one after the other in the same go, differ
only in [scheduler] policy: fifo (the old order: the oldest prefill takes the
whole budget) and fair (the default). On each:

  1. idle: 5 short requests one at a time; their median TTFT is the idle
     baseline the burst's short TTFTs are divided by;
  2. burst: 4 long prompts (>= 3K tokens, distinct slices of a real English
     text, /usr/share/common-licenses/GPL-3) sent together, then 0.3 s later
     32 short questions sent together; every request max_tokens 16, greedy,
     ignore_eos (same work under both policies);
  3. steady: for --steady-s seconds a long prompt every --long-every-s and a
     short one every --short-every-s (open loop: arrivals do not wait for
     answers).

Reported, per policy and scenario: short and long TTFT p50/p99 (server-measured
submit -> first token, usage.kvtier.ttft_ms), the long requests' completion
time (client-measured, send -> response), total time, throughput (prompt +
completion tokens / total time), and the ratios the issue targets: short p99 /
idle short TTFT, fair long completion / fifo's, fair throughput / fifo's.

The daemons run the CPU backend with max_running = 64 (and no connection or
concurrency limit in the way) so all 36 requests are admitted: with the default
16 running, 20 of the 32 short ones would wait for a slot whatever the policy.
With --config shipped they run the shipped configuration instead (every key at
its default, configs/kvtier.conf: T0 auto, max_running 16, the server's
limits) but for the listen port, the model, the CPU backend, the data dir and a
64M NVMe tier; --n-long 3 --n-short 12 is then the burst of issue 49 item 5
(all 15 fit max_running). Each run also reports the daemon's memory after the
burst (/proc/PID/status: VmRSS and its peak VmHWM; /v1/stats: the weights, the KV
held in T0 and T1 and the rest, against issue 31's RSS <= weights + KV held +
300 MB).

Usage: bench/bench_sched.py [--build build] [--out FILE]
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
import threading
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(ROOT, "tests", "daemon"))
from kvtierd_proc import Daemon, http  # noqa: E402
MODEL = os.path.join(ROOT, "models", "SmolLM2-135M-Instruct.Q4_1.gguf")
TEXT = "/usr/share/common-licenses/GPL-3"


def pct(xs, q):
    xs = sorted(xs)
    if not xs:
        return 0.0
    k = max(0, min(len(xs) - 1, int(round(q / 100.0 * len(xs) + 0.5)) - 1))
    return xs[k]


def request(url, prompt, max_tokens, out, key):
    t0 = time.time()
    try:
        st, r = http("POST", url + "/v1/completions", {"prompt": prompt, "max_tokens": max_tokens, "temperature": 0,
                                                        "ignore_eos": True})
    except OSError as e:  # refused or reset: counted as an error, not a crash of the run
        out[key] = {"error": str(e)}
        return
    t1 = time.time()
    if st != 200:
        out[key] = {"error": "%s %s" % (st, r)}
        return
    u = r["usage"]
    out[key] = {"ttft_s": u["kvtier"]["ttft_ms"] / 1e3, "done_s": t1 - t0, "t_send": t0, "t_done": t1,
                "prompt_tokens": u["prompt_tokens"], "completion_tokens": u["completion_tokens"]}


def long_prompts(n, chars):
    text = open(TEXT).read()
    step = max(1, (len(text) - chars) // max(1, n))
    return ["Document %d.\n%s\nSummarise the document above." % (i, text[i * step:i * step + chars]) for i in range(n)]


def short_prompt(i):
    return "Question %d: what is %d plus %d? Answer:" % (i, i, 2 * i + 1)


def summarize(res, keys_long, keys_short, t_start):
    errs = [k for k in res if "error" in res[k]]
    ok = {k: v for k, v in res.items() if "error" not in v}
    t_end = max(v["t_done"] for v in ok.values()) if ok else t_start
    toks = sum(v["prompt_tokens"] + v["completion_tokens"] for v in ok.values())
    sl = [ok[k]["ttft_s"] for k in keys_short if k in ok]
    ll = [ok[k]["ttft_s"] for k in keys_long if k in ok]
    ld = [ok[k]["done_s"] for k in keys_long if k in ok]
    return {"errors": len(errs), "short_ttft_p50_s": pct(sl, 50), "short_ttft_p99_s": pct(sl, 99),
            "long_ttft_p50_s": pct(ll, 50), "long_ttft_p99_s": pct(ll, 99),
            "long_done_mean_s": statistics.mean(ld) if ld else 0.0, "long_done_max_s": max(ld) if ld else 0.0,
            "long_prompt_tokens": min((ok[k]["prompt_tokens"] for k in keys_long if k in ok), default=0),
            "total_s": t_end - t_start, "tokens": toks, "tokens_per_s": toks / (t_end - t_start) if ok else 0.0}


def burst(url, a):
    res, th = {}, []
    longs = long_prompts(a.n_long, a.long_chars)
    t_start = time.time()
    for i, p in enumerate(longs):
        th.append(threading.Thread(target=request, args=(url, p, a.max_tokens, res, "L%d" % i)))
        th[-1].start()
    time.sleep(0.3)
    for i in range(a.n_short):
        th.append(threading.Thread(target=request, args=(url, short_prompt(i), a.max_tokens, res, "S%d" % i)))
        th[-1].start()
    for t in th:
        t.join()
    return summarize(res, ["L%d" % i for i in range(a.n_long)], ["S%d" % i for i in range(a.n_short)], t_start)


def steady(url, a):
    res, th = {}, []
    longs = long_prompts(64, a.long_chars)
    t_start = time.time()
    nl = ns = 0
    next_l, next_s = t_start, t_start + 0.1
    while time.time() < t_start + a.steady_s:
        now = time.time()
        if now >= next_l:
            th.append(threading.Thread(target=request, args=(url, longs[nl % 64], a.max_tokens, res, "L%d" % nl)))
            th[-1].start()
            nl += 1
            next_l += a.long_every_s
        if now >= next_s:
            th.append(threading.Thread(target=request,
                                       args=(url, short_prompt(1000 + ns), a.max_tokens, res, "S%d" % ns)))
            th[-1].start()
            ns += 1
            next_s += a.short_every_s
        time.sleep(0.01)
    for t in th:
        t.join()
    return summarize(res, ["L%d" % i for i in range(nl)], ["S%d" % i for i in range(ns)], t_start)


def mem_mib(pid):
    """VmRSS and VmHWM (the peak) of a process, MiB."""
    out = {}
    for line in open("/proc/%d/status" % pid):
        k = line.split(":")[0]
        if k in ("VmRSS", "VmHWM"):
            out[k] = int(line.split()[1]) / 1024.0
    return out


def shipped_conf(a, policy):
    """The shipped configuration, but for what a benchmark must set (port, model, backend, data dir, a small T2)."""
    return ("[server]\nlisten = 127.0.0.1:0\n[model]\npath = %s\ndevice = cpu\n%s[scheduler]\npolicy = %s\n%s"
            "[tier.nvme]\ncapacity = 64M\n[index]\ndata_dir = @DATA@\n[log]\nlevel = %s\n") % (
                MODEL, "threads = %d\n" % a.threads if a.threads else "", policy,
                "head_share = %g\n" % a.head_share if a.head_share is not None else "", a.log_level)


def run_policy(a, tmp, policy):
    conf = ("[server]\nlisten = 127.0.0.1:0\nmax_concurrent_requests = 256\nmax_queue = 256\n"
            "max_connections_per_ip = 0\n"
            "[model]\npath = %s\ndevice = cpu\ncontext = 4096\n%s"
            "[cache]\nmax_running = 64\n[scheduler]\npolicy = %s\n%s"
            "[tier.hbm]\ncapacity = 1G\n[tier.host]\ncapacity = 256M\n[tier.nvme]\ncapacity = 64M\n"
            "[index]\ndata_dir = @DATA@\n[log]\nlevel = %s\n") % (
                MODEL, "threads = %d\n" % a.threads if a.threads else "", policy,
                "head_share = %g\n" % a.head_share if a.head_share is not None else "", a.log_level)
    if a.config == "shipped":
        conf = shipped_conf(a, policy)
    d = Daemon(a.build, os.path.join(tmp, policy), conf)
    try:
        d.start()
        idle = {}
        request(d.url, short_prompt(999), a.max_tokens, idle, "warm")
        ttfts = []
        for i in range(5):
            request(d.url, short_prompt(500 + i), a.max_tokens, idle, "i")
            ttfts.append(idle["i"]["ttft_s"])
        out = {"idle_short_ttft_s": statistics.median(ttfts)}
        if a.burst:
            out["burst"] = burst(d.url, a)
            out["burst"]["mem_mib"] = mem_mib(d.proc.pid)
            st, stats = http("GET", d.url + "/v1/stats")
            if st == 200:  # issue 31's memory target: RSS <= weights + KV held + 300 MB
                out["burst"]["mem_mib"].update({k[:-6] + "_mib": v / 1048576.0 for k, v in stats["memory"].items()
                                                if k in ("weight_bytes", "kv_held_bytes", "other_bytes")})
        if a.steady_s > 0:
            out["steady"] = steady(d.url, a)
        st, stats = http("GET", d.url + "/v1/stats")
        out["scheduler_stats"] = stats.get("scheduler") if st == 200 else None
    finally:
        d.stop()
        if a.keep_logs:
            os.makedirs(a.keep_logs, exist_ok=True)
            shutil.copy(d.log, os.path.join(a.keep_logs, "kvtierd-%s.log" % policy))
    return out


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--build", default=os.path.join(ROOT, "build"))
    ap.add_argument("--n-long", type=int, default=4)
    ap.add_argument("--n-short", type=int, default=32)
    ap.add_argument("--long-chars", type=int, default=15000, help="characters of text per long prompt (~3.3K tokens)")
    ap.add_argument("--order", default="fifo,fair", help="the runs in order (machine drift favours one; fifo,fair,fair,fifo cancels a steady drift)")
    ap.add_argument("--max-tokens", type=int, default=16)
    ap.add_argument("--no-burst", dest="burst", action="store_false", help="skip the burst (steady mix only)")
    ap.add_argument("--steady-s", type=float, default=40.0, help="0 skips the steady mix")
    ap.add_argument("--long-every-s", type=float, default=20.0)
    ap.add_argument("--short-every-s", type=float, default=1.0)
    ap.add_argument("--threads", type=int, default=0, help="[model] threads (0 = auto)")
    ap.add_argument("--head-share", type=float, default=None, help="[scheduler] head_share (default: the daemon's)")
    ap.add_argument("--log-level", default="info", help="debug logs each step's rows and time")
    ap.add_argument("--keep-logs", default=None, help="copy each daemon's log into this folder")
    ap.add_argument("--config", choices=("bench", "shipped"), default="bench",
                    help="bench: T0 1G, max_running 64, no server limits; shipped: the defaults (T0 auto)")
    ap.add_argument("--out", default=None)
    a = ap.parse_args()
    tmp = tempfile.mkdtemp(prefix="kvt-bench-sched-")
    res = {"date": datetime.datetime.utcnow().isoformat() + "Z", "machine": platform.processor() or platform.machine(),
           "cpus": os.cpu_count(), "args": vars(a)}
    runs = {}
    try:
        for k, policy in enumerate(a.order.split(",")):
            print("running %s ..." % policy, flush=True)
            runs.setdefault(policy, []).append(run_policy(a, os.path.join(tmp, str(k)), policy))
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    # a policy run more than once (--order fifo,fair,fair,fifo cancels a steady drift of the machine):
    # every figure is the mean of its runs; the runs themselves are kept under "runs"
    for policy, rs in runs.items():
        m = {"idle_short_ttft_s": statistics.mean(r["idle_short_ttft_s"] for r in rs), "runs": rs,
             "scheduler_stats": rs[-1]["scheduler_stats"]}
        for load in ("burst", "steady"):
            if all(load in r for r in rs):
                m[load] = {k: statistics.mean(r[load][k] for r in rs) for k in rs[0][load] if k != "mem_mib"}
        res[policy] = m
    print("\n%-8s %-7s %10s %10s %10s %10s %12s %9s %9s %6s" % ("policy", "load", "short p50", "short p99",
                                                                  "long p50", "long p99", "long done", "total",
                                                                  "tok/s", "errors"))
    for policy in [p for p in ("fifo", "fair") if p in res]:
        for load in ("burst", "steady"):
            r = res[policy].get(load)
            if not r:
                continue
            print("%-8s %-7s %9.2fs %9.2fs %9.2fs %9.2fs %11.2fs %8.1fs %9.1f %6d" % (
                policy, load, r["short_ttft_p50_s"], r["short_ttft_p99_s"], r["long_ttft_p50_s"],
                r["long_ttft_p99_s"], r["long_done_mean_s"], r["total_s"], r["tokens_per_s"], r["errors"]))
    for policy in [p for p in ("fifo", "fair") if p in res]:
        print("%s: idle short TTFT %.1f ms; long prompts %d tokens" % (
            policy, res[policy]["idle_short_ttft_s"] * 1e3,
            (res[policy].get("burst") or res[policy].get("steady") or {}).get("long_prompt_tokens", 0)))
        for r in res[policy]["runs"]:
            if "burst" in r:
                m = r["burst"]["mem_mib"]
                print("%s: burst short p99 / idle %.1fx (idle %.1f ms, p99 %.2f s); memory after it: VmRSS %.0f MiB "
                      "(peak VmHWM %.0f) = weights %.0f + KV held %.0f + other %.0f MiB (issue 31: other <= 286 MiB)" % (
                          policy, r["burst"]["short_ttft_p99_s"] / r["idle_short_ttft_s"], r["idle_short_ttft_s"] * 1e3,
                          r["burst"]["short_ttft_p99_s"], m["VmRSS"], m["VmHWM"], m.get("weight_mib", 0),
                          m.get("kv_held_mib", 0), m.get("other_mib", 0)))
    ratios = {}
    for load in ("burst", "steady"):
        f, g = res.get("fifo", {}).get(load), res.get("fair", {}).get(load)
        if not f or not g:
            continue
        ratios[load] = {
            "fifo_short_p99_over_idle": f["short_ttft_p99_s"] / res["fifo"]["idle_short_ttft_s"],
            "fair_short_p99_over_idle": g["short_ttft_p99_s"] / res["fair"]["idle_short_ttft_s"],
            "fair_long_done_over_fifo": g["long_done_mean_s"] / f["long_done_mean_s"] if f["long_done_mean_s"] else 0,
            "fair_tokens_per_s_over_fifo": g["tokens_per_s"] / f["tokens_per_s"] if f["tokens_per_s"] else 0,
        }
        r = ratios[load]
        print("%s: short p99 / idle: fifo %.0fx, fair %.1fx (target <= 20x); long completion fair/fifo %.2fx "
              "(target <= 1.2x); throughput fair/fifo %.2fx (target >= 0.95x)" % (
                  load, r["fifo_short_p99_over_idle"], r["fair_short_p99_over_idle"],
                  r["fair_long_done_over_fifo"], r["fair_tokens_per_s_over_fifo"]))
    res["ratios"] = ratios
    out = a.out or os.path.join(ROOT, "bench", "results", "sched-%s.json" % datetime.date.today().isoformat())
    os.makedirs(os.path.dirname(out), exist_ok=True)
    with open(out, "w") as f:
        json.dump(res, f, indent=1)
    print("wrote", out)


if __name__ == "__main__":
    main()
