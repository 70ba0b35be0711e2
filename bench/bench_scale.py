#!/usr/bin/env python3
"""bench/bench_scale.py — kvtier at real model shapes on the CPU, against itself with the
cache off and, when one is given, llama.cpp's llama-server, in one run.

    python3 bench/bench_scale.py [--build build] [--shape llama3.2-1b|llama3-8b]
        [--type q8_0|q4_k_m] [--threads 2] [--history 2048,8192] [--decode 64]
        [--llama-server PATH] [--peer-no-repack] [--engines LIST] [--model SHAPE.gguf] [--layers N]
        [--activations default|int16|int8] [--decode-only ROUNDS [--prefill-tokens N]]
        [--first-start ROUNDS] [--alt-build DIR] [--out bench/results/scale-....json]

The model: `BUILD/bench_shape_model` writes a GGUF of the shape (random weights from a
fixed seed; Q8_0, or Q4_K_M's mix) with the default model's real tokenizer and chat
template, under a temporary dir removed at the end. The conversation: one long user
message of deterministic English-like text (about HISTORY tokens), then a short follow-up.

Each engine (kvtier, kvtier with `[cache] enabled = false`, llama-server, and with --engines
kvtier-f16nvme: kvtier with `[tier.nvme] dtype = f16`) is measured as:
- startup_s: process start to the first healthy `GET /health` (polled every 20 ms);
- rss_idle: VmRSS, RssAnon, RssFile, VmLck of the process then (MiB);
- turn1_s: the long first turn, `max_tokens` 1 (its prefill, wall time);
- cached_s: the follow-up turn (history + reply + a new question), `max_tokens` 1;
- restart_s: the same follow-up after a SIGTERM and a fresh start (kvtier: the history
  paged back from NVMe; the others re-prefill), plus the restart's own startup_s;
- decode_tok_s: (time of a `max_tokens` DECODE+1 reply - time of a 1-token reply) / DECODE
  on a short prompt sent once before (so both timed replies find the same prompt cache),
  `ignore_eos` on, so both engines generate exactly DECODE tokens more;
- rss_after: the process's memory after all of it, with kvtier's own view of its KV (T0/T1
  bytes held, from /v1/stats) beside it, and nvme_used_bytes (the NVMe tier's records).
--decode-only ROUNDS measures only decode_tok_s (with startup_s and the RSS): every engine
is started at once and ROUNDS rounds alternate between them (the order rotating), the
median reported; any GGUF works there with --model (Gemma 3, the default model). With
--prefill-tokens N each of those rounds first times a fresh prompt of about N tokens (text
new in every round, so no engine holds it; `max_tokens` 1): prefill_tok_s = (prompt_tokens -
cached_tokens) / wall time of that request (the chat template's few shared tokens may be
cached; both counts are kept in the rows).
--activations default writes no `activations` line (kvtier's own default); int16 / int8 set it.
--alt-build DIR adds the engine kvtier-alt: DIR's kvtierd with the same config and
`activations = int8` (e.g. a build of an older tree, to compare kernels in the same rounds).
--first-start ROUNDS measures only startup_s on an empty data dir (kvtier's first start
hashes the model for its fingerprint): the model is read once first, so it is in the page
cache for every engine, then each round starts and stops each engine once in a fresh work
dir, the order rotating; the median reported, every start in first_starts.
Engines alternate per history length, so a slow spell of the shared machine hits each.
Ratios (kvtier / peer) are printed per figure. Data dirs use a small NVMe tier and are
deleted. Not a test: figures go to bench/results and bench/README.md.
"""
import argparse
import json
import os
import platform
import random
import shutil
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request

ROOT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..")
WORDS = ("time year people way day man thing woman life child world school state family student group country "
         "problem hand part place case week company system program question work government number night point "
         "home water room mother area money story fact month lot right study book eye job word business issue side "
         "kind head house service friend father power hour game line end member law car city community name "
         "president team minute idea kid body information back parent face others level office door health person "
         "art war history party result change morning reason research girl guy moment air teacher force education").split()


def english(n_words, seed):
    """Deterministic sentences of common words: text a real tokenizer splits as it would prose."""
    r = random.Random(seed)
    out, n = [], 0
    while n < n_words:
        k = r.randint(6, 16)
        s = " ".join(r.choice(WORDS) for _ in range(k))
        out.append(s[0].upper() + s[1:] + ".")
        n += k
    return " ".join(out)


def http(method, url, body=None, timeout=3600):
    data = json.dumps(body).encode() if body is not None else None
    req = urllib.request.Request(url, data=data, method=method, headers={"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(req, timeout=timeout) as r:
            return r.status, json.loads(r.read() or b"null")
    except urllib.error.HTTPError as e:
        return e.code, e.read().decode(errors="replace")


def free_port():
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    p = s.getsockname()[1]
    s.close()
    return p


def mem_of(pid):
    """VmRSS, RssAnon, RssFile, VmLck of a process, MiB."""
    out = {}
    with open("/proc/%d/status" % pid) as f:
        for line in f:
            k, _, v = line.partition(":")
            if k in ("VmRSS", "RssAnon", "RssFile", "VmLck"):
                out[k] = round(int(v.split()[0]) / 1024, 1)
    return out


class Engine:
    """One server process: kvtierd (cache on or off) or llama-server."""

    def __init__(self, kind, args, model, work):
        self.kind, self.args, self.model, self.work = kind, args, model, work
        self.proc = None
        self.port = free_port()
        self.url = "http://127.0.0.1:%d" % self.port
        self.log = os.path.join(work, kind + ".log")
        if kind.startswith("kvtier"):
            act = "int8" if kind == "kvtier-alt" else args.activations
            self.data = os.path.join(work, kind + "-data")
            os.makedirs(self.data, exist_ok=True)
            self.conf = os.path.join(self.data, "kvtier.conf")
            with open(self.conf, "w") as f:
                f.write("[server]\nlisten = 127.0.0.1:%d\n[model]\npath = %s\ndevice = cpu\nthreads = %d\n"
                        "context = %d\n%s[tier.nvme]\ncapacity = %s\n%s[index]\ndata_dir = %s\n%s"
                        % (self.port, model, args.threads, args.context,
                           "" if act == "default" else "activations = %s\n" % act, args.nvme,
                           "dtype = f16\n" if kind == "kvtier-f16nvme" else "", self.data,
                           "[cache]\nenabled = false\n" if kind == "kvtier-nocache" else ""))

    def start(self):
        if self.kind.startswith("kvtier"):
            build = self.args.alt_build if self.kind == "kvtier-alt" else self.args.build
            cmd = [os.path.join(build, "kvtierd"), "-c", self.conf]
        else:
            cmd = [self.args.llama_server, "-m", self.model, "--port", str(self.port), "--host", "127.0.0.1",
                   "-t", str(self.args.threads), "-c", str(self.args.context), "-np", "1"]
            if self.args.peer_no_repack:
                cmd.append("-nr")  # its AMX repack dies with SIGILL on some Xeon VMs
        t0 = time.time()
        self.proc = subprocess.Popen(cmd, stdout=open(self.log, "a"), stderr=subprocess.STDOUT)
        while time.time() - t0 < 900:
            if self.proc.poll() is not None:
                raise RuntimeError("%s exited %d; see %s" % (self.kind, self.proc.returncode, self.log))
            try:
                if http("GET", self.url + "/health", timeout=2)[0] == 200:
                    return time.time() - t0
            except OSError:
                pass
            time.sleep(0.02)
        raise RuntimeError("%s not healthy in 900 s" % self.kind)

    def stop(self):
        if self.proc and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(600)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self.proc = None

    def chat(self, messages, max_tokens, session=None):
        body = {"model": "m", "messages": messages, "max_tokens": max_tokens, "temperature": 0,
                "ignore_eos": True}
        if session and self.kind in ("kvtier", "kvtier-f16nvme"):
            body["session_id"] = session
        t0 = time.time()
        st, r = http("POST", self.url + "/v1/chat/completions", body)
        dt = time.time() - t0
        if st != 200:
            raise RuntimeError("%s: chat answered %s: %s" % (self.kind, st, str(r)[:300]))
        return dt, r

    def kv_held(self):
        """kvtier's own count of the KV bytes it holds in T0 and T1 (MiB), else None."""
        if not self.kind.startswith("kvtier"):
            return None
        st, s = http("GET", self.url + "/v1/stats")
        if st != 200:
            return None
        return round(sum(t.get("used_bytes", 0) for t in s.get("tiers", []) if t["name"] in ("hbm", "host"))
                     / 2 ** 20, 1)

    def nvme_used(self):
        """Bytes the NVMe tier holds (kvtier's /v1/stats), else None."""
        if not self.kind.startswith("kvtier"):
            return None
        st, s = http("GET", self.url + "/v1/stats")
        return ([t.get("used_bytes") for t in s.get("tiers", []) if t["name"] == "nvme"] or [None])[0] \
            if st == 200 else None


def measure(e, history_words, n_decode, seed):
    res = {"engine": e.kind}
    res["startup_s"] = round(e.start(), 3)
    res["rss_idle"] = mem_of(e.proc.pid)
    msgs = [{"role": "user", "content": english(history_words, seed) + "\nSum that up in one line."}]
    dt, r = e.chat(msgs, 1, session="scale")
    res["turn1_s"], res["prompt_tokens"] = round(dt, 3), r["usage"]["prompt_tokens"]
    msgs += [{"role": "assistant", "content": r["choices"][0]["message"]["content"]},
             {"role": "user", "content": "And what is the single most important word in it?"}]
    dt, r = e.chat(msgs, 1, session="scale")
    res["cached_s"] = round(dt, 3)
    res["cached_tokens"] = (r["usage"].get("prompt_tokens_details") or {}).get("cached_tokens", 0)
    short = [{"role": "user", "content": "Count slowly from one to a hundred."}]
    e.chat(short, 1)  # once first, so the two timed replies find the same prompt cache (kvtier, llama-server)
    t1, _ = e.chat(short, 1)
    tn, r = e.chat(short, n_decode + 1)
    res["decode_tokens"] = r["usage"]["completion_tokens"]
    res["decode_tok_s"] = round((res["decode_tokens"] - 1) / max(tn - t1, 1e-9), 2)
    e.stop()
    res["restart_startup_s"] = round(e.start(), 3)
    dt, r = e.chat(msgs, 1, session="scale")
    res["restart_s"] = round(dt, 3)
    res["restart_cached_tokens"] = (r["usage"].get("prompt_tokens_details") or {}).get("cached_tokens", 0)
    res["rss_after"] = mem_of(e.proc.pid)
    res["kv_held_mib"] = e.kv_held()
    res["nvme_used_bytes"] = e.nvme_used()
    e.stop()
    return res


def prefill_once(e, words, seed, row):
    """One fresh prompt of about WORDS * 1.25 tokens, `max_tokens` 1: its prefill tok/s."""
    msgs = [{"role": "user", "content": english(words, seed) + "\nSum that up in one line."}]
    dt, r = e.chat(msgs, 1)
    n = r["usage"]["prompt_tokens"]
    cached = (r["usage"].get("prompt_tokens_details") or {}).get("cached_tokens", 0) or 0
    row["prefill"].append(round((n - cached) / max(dt, 1e-9), 2))
    row["prefill_s"].append(round(dt, 3))
    row["prompt_tokens"], row["prefill_cached_tokens"] = n, row.get("prefill_cached_tokens", []) + [cached]


def decode_rounds(engines, n_decode, rounds, prefill_words=0):
    """Decode tok/s of every engine, all started at once and measured in alternating rounds
    (the order rotates each round), so a slow spell of the shared machine hits each engine.
    With PREFILL_WORDS, each round first times a prompt new to every engine (prefill_once)."""
    short = [{"role": "user", "content": "Count slowly from one to a hundred."}]
    out = {}
    for e in engines:
        out[e.kind] = {"engine": e.kind, "startup_s": round(e.start(), 3), "decode": []}
        if prefill_words:
            out[e.kind].update(prefill=[], prefill_s=[])
        out[e.kind]["rss_idle"] = mem_of(e.proc.pid)
        e.chat(short, 1)  # once first, so the timed replies find the same prompt cache
    for r in range(rounds):
        order = engines[r % len(engines):] + engines[:r % len(engines)]
        for e in order:
            time.sleep(0.5)  # the other servers' workers settle
            if prefill_words:
                prefill_once(e, prefill_words, 1000 + r, out[e.kind])
                time.sleep(0.5)
            t1, _ = e.chat(short, 1)
            tn, rep = e.chat(short, n_decode + 1)
            n = rep["usage"]["completion_tokens"]
            if n != n_decode + 1:
                raise RuntimeError("%s generated %d tokens, not %d" % (e.kind, n, n_decode + 1))
            out[e.kind]["decode"].append(round((n - 1) / max(tn - t1, 1e-9), 2))
    for e in engines:
        d = sorted(out[e.kind]["decode"])
        out[e.kind]["decode_tok_s"] = d[len(d) // 2]
        if prefill_words:
            p = sorted(out[e.kind]["prefill"])
            out[e.kind]["prefill_tok_s"] = p[len(p) // 2]
        out[e.kind]["rss_after"] = mem_of(e.proc.pid)
        e.stop()
    return [out[e.kind] for e in engines]


def page_cache_fresh(model):
    """The model written back, dropped from the page cache and read once: in the cache for
    every engine alike, and in the large folios a read brings in. Pages left by a write stay
    4 KiB folios, and kvtier's mapping of them decoded ~6% slower (bench/README.md, tenth
    stop); llama-server, which copies its weights, does not see the difference."""
    fd = os.open(model, os.O_RDONLY)
    try:
        os.fsync(fd)
        os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
        while os.read(fd, 1 << 24):
            pass
    finally:
        os.close(fd)


def first_start_rounds(kinds, args, model, work, rounds):
    """startup_s of every engine on an empty data dir, in alternating rounds, medians."""
    starts, rss = {k: [] for k in kinds}, {}
    for r in range(rounds):
        for k in kinds[r % len(kinds):] + kinds[:r % len(kinds)]:
            d = tempfile.mkdtemp(prefix="first_", dir=work)
            e = Engine(k, args, model, d)
            try:
                starts[k].append(round(e.start(), 3))
                rss[k] = mem_of(e.proc.pid)
            finally:
                e.stop()
                shutil.rmtree(d, ignore_errors=True)
    return [{"engine": k, "first_starts": starts[k], "startup_s": statistics.median(starts[k]), "rss_after": rss[k]}
            for k in kinds]


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--build", default=os.path.join(ROOT, "build"))
    ap.add_argument("--shape", default="llama3.2-1b", choices=["llama3.2-1b", "llama3-8b"])
    ap.add_argument("--type", default="q8_0", choices=["q8_0", "q4_k_m"])
    ap.add_argument("--layers", type=int, default=0, help="fewer blocks of the same width (a quick run)")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--history", default="2048,8192", help="history lengths in tokens, comma-separated")
    ap.add_argument("--decode", type=int, default=64)
    ap.add_argument("--context", type=int, default=12288)
    ap.add_argument("--nvme", default="2G", help="[tier.nvme] capacity of kvtier's data dirs")
    ap.add_argument("--llama-server", default=None)
    ap.add_argument("--peer-no-repack", action="store_true",
                    help="run llama-server with -nr (no weight repacking into its CPU-specific layouts)")
    ap.add_argument("--engines", default=None, help="a subset of kvtier,kvtier-nocache,llama-server "
                    "(kvtier always; a long history's re-prefills take minutes each)")
    ap.add_argument("--model", default=None, help="use this GGUF of the shape (bench_shape_model's output) "
                    "instead of writing one")
    ap.add_argument("--tokenizer", default=os.path.join(ROOT, "models", "SmolLM2-135M-Instruct.Q4_1.gguf"))
    ap.add_argument("--activations", default="default", choices=["default", "int16", "int8"],
                    help="kvtier's [model] activations (default: no line, kvtier's own default)")
    ap.add_argument("--prefill-tokens", type=int, default=0, metavar="N",
                    help="with --decode-only: each round also times the prefill of a fresh ~N-token prompt")
    ap.add_argument("--alt-build", default=None, metavar="DIR",
                    help="add the engine kvtier-alt: DIR/kvtierd, same config, activations = int8")
    ap.add_argument("--decode-only", type=int, default=0, metavar="ROUNDS",
                    help="only decode tok/s (and start-up, idle RSS): every engine started at once, ROUNDS "
                    "alternating rounds of DECODE tokens on a short prompt, medians; no history turns")
    ap.add_argument("--first-start", type=int, default=0, metavar="ROUNDS",
                    help="only the start-up on an empty data dir (the model in the page cache): ROUNDS "
                    "alternating rounds, medians; no history turns")
    ap.add_argument("--out", default=None)
    args = ap.parse_args()
    args.build = os.path.abspath(args.build)
    kinds = ["kvtier", "kvtier-nocache"] + (["kvtier-alt"] if args.alt_build else []) \
        + (["llama-server"] if args.llama_server else [])
    if args.alt_build:
        args.alt_build = os.path.abspath(args.alt_build)
    if args.engines:
        want = args.engines.split(",")
        kinds.insert(1, "kvtier-f16nvme")  # only when asked: [tier.nvme] dtype = f16
        bad = [k for k in want if k not in kinds]
        if bad or "kvtier" not in want:
            ap.error("--engines: %s (choose from %s, kvtier among them)" % (",".join(bad) or "no kvtier",
                                                                             ",".join(kinds)))
        kinds = [k for k in kinds if k in want]
    load_start = os.getloadavg()
    peer_version = None
    if args.llama_server:
        v = subprocess.run([args.llama_server, "--version"], capture_output=True, text=True)
        peer_version = " ".join((v.stdout + v.stderr).split())[-200:]
    work = tempfile.mkdtemp(prefix="kvt_bench_scale_")
    rows = []
    try:
        if args.model:
            model = os.path.abspath(args.model)
        else:
            model = os.path.join(work, "%s-%s.gguf" % (args.shape, args.type))
            cmd = [os.path.join(args.build, "bench_shape_model"), args.shape, args.type, args.tokenizer, model]
            if args.layers:
                cmd += ["--layers", str(args.layers)]
            subprocess.run(cmd, check=True)
        page_cache_fresh(model)
        if args.decode_only:
            engines = [Engine(k, args, model, work) for k in kinds]
            try:
                rows = decode_rounds(engines, args.decode, args.decode_only, int(args.prefill_tokens * 0.8))
            finally:
                for e in engines:
                    e.stop()
            for row in rows:
                row["history"] = 0
                print(json.dumps(row), flush=True)
        if args.first_start:
            rows = first_start_rounds(kinds, args, model, work, args.first_start)
            for row in rows:
                row["history"] = 0
                print(json.dumps(row), flush=True)
        for h in [] if args.decode_only or args.first_start else [int(x) for x in args.history.split(",")]:
            words = int(h * 0.8)  # these words run about 1.25 tokens each with the SmolLM2 tokenizer
            for k in kinds:
                e = Engine(k, args, model, work)
                try:
                    row = measure(e, words, args.decode, seed=h)
                finally:
                    e.stop()
                row["history"] = h
                rows.append(row)
                print(json.dumps(row), flush=True)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    cpu = platform.processor() or platform.machine()
    try:
        with open("/proc/cpuinfo") as f:
            cpu = next(l.split(":", 1)[1].strip() for l in f if l.startswith("model name"))
    except (OSError, StopIteration):
        pass
    summary = {"machine": cpu, "cpus": os.cpu_count(), "peer_repack": not args.peer_no_repack,
               "decode_only_rounds": args.decode_only, "decode": args.decode,
               "prefill_tokens": args.prefill_tokens, "alt_build": args.alt_build,
               "llama_server": args.llama_server, "llama_server_version": peer_version,
               "loadavg_start": load_start, "loadavg_end": os.getloadavg(),
               "activations": args.activations,
               "model": os.path.basename(args.model) if args.model else None,
               "shape": None if args.model else args.shape, "type": None if args.model else args.type,
               "layers": args.layers or "all", "threads": args.threads,
               "rows": rows, "ratios": []}
    for h in sorted({r["history"] for r in rows}):
        by = {r["engine"]: r for r in rows if r["history"] == h}
        for peer in [k for k in kinds if k != "kvtier"]:
            a, b = by["kvtier"], by[peer]
            rat = {"history": h, "vs": peer}
            for f in ("startup_s", "turn1_s", "cached_s", "restart_s", "decode_tok_s", "prefill_tok_s"):
                if f in a:
                    rat[f] = round(a[f] / b[f], 3) if b[f] else None
            rat["rss_after"] = round(a["rss_after"]["VmRSS"] / b["rss_after"]["VmRSS"], 3)
            summary["ratios"].append(rat)
            print("history %d, kvtier / %s: %s" % (h, peer, json.dumps(rat)), flush=True)
    if args.out:
        with open(args.out, "w") as f:
            json.dump(summary, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
