#!/usr/bin/env python3
"""bench/bench_slow_clients.py — a legitimate request's latency while 1,000 slow clients hold connections.

The attack: half-open HTTP connections that each send a request line and then
one header line every 5 s, never finishing their headers (slowloris). They
come from loopback addresses 127.0.0.2 ... 127.0.0.N, 63 per address (under
the default per-address limit of 64, so every one of them is accepted and
held), and a connection the daemon closes is opened again at once, as an
attacker would.

One run per build given (--build, and optionally --baseline-build, e.g. a
build of the thread-per-connection server):
  1. the daemon starts on the default model; a warm-up request;
  2. idle: --reps legitimate requests from 127.0.0.1, one at a time
     (POST /v1/completions, 8 tokens, greedy), wall latency each;
  3. the slow clients connect and are held; the same --reps requests;
  4. the daemon's thread count (/proc/PID/status) idle and under load, and
     how many slow connections were open at the end.

Reported per build: median latency idle and under load and their ratio
(target <= 1.2), requests that failed (timeout --timeout s), threads.

Usage: bench/bench_slow_clients.py [--build build] [--baseline-build DIR] [--slow 1000]
         [--reps 15] [--out bench/results/slow-clients-<date>.json]
"""
import argparse
import datetime
import json
import os
import platform
import select
import shutil
import socket
import statistics
import sys
import tempfile
import threading
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(ROOT, "tests", "daemon"))
from kvtierd_proc import Daemon, http  # noqa: E402

PARTIAL = b"GET /health HTTP/1.1\r\nHost: 127.0.0.1\r\n"


class SlowClients:
    """n half-open connections from 127.0.0.2.., each trickling a header line every `every` s."""

    def __init__(self, port, n, per_addr=63, every=5.0):
        self.port, self.n, self.per_addr, self.every = port, n, per_addr, every
        self.socks = {}  # slot -> socket
        self.stop = threading.Event()
        self.reopened = 0
        self.thread = threading.Thread(target=self._run, daemon=True)

    def _open(self, slot):
        host = "127.0.0.%d" % (2 + slot // self.per_addr)
        s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        s.setblocking(True)
        s.settimeout(2)
        try:
            s.bind((host, 0))
            s.connect(("127.0.0.1", self.port))
            s.sendall(PARTIAL)
            s.setblocking(False)
            self.socks[slot] = s
        except OSError:
            s.close()
            self.socks.pop(slot, None)

    def open_all(self):
        for slot in range(self.n):
            self._open(slot)
        self.thread.start()

    def _run(self):
        last = time.time()
        while not self.stop.is_set():
            # a connection the daemon closed reads EOF: open it again
            socks = list(self.socks.items())
            if socks:
                r, _, _ = select.select([s for _, s in socks], [], [], 0.2)
                for slot, s in socks:
                    if s in r:
                        try:
                            data = s.recv(4096)
                        except OSError:
                            data = b""
                        if not data:
                            s.close()
                            self.socks.pop(slot, None)
                            self.reopened += 1
                            self._open(slot)
            for slot in range(self.n):
                if slot not in self.socks and not self.stop.is_set():
                    self._open(slot)
            if time.time() - last >= self.every:
                last = time.time()
                for s in list(self.socks.values()):
                    try:
                        s.send(b"X-Slow: 1\r\n")
                    except OSError:
                        pass
            time.sleep(0.05)

    def close(self):
        self.stop.set()
        self.thread.join(timeout=10)
        for s in self.socks.values():
            s.close()


def threads_of(pid):
    with open("/proc/%d/status" % pid) as f:
        for line in f:
            if line.startswith("Threads:"):
                return int(line.split()[1])
    return -1


def latencies(url, reps, timeout):
    out, failed = [], 0
    body = {"prompt": "The capital of France is", "max_tokens": 8, "temperature": 0, "ignore_eos": True}
    for _ in range(reps):
        t = time.time()
        try:
            st, _ = http("POST", url + "/v1/completions", body, timeout=timeout)
            ok = st == 200
        except OSError:
            ok = False
        if ok:
            out.append(time.time() - t)
        else:
            failed += 1
    return out, failed


def run(build, model, n_slow, reps, timeout, new_keys):
    tmp = tempfile.mkdtemp(prefix="kvt_slow_")
    conf = ("[server]\nlisten = 127.0.0.1:0\n%s[model]\npath = %s\nthreads = 1\n"
            "[tier.nvme]\ncapacity = 64M\n[index]\ndata_dir = @DATA@\n" %
            ("max_connections = %d\n" % (n_slow + 64) if new_keys else "", model))
    d = Daemon(build, tmp, conf)
    res = {"build": build}
    try:
        d.start()
        port = int(d.url.rsplit(":", 1)[1])
        latencies(d.url, 2, timeout)  # warm-up
        idle, f_idle = latencies(d.url, reps, timeout)
        res["threads_idle"] = threads_of(d.proc.pid)
        slow = SlowClients(port, n_slow)
        slow.open_all()
        time.sleep(2)
        res["slow_open_start"] = len(slow.socks)
        loaded, f_loaded = latencies(d.url, reps, timeout)
        res["threads_loaded"] = threads_of(d.proc.pid)
        res["slow_open_end"] = len(slow.socks)
        res["slow_reopened"] = slow.reopened
        slow.close()
        res.update({
            "idle_median_s": statistics.median(idle) if idle else None,
            "loaded_median_s": statistics.median(loaded) if loaded else None,
            "idle_failed": f_idle, "loaded_failed": f_loaded, "reps": reps,
        })
        if idle and loaded:
            res["ratio"] = res["loaded_median_s"] / res["idle_median_s"]
    finally:
        d.stop()
        shutil.rmtree(tmp, ignore_errors=True)
    return res


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--build", default=os.path.join(ROOT, "build"))
    ap.add_argument("--baseline-build", default=None,
                    help="a build of another kvtierd (e.g. the thread-per-connection server) to run the same way")
    ap.add_argument("--model", default=os.path.join(ROOT, "models", "SmolLM2-135M-Instruct.Q4_1.gguf"))
    ap.add_argument("--slow", type=int, default=1000)
    ap.add_argument("--reps", type=int, default=15)
    ap.add_argument("--timeout", type=float, default=10.0)
    ap.add_argument("--out", default=os.path.join(ROOT, "bench", "results",
                                                  "slow-clients-%s.json" % datetime.date.today().isoformat()))
    a = ap.parse_args()
    if not os.path.exists(a.model):
        print("bench_slow_clients: no model at %s (scripts/fetch_model.sh)" % a.model)
        return 77
    rows = [run(a.build, a.model, a.slow, a.reps, a.timeout, True)]
    if a.baseline_build:
        rows.append(run(a.baseline_build, a.model, a.slow, a.reps, a.timeout, False))
    print("machine: %s, %d cores, python %s" % (platform.platform(), os.cpu_count(), platform.python_version()))
    print("%-40s %10s %10s %7s %8s %8s %9s %9s" % ("build", "idle_ms", "loaded_ms", "ratio", "failed", "threads",
                                                 "slow_open", "reopened"))
    for r in rows:
        fmt = lambda v: "%.1f" % (v * 1e3) if v else "-"  # noqa: E731
        print("%-40s %10s %10s %7s %8s %8s %9s %9s" % (
            r["build"][-40:], fmt(r.get("idle_median_s")), fmt(r.get("loaded_median_s")),
            "%.2f" % r["ratio"] if "ratio" in r else "-",
            "%d+%d" % (r.get("idle_failed", 0), r.get("loaded_failed", 0)),
            "%s/%s" % (r.get("threads_idle"), r.get("threads_loaded")),
            "%s-%s" % (r.get("slow_open_start"), r.get("slow_open_end")), r.get("slow_reopened")))
    os.makedirs(os.path.dirname(a.out), exist_ok=True)
    with open(a.out, "w") as f:
        json.dump({"date": datetime.datetime.now().isoformat(), "slow": a.slow, "rows": rows}, f, indent=1)
    print("wrote", a.out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
