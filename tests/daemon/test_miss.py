#!/usr/bin/env python3
"""tests/daemon/test_miss.py — every response explains its cache miss (usage.kvtier.miss),
on the default model and a real kvtierd (its own port and data dir, small tiers):

  reasons   two tenants (API keys) and an admin key. alice's first prompt is "new" at
            token 0; the same prompt again misses only its tail ("chunk_boundary" at
            the cached tokens); the prompt with one word changed half-way is
            "diverged" at the first token that differs, naming the stored token and
            the new one (the stored token is the one of alice's first prompt, the new
            one is this prompt's). bob sends alice's second prompt: "new" at 0, no
            token of alice's shown. /metrics counts each reason
            (kvtier_cache_misses_total), /v1/stats's engine.misses_by_reason (admin)
            agrees, bob's own /v1/stats shows no counts, and `kvtier stats` prints them
  evicted   tiny tiers: a prompt, then a flood of other prompts that pushes its
            blocks out of T0, T1 and T2; the prompt again is "evicted" from T2, with
            the pressure and the time it left
  corrupt   a prompt persisted (SIGTERM), its T2 records damaged on disk, the daemon
            restarted: the prompt again is "failed_verification" in T2, and nothing
            corrupt is served (cached_tokens 0)
  capacity  no NVMe tier and a 1 MiB host tier: a prompt's blocks are dropped before
            they were ever durable; the prompt again is "capacity" from the host tier
  model_changed  a session turn, then a restart with another server secret (the
            tenant salts change, as with another model or KV layout): the same
            history is "model_changed"
  (expired needs a retention TTL to run out: 5 minutes at least on the wire; it is
  shown on a real manager with its own clock in test_manager_miss)

Usage: test_miss.py BUILD_DIR [CASE ...]. Exit 0 pass, 1 fail, 77 skip (no model).
"""
import os
import subprocess
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from kvtierd_proc import Daemon, check, http, run_cases  # noqa: E402

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
MODEL = os.path.join(ROOT, "models", "SmolLM2-135M-Instruct.Q4_1.gguf")
KEYS = "api_keys = alice:key-a, bob:key-b\nadmin_keys = ops:key-o\n"
WORDS = ("river mountain forest ocean valley meadow harbor island desert canyon glacier prairie "
         "lagoon summit marsh delta plateau tundra reef orchard").split()


def text(seed, n_words=120):
    """A prompt of about n_words tokens; another seed gives another one from its first token."""
    return "Note %d: " % seed + " ".join(WORDS[(seed * 7 + i * 3 + i * i) % len(WORDS)] for i in range(n_words))


def daemon(build, data_dir, server="", tiers="64M", nvme="64M", context=2048):
    return Daemon(build, data_dir,
                  "[server]\nlisten = 127.0.0.1:0\n%s[model]\npath = %s\ndevice = cpu\ncontext = %d\n"
                  "[tier.hbm]\ncapacity = %s\n[tier.host]\ncapacity = %s\n[tier.nvme]\ncapacity = %s\n"
                  "[index]\ndata_dir = @DATA@\n" % (server, MODEL, context, tiers, tiers, nvme))


def complete(d, prompt, key=None):
    st, r = http("POST", d.url + "/v1/completions", {"prompt": prompt, "max_tokens": 1, "temperature": 0},
                 {"Authorization": "Bearer " + key} if key else {})
    if not check(st == 200, "completion: status %s: %s" % (st, r)):
        raise RuntimeError("request failed")
    return r["usage"]


def miss_of(u):
    return u.get("kvtier", {}).get("miss")


def tokenize(d, s):
    st, r = http("POST", d.url + "/tokenize", {"content": s, "add_special": False}, {"Authorization": "Bearer key-o"})
    check(st == 200, "tokenize: %s %s" % (st, r))
    return r["tokens"]


def metric(d, name, label):
    st, body = http("GET", d.url + "/metrics", headers={"Authorization": "Bearer key-o"})
    for line in body.splitlines():
        if line.startswith('%s{reason="%s"}' % (name, label)):
            return int(line.split()[-1])
    return None


def case_reasons(build, tmp):
    d = daemon(build, os.path.join(tmp, "d"), server=KEYS)
    d.start()
    try:
        p = text(1)
        words = p.split()
        words[60] = "volcano"
        q = " ".join(words)
        m = miss_of(complete(d, p, "key-a"))
        check(m and m["reason"] == "new" and m["at_token"] == 0, "alice's first prompt is new at 0: %s" % m)
        u = complete(d, p, "key-a")
        m = miss_of(u)
        check(u["prompt_tokens_details"]["cached_tokens"] > 0, "the same prompt again is cached: %s" % u)
        check(m and m["reason"] == "chunk_boundary" and m["at_token"] == u["prompt_tokens_details"]["cached_tokens"],
              "the same prompt misses only its tail: %s" % u)
        u = complete(d, q, "key-a")
        m = miss_of(u)
        tp, tq = tokenize(d, p), tokenize(d, q)
        first = next(i for i in range(min(len(tp), len(tq))) if tp[i] != tq[i])
        check(m and m["reason"] == "diverged" and m["at_token"] == first,
              "one word changed: diverged at token %d: %s" % (first, m))
        check(m and m.get("cached_token") == tp[first] and m.get("new_token") == tq[first],
              "diverged names the stored token %d and the new one %d: %s" % (tp[first], tq[first], m))
        m = miss_of(complete(d, q, "key-b"))  # bob: alice stored this very prompt, and nothing of it shows
        check(m and m["reason"] == "new" and m["at_token"] == 0 and "cached_token" not in m,
              "bob sees none of alice's: %s" % m)
        for reason, least in (("new", 2), ("chunk_boundary", 1), ("diverged", 1)):
            v = metric(d, "kvtier_cache_misses_total", reason)
            check(v is not None and v >= least, "/metrics counts %s: %s" % (reason, v))
        st, s = http("GET", d.url + "/v1/stats", headers={"Authorization": "Bearer key-o"})
        mb = s["engine"]["misses_by_reason"]
        check(mb["new"] >= 2 and mb["diverged"] >= 1 and mb["chunk_boundary"] >= 1, "/v1/stats: %s" % mb)
        st, s = http("GET", d.url + "/v1/stats", headers={"Authorization": "Bearer key-b"})
        check(st == 200 and "misses_by_reason" not in str(s), "a tenant's /v1/stats has no global miss counts")
        out = subprocess.run([os.path.join(build, "kvtier"), "stats", "--url", d.url, "--api-key", "key-o"],
                             capture_output=True, text=True, timeout=60).stdout
        check("cache misses" in out and "diverged" in out, "kvtier stats prints the misses:\n%s" % out)
    finally:
        d.stop()


def case_evicted(build, tmp):
    # T0 must hold one running request (context 512: 32 blocks of 360 KiB); T1 and T2 hold a few prompts
    d = daemon(build, os.path.join(tmp, "d"), tiers="16M", nvme="6M", context=512)
    d.start()
    try:
        p = text(2, 200)
        m = miss_of(complete(d, p))
        check(m and m["reason"] == "new", "first: new: %s" % m)
        for i in range(10):  # a flood of other prompts: each pushes older blocks down and out
            complete(d, text(100 + i, 200))
        u = complete(d, p)
        m = miss_of(u)
        check(m and m["reason"] == "evicted" and m["at_token"] == u["prompt_tokens_details"]["cached_tokens"],
              "the first prompt's blocks were evicted: %s" % u)
        check(m and m.get("tier") in ("hbm", "host", "nvme") and m.get("pressure") in ("watermark", "room")
              and abs(m.get("at", 0) - time.time()) < 600, "evicted says from where, why and when: %s" % m)
    finally:
        d.stop()


def case_corrupt(build, tmp):
    ddir = os.path.join(tmp, "d")
    d = daemon(build, ddir)
    d.start()
    p = text(3, 150)
    try:
        complete(d, p)
    finally:
        d.stop()  # SIGTERM: every block persisted
    t2 = os.path.join(ddir, "kvtier.t2")
    size = os.path.getsize(t2)
    with open(t2, "r+b") as f:  # past the two superblock units, a few bytes of every 4 KiB unit
        for off in range(8192, size, 4096):
            f.seek(off + 300)
            f.write(b"\xa5" * 16)
    d.start()
    try:
        u = complete(d, p)
        m = miss_of(u)
        check(u["prompt_tokens_details"]["cached_tokens"] == 0, "nothing corrupt is served: %s" % u)
        check(m and m["reason"] == "failed_verification" and m.get("tier") == "nvme",
              "the damaged record is named: %s" % m)
    finally:
        d.stop()


def case_capacity(build, tmp):
    # no NVMe tier and a tiny host tier: what T0 pushes out, T1 can keep only a moment, never durably
    d = daemon(build, os.path.join(tmp, "d"), tiers="16M", nvme="0", context=512)
    with open(d.conf) as f:
        conf = f.read().replace("[tier.host]\ncapacity = 16M", "[tier.host]\ncapacity = 1M")
    with open(d.conf, "w") as f:
        f.write(conf)
    d.start()
    try:
        p = text(4, 200)
        complete(d, p)
        for i in range(16):  # more than T0 and T1 hold together
            complete(d, text(200 + i, 200))
        u = complete(d, p)
        m = miss_of(u)
        check(m and m["reason"] == "capacity" and m.get("tier") == "host",
              "blocks dropped before they were ever durable: capacity, from the host tier: %s" % u)
    finally:
        d.stop()


def case_model_changed(build, tmp):
    # the same history under another chain root: here the server secret (tenant salts) changed
    ddir = os.path.join(tmp, "d")
    d = daemon(build, ddir, server="secret_file = @DATA@/secret-a\n")
    d.start()
    p = text(5, 150)
    body = {"prompt": p, "max_tokens": 1, "temperature": 0, "session_id": "s1"}
    try:
        st, r = http("POST", d.url + "/v1/completions", body)
        check(st == 200, "a session turn: %s %s" % (st, r))
    finally:
        d.stop()
    d = daemon(build, ddir, server="secret_file = @DATA@/secret-b\n")
    d.start()
    try:
        st, r = http("POST", d.url + "/v1/completions", body)
        m = miss_of(r["usage"]) if st == 200 else None
        check(m and m["reason"] == "model_changed" and m["at_token"] == 0,
              "the session's history hashed under another root: model_changed: %s %s" % (st, r))
    finally:
        d.stop()


CASES = {"reasons": case_reasons, "evicted": case_evicted, "corrupt": case_corrupt, "capacity": case_capacity,
         "model_changed": case_model_changed}

if __name__ == "__main__":
    sys.exit(run_cases("miss", __doc__, MODEL, CASES))
