"""bench/bench_ack.py — what "acknowledged means durable" costs a turn.

    bench_ack.py BUILD [--sessions 1,100,10000] [--pairs 200] [--dir D]

A reply with session_id goes out only once the turn's session row has committed (group
commit, synchronous=FULL, plus the session journal's append and fdatasync). This measures
the latency that adds per turn: kvtierd serves the small synthetic model that
`BUILD/bench_gpu --synth` writes; for each count N of sessions already in the index, it
runs --pairs alternating pairs of the same one-token completion, one with a session_id
(one of the N, in turn) and one without, and reports the medians and their difference
(target: p50 added <= 2 ms). Each N starts from a fresh data dir (16 MiB NVMe tier),
filled with N sessions first; everything is removed at the end.
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
import time

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "tests", "daemon"))
from kvtierd_proc import Daemon, http  # noqa: E402


def turn(d, prompt, sid):
    body = {"prompt": prompt, "max_tokens": 1, "temperature": 0}
    if sid:
        body["session_id"] = sid
    t = time.perf_counter()
    st, r = http("POST", d.url + "/v1/completions", body, timeout=60)
    dt = time.perf_counter() - t
    if st != 200:
        raise RuntimeError("status %s: %s" % (st, r))
    return dt


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("build")
    ap.add_argument("--sessions", default="1,100,10000")
    ap.add_argument("--pairs", type=int, default=200)
    ap.add_argument("--dir", default=None)
    a = ap.parse_args()
    build = os.path.abspath(a.build)
    tmp = tempfile.mkdtemp(prefix="kvt_bench_ack_", dir=a.dir)
    model = os.path.join(tmp, "synth.gguf")
    subprocess.run([os.path.join(build, "bench_gpu"), "--synth", model], check=True, stdout=subprocess.DEVNULL)
    print(json.dumps({"bench": "ack", "machine": platform.machine(), "cpus": os.cpu_count(),
                      "kernel": platform.release(), "pairs": a.pairs}), flush=True)
    try:
        for n in [int(x) for x in a.sessions.split(",")]:
            data = os.path.join(tmp, "data-%d" % n)
            d = Daemon(build, data,
                       "[server]\nlisten = 127.0.0.1:0\nmax_queue = 256\n[model]\npath = %s\ndevice = cpu\n"
                       "context = 2048\n[tier.hbm]\ncapacity = 32M\n[tier.host]\ncapacity = 32M\n"
                       "[tier.nvme]\ncapacity = 16M\n[index]\ndata_dir = @DATA@\n" % model)
            d.start()
            try:
                t0 = time.time()
                for i in range(n):  # the sessions already there
                    turn(d, [3 + (i * 7 + k) % 250 for k in range(8)], "s%d" % i)
                fill_s = time.time() - t0
                prompt = [5 + k % 240 for k in range(24)]
                for _ in range(10):  # warm-up
                    turn(d, prompt, None)
                    turn(d, prompt, "s0")
                with_s, without_s = [], []
                for i in range(a.pairs):  # alternating, so drift hits both alike
                    if i % 2:
                        without_s.append(turn(d, prompt, None))
                        with_s.append(turn(d, prompt, "s%d" % (i % n)))
                    else:
                        with_s.append(turn(d, prompt, "s%d" % (i % n)))
                        without_s.append(turn(d, prompt, None))
                p50w, p50o = statistics.median(with_s), statistics.median(without_s)
                q = lambda v, p: sorted(v)[min(len(v) - 1, int(p * len(v)))]
                print(json.dumps({"bench": "ack", "sessions": n, "fill_s": round(fill_s, 1),
                                  "p50_with_session_ms": round(p50w * 1e3, 3),
                                  "p50_without_ms": round(p50o * 1e3, 3),
                                  "p50_added_ms": round((p50w - p50o) * 1e3, 3),
                                  "p90_with_session_ms": round(q(with_s, 0.9) * 1e3, 3),
                                  "p90_without_ms": round(q(without_s, 0.9) * 1e3, 3),
                                  "ratio_p50": round(p50w / p50o, 3)}), flush=True)
            finally:
                d.stop()
                shutil.rmtree(data, ignore_errors=True)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
