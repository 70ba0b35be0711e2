#!/usr/bin/env python3
"""tests/daemon/test_invariant_daemon.py — DESIGN invariant 1 through real daemons.

A reply served from the cache is the reply without it, bit for bit: on the shipped
defaults (int8 activations, [tier.nvme] dtype = f16), for each real model present
(the default SmolLM2-135M and Gemma 3 270M), the second turn of a conversation is
answered with greedy logprobs (each token's logprob and its top 3, as JSON doubles:
a float's every bit) by

  off        a kvtierd with the cache off (the reference: the whole prompt computed);
  t0         the cache-on kvtierd, its history's blocks in T0 (cached_tokens > 0);
  batched    the same again while 3 other requests of other lengths share its steps;
  restart    after SIGTERM and a new start: the history from NVMe's f16 records
             (cached_tokens_by_tier.nvme > 0, lossy_cached_tokens 0);
  other      a cache-on kvtierd with 1 thread instead of 2 and prompt chunks
             ([model] batch) of 32 instead of 256, its prefix cached in T0 too.

Every answer's tokens, logprobs and top logprobs must equal the reference's exactly.
tests/test_model_invariant.c checks the same promise inside one process, per kernel
path; this is it on the whole server (scheduler, tiers, restart), as a client sees it.

Usage: test_invariant_daemon.py BUILD_DIR [CASE ...]. Exit 0 pass, 1 fail, 77 skip.
"""
import os
import sys
import threading

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import test_daemon  # noqa: E402
from kvtierd_proc import SKIPS, Daemon, check, http, run_cases  # noqa: E402

ROOT = test_daemon.ROOT
MODELS = {"smollm2": os.path.join(ROOT, "models", "SmolLM2-135M-Instruct.Q4_1.gguf"),
          "gemma3": os.path.join(ROOT, "models", "gemma-3-270m-q4_k_m.gguf")}
N_TOKENS = 16


def conf(model, cache=True, threads=2, batch=256):
    return ("[server]\nlisten = 127.0.0.1:0\n[model]\npath = %s\ndevice = cpu\ncontext = 2048\nthreads = %d\n"
            "batch = %d\n[cache]\nenabled = %s\n[tier.hbm]\ncapacity = 256M\n[tier.host]\ncapacity = 128M\n"
            "[tier.nvme]\ncapacity = 128M\n[index]\ndata_dir = @DATA@\n"
            % (model, threads, batch, "true" if cache else "false"))


def ask(d, messages, session=None):
    body = {"messages": messages, "max_tokens": N_TOKENS, "temperature": 0, "logprobs": True, "top_logprobs": 3}
    if session:
        body["session_id"] = session
    st, r = http("POST", d.url + "/v1/chat/completions", body)
    if not check(st == 200, "chat: status %s: %s" % (st, r)):
        raise RuntimeError("chat failed")
    return r


def trace(r):
    """The reply as the bits a client sees: every token, its logprob and its top 3."""
    return [(c["token"], c["logprob"], [(t["token"], t["logprob"]) for t in c["top_logprobs"]])
            for c in r["choices"][0]["logprobs"]["content"]]


def same(name, what, ref, r):
    a, b = trace(ref), trace(r)
    if a == b:
        return True
    first = next((i for i, (x, y) in enumerate(zip(a, b)) if x != y), min(len(a), len(b)))
    return check(False, "%s, %s: the reply differs from the cache-off one at token %d:\n  off: %s\n  got: %s"
                 % (name, what, first, a[first] if first < len(a) else "(end)", b[first] if first < len(b) else "(end)"))


def others(d, out):
    """3 requests of other lengths, sent at once (they share the target's steps)."""
    prompts = ["Count from one to five.", "Write one long sentence about the history of bridges, ships and "
               "the people who built them, with as many details as you can.", "Hi."]
    def one(i):
        body = {"messages": [{"role": "user", "content": prompts[i]}], "max_tokens": 24 + 8 * i, "temperature": 0}
        out[i] = http("POST", d.url + "/v1/chat/completions", body)[0]
    ts = [threading.Thread(target=one, args=(i,)) for i in range(3)]
    for t in ts:
        t.start()
    return ts


def run_model(build, tmp, name):
    model = MODELS[name]
    if not os.path.exists(model):
        print("skip %s: no model at %s" % (name, model))
        SKIPS.append("%s: no model" % name)
        return
    on = Daemon(build, os.path.join(tmp, "on"), conf(model))
    off = Daemon(build, os.path.join(tmp, "off"), conf(model, cache=False))
    other = Daemon(build, os.path.join(tmp, "other"), conf(model, threads=1, batch=32))
    u1 = [{"role": "system", "content": "You are a helpful assistant. Answer in plain sentences."},
          {"role": "user", "content": "Write three sentences about lighthouses and the people who kept them."}]
    on.start()
    try:
        a1 = ask(on, u1, session="inv")["choices"][0]["message"]["content"]
        m2 = u1 + [{"role": "assistant", "content": a1}, {"role": "user", "content": "Now say the same about canals."}]
        off.start()
        try:
            ref = ask(off, m2)
        finally:
            check(off.stop() == 0, "the cache-off daemon exits 0")
        r = ask(on, m2)
        check(r["usage"]["prompt_tokens_details"]["cached_tokens"] > 0, "%s t0: the history is cached" % name)
        same(name, "t0", ref, r)
        out = [None] * 3
        ts = others(on, out)
        r = ask(on, m2)
        for t in ts:
            t.join()
        check(out == [200] * 3, "%s: the 3 other requests answered: %s" % (name, out))
        same(name, "batched with 3 others", ref, r)
        check(on.stop() == 0, "SIGTERM exits 0")
        on.start()
        r = ask(on, m2)
        k = r["usage"]["kvtier"]
        check(k["cached_tokens_by_tier"]["nvme"] > 0 and k["lossy_cached_tokens"] == 0,
              "%s restart: the history from NVMe's f16 records, none lossy: %s" % (name, k))
        same(name, "after a restart (NVMe f16)", ref, r)
    finally:
        on.stop()
    other.start()
    try:
        ask(other, u1)
        r = ask(other, m2)
        check(r["usage"]["prompt_tokens_details"]["cached_tokens"] > 0, "%s other: the history is cached" % name)
        same(name, "1 thread, prompt chunks of 32", ref, r)
    finally:
        check(other.stop() == 0, "SIGTERM exits 0")


def case_smollm2(build, tmp):
    run_model(build, tmp, "smollm2")


def case_gemma3(build, tmp):
    run_model(build, tmp, "gemma3")


if __name__ == "__main__":
    cases = {"smollm2": case_smollm2, "gemma3": case_gemma3}
    sys.exit(run_cases("invariant_daemon", __doc__, MODELS["smollm2"], cases))
