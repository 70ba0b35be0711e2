#!/usr/bin/env python3
"""Start-up time and memory of kvtierd on the CPU, as ratios to `kvtier generate -n 1`.

For each model (the default SmolLM2, and with --synth-1b a Llama-3.2-1B-shaped q8_0 GGUF
that `bench_gpu --synth-1b` writes under /tmp and this script deletes), ROUNDS rounds
alternate, in this order: `kvtier generate -m MODEL -p Hello -n 1` (wall time: load,
one prefill, one token), then kvtierd started on the same model (wall time from exec to
the first 200 of /health), its idle memory (/proc/PID/status: VmRSS, RssAnon, RssFile,
VmLck, one second after /health), then a workload (REQUESTS chat requests of about 300
prompt tokens and 8 completion tokens, two turns each) and its memory after it, against
the weights plus the KV bytes /v1/stats says T0 and T1 hold. With --base BUILD, the same
rounds run the daemon of BUILD as well (the baseline: ratios ours / base). Every daemon
of a build reuses its data dir across rounds, as a restarted daemon would (the first
start, which has no cached fingerprint or prefill rate, is reported on its own).

Usage: python3 bench/bench_startup.py [--build build] [--base BUILD] [--rounds 3]
       [--synth-1b] [--requests 4] [--threads 2]
"""
import argparse
import json
import os
import platform
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
MIB = 1048576.0
sys.path.insert(0, os.path.join(ROOT, "tests", "daemon"))
from kvtierd_proc import proc_status  # noqa: E402


def http(method, url, body=None, timeout=600):
    data = json.dumps(body).encode() if body is not None else None
    req = urllib.request.Request(url, data=data, method=method, headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=timeout) as r:
        return json.loads(r.read() or b"null")


def gen_time(build, model, threads):
    t = time.monotonic()
    subprocess.run([os.path.join(build, "kvtier"), "generate", "-m", model, "-p", "Hello", "-n", "1",
                    "--threads", str(threads)], check=True, capture_output=True)
    return time.monotonic() - t


def daemon_round(build, model, data_dir, threads, n_requests):
    """One start: seconds to /health, idle memory, memory and KV held after the workload, the weight bytes."""
    os.makedirs(data_dir, exist_ok=True)
    conf = os.path.join(data_dir, "kvtier.conf")
    log = os.path.join(data_dir, "kvtierd.log")
    with open(conf, "w") as f:
        f.write("[server]\nlisten = 127.0.0.1:0\n[model]\npath = %s\ndevice = cpu\nthreads = %d\n"
                "[tier.nvme]\ncapacity = 64M\n[index]\ndata_dir = %s\n" % (model, threads, data_dir))
    n_before = open(log).read().count("listening on") if os.path.exists(log) else 0
    t0 = time.monotonic()
    p = subprocess.Popen([os.path.join(build, "kvtierd"), "-c", conf], stdout=open(log, "a"),
                         stderr=subprocess.STDOUT)
    url = None
    try:
        while True:
            if p.poll() is not None:
                raise RuntimeError("kvtierd exited: " + open(log).read()[-2000:])
            if url is None:
                ports = re.findall(r"listening on [0-9.]+:(\d+)", open(log).read())
                if len(ports) > n_before:
                    url = "http://127.0.0.1:" + ports[-1]
            if url:
                try:
                    if urllib.request.urlopen(url + "/health", timeout=5).status == 200:
                        break
                except OSError:
                    pass
            time.sleep(0.01)
        t_health = time.monotonic() - t0
        time.sleep(1.0)
        idle = proc_status(p.pid)
        words = "the quick brown fox jumps over the lazy dog while a cat sleeps on a warm mat ".split()
        for i in range(n_requests):
            text = " ".join(words[(i + k) % len(words)] for k in range(260))
            msgs = [{"role": "user", "content": "%d: %s" % (i, text)}]
            r = http("POST", url + "/v1/chat/completions",
                     {"model": "m", "messages": msgs, "max_tokens": 8, "temperature": 0})
            msgs += [r["choices"][0]["message"], {"role": "user", "content": "and then?"}]
            http("POST", url + "/v1/chat/completions", {"model": "m", "messages": msgs, "max_tokens": 8,
                                                        "temperature": 0})
        busy = proc_status(p.pid)
        st = http("GET", url + "/v1/stats")
        tiers = {t["name"]: t for t in st["tiers"]}
        kv = tiers["hbm"]["used_bytes"] + tiers["host"]["used_bytes"]
        weights = st.get("memory", {}).get("weight_bytes")
        if weights is None:  # a baseline without the memory report: the log's figure
            m = re.findall(r"model loaded .*?\(([0-9.]+) MiB of weights", open(log).read())
            weights = float(m[-1]) * MIB
        return t_health, idle, busy, kv, weights
    finally:
        p.terminate()
        p.wait(300)


def med(xs):
    return statistics.median(xs)


def bench_model(a, model, label):
    builds = [("ours", a.build)] + ([("base", a.base)] if a.base else [])
    tmp = tempfile.mkdtemp(prefix="kvt_bench_startup_")
    res = {name: {"health": [], "idle": [], "busy": [], "kv": [], "first": None, "w": 0} for name, _ in builds}
    gen = []
    try:
        gen_time(a.build, model, a.threads)  # warm the page cache
        for name, b in builds:  # first starts (no cached fingerprint or prefill rate)
            res[name]["first"] = daemon_round(b, model, os.path.join(tmp, name), a.threads, 0)[0]
        for r in range(a.rounds):
            gen.append(gen_time(a.build, model, a.threads))
            for name, b in builds:
                th, idle, busy, kv, w = daemon_round(b, model, os.path.join(tmp, name), a.threads, a.requests)
                x = res[name]
                x["health"].append(th)
                x["idle"].append(idle)
                x["busy"].append(busy)
                x["kv"].append(kv)
                x["w"] = w
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    g = med(gen)
    print("\n%s: `kvtier generate -n 1` %.2f s (median of %d)" % (label, g, a.rounds))
    for name, _ in builds:
        x = res[name]
        h = med(x["health"])
        pick = lambda rows, k: med([m.get(k, 0) for m in rows]) / MIB
        print("  %-4s start to /health %.2f s (first start %.2f s) = %.2fx generate; weights %.0f MiB" %
              (name, h, x["first"], h / g, x["w"] / MIB))
        print("       idle: RSS %.0f MiB (anon %.0f, file %.0f, locked %.0f) = weights + %.0f MiB" %
              (pick(x["idle"], "VmRSS"), pick(x["idle"], "RssAnon"), pick(x["idle"], "RssFile"),
               pick(x["idle"], "VmLck"), pick(x["idle"], "VmRSS") - x["w"] / MIB))
        kv = med(x["kv"]) / MIB
        print("       after %d conversations: RSS %.0f MiB = weights + KV held %.0f MiB + %.0f MiB" %
              (a.requests, pick(x["busy"], "VmRSS"), kv, pick(x["busy"], "VmRSS") - x["w"] / MIB - kv))
    if a.base:
        print("  ours / base: start to /health %.2fx, idle RSS %.2fx" %
              (med(res["ours"]["health"]) / med(res["base"]["health"]),
               med([m["VmRSS"] for m in res["ours"]["idle"]]) / med([m["VmRSS"] for m in res["base"]["idle"]])))


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--build", default=os.path.join(ROOT, "build"))
    ap.add_argument("--base", help="a second build dir, run in the same rounds (the baseline)")
    ap.add_argument("--model", default=os.path.join(ROOT, "models/SmolLM2-135M-Instruct.Q4_1.gguf"))
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--requests", type=int, default=4)
    ap.add_argument("--threads", type=int, default=os.cpu_count())
    ap.add_argument("--synth-1b", action="store_true", help="also a Llama-3.2-1B-shaped q8_0 GGUF (~1 GB in /tmp)")
    a = ap.parse_args()
    a.build = os.path.abspath(a.build)
    a.base = os.path.abspath(a.base) if a.base else None
    cpu = next((l.split(":", 1)[1].strip() for l in open("/proc/cpuinfo") if l.startswith("model name")), "?")
    print("machine: %s %s, %d cores; threads %d; load average %s" %
          (platform.node(), cpu, os.cpu_count(), a.threads, open("/proc/loadavg").read().split()[0]))
    bench_model(a, a.model, os.path.basename(a.model))
    if a.synth_1b:
        path = os.path.join(tempfile.gettempdir(), "kvt_bench_startup_1b.gguf")
        try:
            subprocess.run([os.path.join(a.build, "bench_gpu"), "--synth-1b", path], check=True)
            bench_model(a, path, "llama-3.2-1B shape (synthetic, q8_0)")
        finally:
            if os.path.exists(path):
                os.unlink(path)
    return 0


if __name__ == "__main__":
    sys.exit(main())
