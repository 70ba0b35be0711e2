"""tests/daemon/test_startup.py — kvtierd's start-up and memory on the CPU backend, on the default model.

  rate     no forward pass before the daemon is ready: the prefill rate is measured from
           the first real prefills and kept in DATA_DIR/prefill.rate (the model's
           fingerprint, the CPU, the device); a restart uses it (a resume reports the
           prefill time it avoided with no prefill in the new run); a damaged file is
           ignored with a warning, one for another device (other threads) with a note,
           and neither stops the start; the next measurement writes a good file again
  memory   default tier sizes (auto): T0 is sized from the context and batch limits
           (one full context and a prefill chunk per running request), the host tier
           is not locked, the weights are the model file's pages; idle RSS <= weights +
           300 MiB, and after a workload <= weights + the KV held in T0/T1 + 300 MiB;
           /v1/stats reports the same (memory) and the NVMe tier's capacity in blocks,
           and `kvtier stats` shows both

Usage: test_startup.py BUILD_DIR [CASE ...]. Exit 0 pass, 1 fail, 77 skip (no model).
"""
import os
import re
import subprocess
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from kvtierd_proc import Daemon, check, http, proc_status, run_cases  # noqa: E402

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
MODEL = os.path.join(ROOT, "models", "SmolLM2-135M-Instruct.Q4_1.gguf")
MIB = 1 << 20
WORDS = "the quick brown fox jumps over the lazy dog while a cat sleeps on a warm mat by the door".split()


def conf(threads=2, tiers=""):
    return ("[server]\nlisten = 127.0.0.1:0\n[model]\npath = %s\ndevice = cpu\nthreads = %d\n%s"
            "[tier.nvme]\ncapacity = 64M\n[index]\ndata_dir = @DATA@\n" % (MODEL, threads, tiers))


def chat(d, session, text, max_tokens=4):
    body = {"messages": [{"role": "user", "content": text}], "max_tokens": max_tokens, "temperature": 0}
    if session:
        body["session_id"] = session
    st, r = http("POST", d.url + "/v1/chat/completions", body)
    if not check(st == 200, "chat: status %s: %s" % (st, r)):
        raise RuntimeError("chat failed")
    return r


def text_of(i, n_words):
    return "%d: " % i + " ".join(WORDS[(i + k) % len(WORDS)] for k in range(n_words))


def log_of_last_start(d):
    """The log lines of the latest start, up to its "ready"."""
    log = d._log()
    start = log.rfind("listening on")
    start = log.rfind("\n", 0, start) + 1
    end = log.find("ready", start)
    return log[start:end if end >= 0 else len(log)]


def resume_avoided(d, session):
    st, r = http("POST", d.url + "/v1/sessions/%s/resume" % session, {})
    check(st == 200, "resume %s: status %s: %s" % (session, st, r))
    return r.get("prefill_seconds_avoided", 0) if st == 200 else 0


def fp_version_of_last_start(d):
    m = re.findall(r"model fingerprint v(\d) ([0-9a-f]{16})", log_of_last_start(d))
    return (int(m[-1][0]), m[-1][1]) if m else (0, "")


def case_fingerprint(build, tmp):
    text = text_of(3, 300)
    data = os.path.join(tmp, "old")
    d = Daemon(build, data, conf(tiers="fingerprint = v1\n"))
    d.start()
    try:
        v1 = fp_version_of_last_start(d)
        check(v1[0] == 1, "fingerprint = v1 started with %s" % (v1,))
        chat(d, "fp", text)
    finally:
        d.stop()
    cache = os.path.join(data, "fingerprint.cache")

    def restart_finds_kv(what, conf_text):
        d = Daemon(build, data, conf_text)
        d.start()
        try:
            got = fp_version_of_last_start(d)
            check(got == v1, "%s: started with fingerprint %s, the data dir's is %s" % (what, got, v1))
            u = chat(d, "fp", text)["usage"]
            print("%s: fingerprint v%d %s, cached_tokens %d of %d" % (what, got[0], got[1],
                  u["prompt_tokens_details"]["cached_tokens"], u["prompt_tokens"]))
            check(u["prompt_tokens_details"]["cached_tokens"] >= 256,
                  "%s: the KV stored under version 1 was not found: %s" % (what, u))
            return log_of_last_start(d)
        finally:
            d.stop()

    # auto: the version the NVMe tier was stored under, from the cache (nothing hashed)
    restart_finds_kv("auto, cached", conf())
    check(open(cache).read().startswith("kvtfp1 ") and "kvtfp2" not in open(cache).read(),
          "fingerprint.cache after an auto start on a version 1 dir: %r" % open(cache).read())
    # auto without the cache: hashed again, version 2 differs, version 1 matches and is kept
    os.unlink(cache)
    boot = restart_finds_kv("auto, no cache", conf())
    check("by its version 1 fingerprint (stored before version 2); kept" in boot,
          "the version 1 dir was not reported as kept:\n" + boot)
    lines = sorted(l.split()[0] for l in open(cache).read().splitlines())
    check(lines == ["kvtfp1", "kvtfp2"], "fingerprint.cache holds %s" % lines)

    # forced v2 on it: refused, naming both fingerprints and the way out
    d = Daemon(build, data, conf(tiers="fingerprint = v2\n"))
    try:
        d.start(timeout=60)
        check(False, "fingerprint = v2 started on a data dir stored under version 1")
    except RuntimeError:
        pass
    rc = d.proc.poll() if d.proc else None
    d.stop()
    check(rc == 78, "the refusal exited %s, not EX_CONFIG (78)" % rc)
    log = d._log()
    check("model.fingerprint v2" in log and v1[1] in log and "fingerprint = auto" in log,
          "the refusal does not name both fingerprints and the fix:\n" + log[-1500:])

    # kvtier rebuild-index --model: the superblock's version is the one checked (the index comes back
    # from the records and the KV is found again); another model's file is refused
    kvtier = os.path.join(build, "kvtier")
    p = subprocess.run([kvtier, "rebuild-index", "--data-dir", data, "--model", MODEL], capture_output=True,
                       text=True, timeout=300)
    check(p.returncode == 0 and "rebuild-index" in p.stdout,
          "rebuild-index --model on a version 1 dir: exit %d: %s %s" % (p.returncode, p.stdout, p.stderr))
    restart_finds_kv("auto, after rebuild-index", conf())
    other = os.path.join(tmp, "other.gguf")
    with open(MODEL, "rb") as f:
        blob = bytearray(f.read())
    blob[len(blob) // 2] ^= 0x40  # a weight byte: another model
    with open(other, "wb") as f:
        f.write(blob)
    p = subprocess.run([kvtier, "rebuild-index", "--data-dir", data, "--model", other], capture_output=True,
                       text=True, timeout=300)
    check(p.returncode == 1 and "another model" in p.stderr,
          "rebuild-index --model with another model: exit %d: %s" % (p.returncode, p.stderr))
    restart_finds_kv("auto, after the refused rebuild", conf())
    # both superblock copies gone: the records name the model (version 1 here), and --model is
    # checked against them after the salvage, in either version
    t2 = os.path.join(data, "kvtier.t2")
    for model, want in ((other, 1), (MODEL, 0)):
        with open(t2, "r+b") as f:
            f.write(b"\0" * 8192)
        p = subprocess.run([kvtier, "rebuild-index", "--data-dir", data, "--model", model], capture_output=True,
                           text=True, timeout=300)
        check(p.returncode == want and (want == 0 or "records hold KV of another model" in p.stderr),
              "rebuild-index --model %s with no superblock: exit %d: %s" % (model, p.returncode, p.stderr))
    os.unlink(other)
    restart_finds_kv("auto, after the salvage", conf())

    # a new data dir: version 2
    d = Daemon(build, os.path.join(tmp, "new"), conf())
    d.start()
    try:
        check(fp_version_of_last_start(d)[0] == 2, "a new data dir started with %s" % (fp_version_of_last_start(d),))
    finally:
        d.stop()


def case_rate(build, tmp):
    rate_file = os.path.join(tmp, "prefill.rate")
    d = Daemon(build, tmp, conf())
    d.start()
    try:
        boot = log_of_last_start(d)
        check("prefill rate" not in boot, "a fresh start measured or read a prefill rate before ready:\n" + boot)
        check(not os.path.exists(rate_file), "prefill.rate exists before any prefill")
        # real prefills until 0.5 s of them are measured (a few long prompts on the default model)
        for i in range(40):
            chat(d, "s%d" % i, text_of(i, 600))
            if os.path.exists(rate_file):
                break
        if not check(os.path.exists(rate_file), "no prefill.rate after 40 prompts of ~700 tokens"):
            return
        lines = open(rate_file).read().splitlines()
        check(len(lines) == 5 and lines[0] == "kvtier prefill rate 1" and re.fullmatch(r"model [0-9a-f]{64}", lines[1])
              and lines[2].startswith("cpu ") and lines[3].startswith("device cpu (2 threads")
              and re.fullmatch(r"rate [0-9.]+", lines[4]) and float(lines[4].split()[1]) > 0,
              "prefill.rate: %r" % lines)
        check("sched: prefill rate measured:" in d._log(), "the measurement is not logged")
    finally:
        d.stop()

    # a restart reads it: a resume before any prefill of this run reports the time it avoided
    d.start()
    try:
        boot = log_of_last_start(d)
        check(re.search(r"sched: prefill rate [0-9]+ tokens/s \(kept in .*prefill\.rate\)", boot),
              "the restart did not use the kept rate:\n" + boot)
        check(resume_avoided(d, "s0") > 0, "a resume right after the restart reports no prefill time avoided")
    finally:
        d.stop()

    # damaged: ignored with a warning, the start goes on
    good = open(rate_file).read()
    for junk in (b"kvtier prefill rate 1\nmodel zz\n", b"\x00\xff" * 300, good.replace("rate ", "rate -").encode(),
                 good.encode() + b"extra line\n"):
        with open(rate_file, "wb") as f:
            f.write(junk)
        d.start()
        try:
            boot = log_of_last_start(d)
            check("ignored, measuring the rate from the first prefills" in boot and "kept in" not in boot,
                  "a damaged prefill.rate (%r) was not reported and ignored:\n%s" % (junk[:40], boot))
        finally:
            d.stop()

    # another device (1 thread): not used, said so; the next measurement writes this device's rate
    with open(rate_file, "w") as f:
        f.write(good)
    d1 = Daemon(build, tmp, conf(threads=1))
    d1.start()
    try:
        boot = log_of_last_start(d1)
        check("measured for another device" in boot and "kept in" not in boot,
              "a rate measured with 2 threads was used with 1:\n" + boot)
        for i in range(40):
            chat(d1, None, text_of(100 + i, 600))
            if "device cpu (1 thread," in open(rate_file).read():
                break
        check("device cpu (1 thread," in open(rate_file).read(), "the 1-thread daemon did not keep its rate")
    finally:
        d1.stop()


def case_memory(build, tmp):
    d = Daemon(build, tmp, conf())
    d.start()
    try:
        st, s = http("GET", d.url + "/v1/stats")
        if not check(st == 200 and "memory" in s, "/v1/stats has no memory report: %s %.300s" % (st, s)):
            return
        mem, tiers = s["memory"], {t["name"]: t for t in s["tiers"]}
        w = mem["weight_bytes"]
        check(w > 90 * MIB and mem["weight_mapped_bytes"] >= w * 9 // 10,
              "weights %d bytes, %d mapped from the file" % (w, mem["weight_mapped_bytes"]))
        # FilePmdMapped, as the kernel reports it: a part of the file pages, in whole 2 MiB pages
        huge = mem.get("rss_file_huge_bytes", -1)
        check(0 <= huge <= mem["rss_file_bytes"] and huge % (2 * MIB) == 0,
              "rss_file_huge_bytes %d of %d file bytes" % (huge, mem["rss_file_bytes"]))
        # T0 auto: context 4096 (258 blocks of 16 with the 2 spare) + 16 running x 256-token chunks (256 blocks)
        check(tiers["hbm"]["capacity_blocks"] == 258 + 256,
              "hbm auto holds %d blocks, expected 514" % tiers["hbm"]["capacity_blocks"])
        check("tier.hbm capacity auto on cpu" in d._log(), "the T0 auto size is not logged")
        nv = tiers["nvme"]
        record = tiers["host"]["capacity_bytes"] // tiers["host"]["capacity_blocks"]  # a block's packed bytes
        check(0 < nv["capacity_blocks"] and nv["capacity_blocks"] * record <= nv["capacity_bytes"],
              "nvme capacity_blocks %d (capacity %d bytes, %d-byte blocks)"
              % (nv["capacity_blocks"], nv["capacity_bytes"], record))
        idle = proc_status(d.proc.pid)
        print("idle:", idle, "weights", w)
        check(idle.get("VmLck", 0) == 0, "an idle daemon locks %d bytes" % idle.get("VmLck", 0))
        check(idle["VmRSS"] <= w + 300 * MIB, "idle RSS %d MiB > weights %d MiB + 300 MiB"
              % (idle["VmRSS"] // MIB, w // MIB))
        check(abs(mem["rss_bytes"] - idle["VmRSS"]) < 64 * MIB and mem["locked_bytes"] == 0,
              "/v1/stats memory %s against /proc %s" % (mem, idle))

        for i in range(8):  # 8 sessions of two turns: KV comes to be held in T0 and T1
            r = chat(d, "m%d" % i, text_of(i, 250), max_tokens=8)
            chat(d, "m%d" % i, text_of(i, 250) + " " + r["choices"][0]["message"]["content"] + " and then?",
                 max_tokens=8)
        busy = proc_status(d.proc.pid)
        st, s = http("GET", d.url + "/v1/stats")
        mem = s["memory"]
        kv = mem["kv_held_bytes"]
        tiers = {t["name"]: t for t in s["tiers"]}
        print("after the workload:", busy, "kv held", kv)
        check(kv == tiers["hbm"]["used_bytes"] + tiers["host"]["used_bytes"] and kv > 0,
              "kv_held_bytes %d, tiers hold %d + %d" % (kv, tiers["hbm"]["used_bytes"], tiers["host"]["used_bytes"]))
        check(busy["VmRSS"] <= w + kv + 300 * MIB, "RSS after a workload %d MiB > weights %d + KV %d + 300 MiB"
              % (busy["VmRSS"] // MIB, w // MIB, kv // MIB))
        check(mem["other_bytes"] == mem["rss_bytes"] - w - kv, "other_bytes: %s" % mem)

        p = subprocess.run([os.path.join(build, "kvtier"), "stats", "--url", d.url], capture_output=True, text=True,
                           timeout=60)
        check(p.returncode == 0, "kvtier stats: exit %d: %s" % (p.returncode, p.stderr))
        row = next((l for l in p.stdout.splitlines() if l.strip().startswith("blocks")), "")
        check(len(re.findall(r"\d+ / \d+", row)) == 3, "kvtier stats: not every tier's blocks show a capacity: %r"
              % row)
        check(re.search(r"RSS +[0-9.]+ [KMG]i?B \(anonymous", p.stdout) and "KV held in hbm and host" in p.stdout
              and re.search(r"file [0-9.]+ [KMG]i?B of which [0-9.]+ [KMG]?i?B in 2 MiB pages", p.stdout),
              "kvtier stats shows no memory lines:\n" + p.stdout)
    finally:
        d.stop()


CASES = {"rate": case_rate, "memory": case_memory, "fingerprint": case_fingerprint}

if __name__ == "__main__":
    sys.exit(run_cases("startup", __doc__, MODEL, CASES))
