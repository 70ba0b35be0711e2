#!/usr/bin/env python3
"""bench/bench_remote.py — T3 across nodes, against the same work without T3, in one run.

Starts a 3-master Redis Cluster on loopback (tests/remote/redis_cluster.py) and
kvtierd nodes on the default model (f16 tiers, CPU backend, one shared secret):
A and B with [tier.remote] on the cluster, C and D without it. Then:

  ttft      for each of --histories conversations with a history of at least
            --history-tokens tokens: turn 1 on A; turn 2 (a short new user
            message) on B, whose prompt comes from T3, and the same turn 2 on
            C, which has never seen it and prefills it all. Reports the median
            TTFT of each (usage.kvtier.ttft_ms) and the ratio B / C
            (target <= 0.2 for >= 1K-token histories).
  hitrate   --convs conversations of --turns turns spread round-robin over two
            nodes (turn i of conversation c on node (c + i) % 2): once over A+B
            (T3), once over C+D (no T3). Reports cached prompt tokens / prompt
            tokens, and cached / reusable (full blocks of prompt) for each.

The T3 read throughput against plain GETs is bench/bench_t3.c. Every process is
killed at the end. Prints one JSON object last.
Usage: bench_remote.py BUILD_DIR [--histories N] [--history-tokens N] [--convs N] [--turns N]
"""
import argparse
import json
import os
import shutil
import signal
import statistics
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
sys.path.insert(0, os.path.join(ROOT, "tests", "remote"))
sys.path.insert(0, os.path.join(ROOT, "tests", "daemon"))
import redis_cluster  # noqa: E402
from kvtierd_proc import Daemon, http  # noqa: E402

MODEL = os.path.join(ROOT, "models", "SmolLM2-135M-Instruct.Q4_1.gguf")
TEXT = "/usr/share/common-licenses/GPL-3"


def node(build, tmp, name, secret, seeds=None):
    remote = ("[tier.remote]\nenabled = true\nseeds = %s\nprefix = bench:\ncommand_timeout = 1\n" % seeds
              if seeds else "")
    return Daemon(build, os.path.join(tmp, name),
                  "[server]\nlisten = 127.0.0.1:0\nsecret_file = %s\n[model]\npath = %s\ndevice = cpu\ncontext = 4096\n"
                  "[tier.hbm]\ncapacity = 256M\n[tier.host]\ncapacity = 128M\ndtype = f16\n[tier.nvme]\ncapacity = 64M\n"
                  "%s[index]\ndata_dir = @DATA@\n" % (secret, MODEL, remote))


def chat(d, messages, max_tokens=16):
    st, r = http("POST", d.url + "/v1/chat/completions",
                 {"messages": messages, "max_tokens": max_tokens, "temperature": 0}, timeout=600)
    if st != 200:
        raise RuntimeError("chat: %s %s" % (st, r))
    return r


def drain(d, timeout=30):
    t_end = time.time() + timeout
    while time.time() < t_end:
        st, s = http("GET", d.url + "/v1/stats")
        if st == 200 and (s.get("remote") or {}).get("write_queue", 1) == 0:
            return
        time.sleep(0.05)
    raise RuntimeError("T3 write queue did not drain")


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("build")
    ap.add_argument("--histories", type=int, default=3)
    ap.add_argument("--history-tokens", type=int, default=1100)
    ap.add_argument("--convs", type=int, default=4)
    ap.add_argument("--turns", type=int, default=4)
    a = ap.parse_args()
    build = os.path.abspath(a.build)
    words = open(TEXT).read().split()
    tmp = tempfile.mkdtemp(prefix="kvt-bench-remote-")
    nodes, cl = [], None
    out = {}
    try:
        cl = redis_cluster.RedisCluster(3)
        secret = os.path.join(tmp, "secret")
        with open(secret, "wb") as f:
            f.write(os.urandom(32))
        os.chmod(secret, 0o600)
        A, B = node(build, tmp, "a", secret, cl.seeds()), node(build, tmp, "b", secret, cl.seeds())
        C, D = node(build, tmp, "c", secret), node(build, tmp, "d", secret)
        nodes = [A, B, C, D]
        for d in nodes:
            d.start()
        print("machine: %d cores; model %s; CPU backend" % (os.cpu_count(), os.path.basename(MODEL)), flush=True)

        # ttft: a >= history-tokens history made on A, its next turn on B (T3) and on C (prefill)
        t3, pre, hist = [], [], []
        n_words = int(a.history_tokens * 0.8)
        for h in range(a.histories + 1):  # the first is a warm-up
            chunk = " ".join(words[h * n_words:(h + 1) * n_words])
            m = [{"role": "user", "content": "Read this and say what it is about in one sentence.\n\n" + chunk}]
            r1 = chat(A, m)
            drain(A)
            m2 = m + [{"role": "assistant", "content": r1["choices"][0]["message"]["content"]},
                      {"role": "user", "content": "Thanks. And who wrote it?"}]
            rb, rc = chat(B, m2), chat(C, m2)
            if h == 0:
                continue
            u = rb["usage"]
            hist.append(u["prompt_tokens"])
            t3.append(u["kvtier"]["ttft_ms"])
            pre.append(rc["usage"]["kvtier"]["ttft_ms"])
            print("history %d: %d prompt tokens, %d from remote on B; TTFT B (T3) %.1f ms, C (prefill) %.1f ms"
                  % (h, u["prompt_tokens"], u["kvtier"]["cached_tokens_by_tier"]["remote"], t3[-1], pre[-1]),
                  flush=True)
        out["ttft"] = {"histories": a.histories, "prompt_tokens_median": statistics.median(hist),
                       "t3_ms_median": statistics.median(t3), "prefill_ms_median": statistics.median(pre),
                       "ratio": statistics.median(t3) / statistics.median(pre)}
        print("ttft: T3 %.1f ms vs re-prefill %.1f ms: %.3fx" % (out["ttft"]["t3_ms_median"],
              out["ttft"]["prefill_ms_median"], out["ttft"]["ratio"]), flush=True)

        # hitrate: round-robin over two nodes, with and without T3
        topics = ["the sea", "mountains", "rivers", "deserts", "forests", "cities", "islands", "glaciers"]
        follow = ["Tell me more.", "Why does that matter?", "Give an example.", "Summarize in one sentence.",
                  "What else?", "And then?"]
        for label, pair in (("t3", (A, B)), ("no_t3", (C, D))):
            prompt = cached = reusable = 0
            for c in range(a.convs):
                m = [{"role": "user", "content": "Let us talk about %s (conversation %d of run %s)." %
                      (topics[c % len(topics)], c, label)}]
                for i in range(a.turns):
                    d = pair[(c + i) % 2]
                    r = chat(d, m)
                    u = r["usage"]
                    prompt += u["prompt_tokens"]
                    cached += u["prompt_tokens_details"]["cached_tokens"]
                    reusable += (u["prompt_tokens"] - 1) // 16 * 16
                    if label == "t3":
                        drain(d)  # the next turn runs on the other node
                    m = m + [{"role": "assistant", "content": r["choices"][0]["message"]["content"]},
                             {"role": "user", "content": follow[i % len(follow)]}]
            out["hitrate_" + label] = {"prompt_tokens": prompt, "cached_tokens": cached,
                                       "hit_rate": cached / prompt, "of_reusable": cached / max(reusable, 1)}
            print("hitrate %s: %d of %d prompt tokens cached (%.1f%%; %.1f%% of the full blocks)"
                  % (label, cached, prompt, 100 * cached / prompt, 100 * cached / max(reusable, 1)), flush=True)
    finally:
        for d in nodes:
            try:
                d.stop(signal.SIGKILL)
            except Exception:  # noqa: BLE001
                pass
        if cl:
            cl.stop()
        shutil.rmtree(tmp, ignore_errors=True)
    print(json.dumps(out))
    return 0


if __name__ == "__main__":
    sys.exit(main())
