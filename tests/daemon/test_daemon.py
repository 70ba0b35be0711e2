#!/usr/bin/env python3
"""tests/daemon/test_daemon.py — kvtierd end to end, on the default model.

Each case starts the real daemon (the build's kvtierd) on an ephemeral
loopback port with a temporary data dir and talks to it over HTTP:

  conversation   6 chat turns in one session: each turn's cached_tokens equals
                 the full blocks of the previous turn's prompt and reply
  kill9          kill -9 in the middle of a conversation, restart, `kvtier
                 resume`: the next turn is served from the persisted blocks and,
                 with fp16 tiers, says what an uninterrupted daemon says
  sigterm        SIGTERM with several sessions, restart: every session resumes
  tenants        two tenants, same prompt: 0 cached tokens across them (by
                 "user", and by API key)
  openai         the official openai client: completions, chat, streaming
  errors         malformed JSON, oversize body, unknown session, token ids out
                 of range, max_tokens out of range, wrong method, bad key:
                 4xx error objects, and the daemon keeps serving

Usage: test_daemon.py BUILD_DIR [CASE ...]. Exit 0 pass, 1 fail, 77 skip
(no model). Needs the `openai` package for the openai case (scripts/test.sh
installs it into .venv-test; KVT_TEST_STRICT=1 makes its absence a failure).
"""
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from kvtierd_proc import FAILS, Daemon, check, http  # noqa: E402

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
MODEL = os.path.join(ROOT, "models", "SmolLM2-135M-Instruct.Q4_1.gguf")
BT = 16


def daemon(build, data_dir, server="", extra=""):
    """A kvtierd on the default model, small tiers, an ephemeral port; server: more [server] keys."""
    return Daemon(build, data_dir,
                  "[server]\nlisten = 127.0.0.1:0\n%s[model]\npath = %s\ndevice = cpu\ncontext = 2048\n"
                  "[tier.hbm]\ncapacity = 256M\n[tier.host]\ncapacity = 256M\n%s[tier.nvme]\ncapacity = 256M\n"
                  "[index]\ndata_dir = @DATA@\n" % (server, MODEL, extra))


def chat(d, messages, session=None, max_tokens=24, user=None, key=None):
    body = {"messages": messages, "max_tokens": max_tokens, "temperature": 0}
    if session:
        body["session_id"] = session
    if user:
        body["user"] = user
    hdr = {"Authorization": "Bearer " + key} if key else {}
    st, r = http("POST", d.url + "/v1/chat/completions", body, hdr)
    if not check(st == 200, "chat: status %s: %s" % (st, r)):
        raise RuntimeError("chat failed")
    return r


USER_TURNS = [
    "Write two sentences about the sea.",
    "Now write two sentences about mountains.",
    "Which of the two do you prefer, and why?",
    "Name three animals that live in the sea.",
    "Name three animals that live in mountains.",
    "Summarize our conversation in one sentence.",
    "Thank you. One more sentence about rivers, please.",
]


def history_tokens(r):
    """Tokens the daemon keeps for a turn: prompt + reply (+ the end-of-turn token when it stopped)."""
    u = r["usage"]
    return u["prompt_tokens"] + u["completion_tokens"] + (1 if r["choices"][0]["finish_reason"] == "stop" else 0)


def converse(d, session, turns, msgs=None, expect_cached=True):
    """Run chat turns; check each turn's cached tokens against the previous turn's full blocks."""
    msgs = msgs if msgs is not None else []
    prev = None
    replies = []
    for text in turns:
        msgs.append({"role": "user", "content": text})
        r = chat(d, msgs, session=session)
        u = r["usage"]
        if prev is not None and expect_cached:
            want = history_tokens(prev) // BT * BT
            check(u["prompt_tokens_details"]["cached_tokens"] == want,
                  "%s turn %d: cached_tokens %d, expected %d (full blocks of the previous prompt and reply)"
                  % (session, len(replies), u["prompt_tokens_details"]["cached_tokens"], want))
        reply = r["choices"][0]["message"]["content"]
        msgs.append({"role": "assistant", "content": reply})
        replies.append(reply)
        prev = r
    return msgs, replies, prev


def case_conversation(build, tmp):
    d = daemon(build, tmp)
    d.start()
    try:
        msgs, replies, last = converse(d, "conv", USER_TURNS[:6])
        check(len(replies) == 6, "six turns")
        by = last["usage"]["kvtier"]["cached_tokens_by_tier"]
        check(sum(by.values()) == last["usage"]["prompt_tokens_details"]["cached_tokens"],
              "cached tokens by tier add up: %s" % by)
        st, s = http("GET", d.url + "/v1/stats")
        check(st == 200 and s["engine"]["cached_tokens"] > 0, "stats report cached tokens: %s" % s.get("engine"))
        check({t["name"] for t in s["tiers"]} == {"hbm", "host", "nvme"}, "stats has the three tiers")
        st, m = http("GET", d.url + "/metrics")
        check(st == 200 and "kvtier_prefix_cache_hits_tokens_total" in m and 'kvtier_tier_used_bytes{tier="nvme"}' in m,
              "metrics in Prometheus text")
    finally:
        check(d.stop() == 0, "SIGTERM exits 0")


def kvtier(build, *args):
    p = subprocess.run([os.path.join(build, "kvtier")] + list(args), capture_output=True, text=True, timeout=300)
    return p.returncode, p.stdout, p.stderr


def case_kill9(build, tmp):
    f16 = "dtype = f16\n"
    # the uninterrupted run
    a = daemon(build, os.path.join(tmp, "a"), extra=f16)
    a.start()
    try:
        msgs, _, _ = converse(a, "k9", USER_TURNS[:3])
        msgs.append({"role": "user", "content": USER_TURNS[3]})
        ref = chat(a, msgs, session="k9")
    finally:
        a.stop()
    # the interrupted one
    b = daemon(build, os.path.join(tmp, "b"), extra=f16)
    b.start()
    try:
        msgs, _, prev = converse(b, "k9", USER_TURNS[:3])
        time.sleep(1.5)  # end-of-turn write-through: durable within 1 s
        b.stop(signal.SIGKILL)
        b.restart()
        rc, out, err = kvtier(build, "resume", "k9", "--url", b.url, "--json")
        check(rc == 0, "kvtier resume exit %d: %s" % (rc, err))
        lines = [json.loads(l) for l in out.splitlines() if l.strip()]
        done = [l for l in lines if l.get("event") == "done"]
        full = history_tokens(prev) // BT * BT
        if check(len(done) == 1, "resume printed a final report: %s" % out):
            rep = done[0]
            restored = sum(rep["restored_tokens"].values())
            check(rep["restored_tokens"]["nvme"] == full and restored == full,
                  "resume after kill -9 restored %s tokens, expected %d from nvme" % (rep["restored_tokens"], full))
        msgs.append({"role": "user", "content": USER_TURNS[3]})
        r = chat(b, msgs, session="k9")
        check(r["usage"]["prompt_tokens_details"]["cached_tokens"] == full,
              "after kill -9: cached %d, expected %d" % (r["usage"]["prompt_tokens_details"]["cached_tokens"], full))
        check(r["choices"][0]["message"]["content"] == ref["choices"][0]["message"]["content"],
              "after kill -9 the reply differs from the uninterrupted run:\n%r\n%r"
              % (r["choices"][0]["message"]["content"], ref["choices"][0]["message"]["content"]))
        rc, out, err = kvtier(build, "fsck", "--data-dir", b.data_dir, "--dry-run")
        check(rc == 75 and "kvtierd pid %d" % b.proc.pid in err,
              "fsck beside the live daemon is refused (exit 75, naming it): %d %s" % (rc, err))
    finally:
        b.stop()
    rc, out, err = kvtier(build, "fsck", "--data-dir", b.data_dir)
    check(rc == 0, "fsck clean after the kill -9 run: %d %s %s" % (rc, out, err))


def case_sigterm(build, tmp):
    d = daemon(build, tmp)
    d.start()
    sessions = {}
    try:
        for i in range(3):
            _, _, prev = converse(d, "st%d" % i, [USER_TURNS[i], USER_TURNS[i + 1]])
            sessions["st%d" % i] = history_tokens(prev) // BT * BT
    finally:
        check(d.stop() == 0, "SIGTERM exits 0")
    rc, out, err = kvtier(build, "stats", "--offline", "--data-dir", tmp, "--json")
    check(rc == 0, "stats --offline: %d %s" % (rc, err))
    d.restart()
    try:
        st, lst = http("GET", d.url + "/v1/sessions")
        check(st == 200 and {s["id"] for s in lst["data"]} == set(sessions), "sessions listed after restart: %s" % lst)
        for sid, full in sessions.items():
            st, rep = http("POST", d.url + "/v1/sessions/%s/resume" % sid, {})
            check(st == 200 and sum(rep["restored_tokens"].values()) == full and rep["missing_tokens"] < BT + 2,
                  "session %s resumes %d tokens: %s" % (sid, full, rep))
        rc, out, err = kvtier(build, "stats", "--url", d.url, "--json")
        check(rc == 0 and json.loads(out)["tiers"][2]["name"] == "nvme", "kvtier stats --json: %d %s" % (rc, err))
        rc, out, err = kvtier(build, "sessions", "--url", d.url)
        check(rc == 0 and all(s in out for s in sessions), "kvtier sessions lists them: %s" % out)
    finally:
        d.stop()


def case_tenants(build, tmp):
    d = daemon(build, os.path.join(tmp, "user"))
    d.start()
    prompt = "The quick brown fox jumps over the lazy dog. " * 6
    try:
        body = {"prompt": prompt, "max_tokens": 4, "temperature": 0}
        st, a1 = http("POST", d.url + "/v1/completions", dict(body, user="alice"))
        st, a2 = http("POST", d.url + "/v1/completions", dict(body, user="alice"))
        st, b1 = http("POST", d.url + "/v1/completions", dict(body, user="bob"))
        check(a2["usage"]["prompt_tokens_details"]["cached_tokens"] > 0, "same tenant reuses: %s" % a2["usage"])
        check(b1["usage"]["prompt_tokens_details"]["cached_tokens"] == 0, "other tenant: 0 cached: %s" % b1["usage"])
    finally:
        d.stop()
    d = daemon(build, os.path.join(tmp, "keys"), server="api_keys = alice:key-a, bob:key-b\n")
    d.start()
    try:
        body = {"prompt": prompt, "max_tokens": 4, "temperature": 0}
        st, _ = http("POST", d.url + "/v1/completions", body)
        check(st == 401, "no key: 401 (got %s)" % st)
        for k in ("key-a", "key-a", "key-b"):
            st, r = http("POST", d.url + "/v1/completions", body, {"Authorization": "Bearer " + k})
            check(st == 200, "key %s: %s" % (k, st))
            if k == "key-b":
                check(r["usage"]["prompt_tokens_details"]["cached_tokens"] == 0, "key tenant isolation: %s" % r["usage"])
    finally:
        d.stop()


def case_openai(build, tmp):
    try:
        import openai
    except ImportError:
        if os.environ.get("KVT_TEST_STRICT") == "1":
            check(False, "the openai package is not installed")
        else:
            print("skip openai case: no openai package")
        return
    d = daemon(build, tmp)
    d.start()
    try:
        c = openai.OpenAI(base_url=d.url + "/v1", api_key="unused")
        models = c.models.list()
        check(len(models.data) == 1, "models.list: %s" % models)
        r = c.completions.create(model=models.data[0].id, prompt="The capital of France is", max_tokens=6, temperature=0)
        check("Paris" in r.choices[0].text, "completion says Paris: %r" % r.choices[0].text)
        check(r.usage.prompt_tokens > 0 and r.usage.completion_tokens == 6, "usage: %s" % r.usage)
        r = c.chat.completions.create(model=models.data[0].id, temperature=0, max_tokens=16,
                                      messages=[{"role": "user", "content": "What is the capital of France?"}])
        check("Paris" in r.choices[0].message.content, "chat says Paris: %r" % r.choices[0].message.content)
        check(r.usage.prompt_tokens_details is not None, "usage has prompt_tokens_details")
        chunks = list(c.chat.completions.create(model=models.data[0].id, temperature=0, max_tokens=16, stream=True,
                                                stream_options={"include_usage": True},
                                                messages=[{"role": "user", "content": "What is the capital of France?"}]))
        text = "".join(ch.choices[0].delta.content or "" for ch in chunks if ch.choices)
        check(text == r.choices[0].message.content, "streamed chat equals the plain one: %r vs %r"
              % (text, r.choices[0].message.content))
        check(chunks[-1].usage is not None and chunks[-1].usage.completion_tokens == r.usage.completion_tokens,
              "final usage chunk: %s" % chunks[-1])
        chunks = list(c.completions.create(model=models.data[0].id, prompt="The capital of France is", max_tokens=6,
                                           temperature=0, stream=True))
        check("Paris" in "".join(ch.choices[0].text for ch in chunks if ch.choices), "streamed completion")
    finally:
        d.stop()


def case_errors(build, tmp):
    d = daemon(build, tmp, server="max_body_bytes = 64K\nmax_tokens_limit = 512\n")
    d.start()
    u = d.url
    good = {"prompt": "Hello", "max_tokens": 2, "temperature": 0}
    cases = [
        ("malformed JSON", "POST", "/v1/completions", b'{"prompt": "x", ', 400),
        ("oversize body", "POST", "/v1/completions", json.dumps({"prompt": "x" * 100000}).encode(), 413),
        ("token id out of range", "POST", "/v1/completions", json.dumps({"prompt": [1, 2, 10 ** 7]}).encode(), 400),
        ("negative token id", "POST", "/v1/completions", json.dumps({"prompt": [1, -5]}).encode(), 400),
        ("max_tokens 0", "POST", "/v1/completions", json.dumps(dict(good, max_tokens=0)).encode(), 400),
        ("max_tokens over the limit", "POST", "/v1/completions", json.dumps(dict(good, max_tokens=100000)).encode(), 400),
        ("max_tokens not a number", "POST", "/v1/completions", json.dumps(dict(good, max_tokens="ten")).encode(), 400),
        ("no prompt", "POST", "/v1/completions", b"{}", 400),
        ("bad messages", "POST", "/v1/chat/completions", b'{"messages": "hi"}', 400),
        ("bad session id", "POST", "/v1/completions", json.dumps(dict(good, session_id="../x")).encode(), 400),
        ("unknown session resume", "POST", "/v1/sessions/nope/resume", b"{}", 404),
        ("unknown session delete", "DELETE", "/v1/sessions/nope", None, 404),
        ("unknown route", "GET", "/v1/nothing", None, 404),
        ("wrong method", "GET", "/v1/completions", None, 405),
    ]
    try:
        for what, method, path, raw, want in cases:
            st, r = http(method, u + path, raw=raw)
            ok = st == want and isinstance(r, dict) and isinstance(r.get("error"), dict) and \
                isinstance(r["error"].get("message"), str) and "type" in r["error"]
            check(ok, "%s: expected %d with an error object, got %s %r" % (what, want, st, r))
            st, r = http("POST", u + "/v1/completions", good)
            check(st == 200, "after %s the daemon still serves (%s)" % (what, st))
    finally:
        check(d.stop() == 0, "exit 0 after the error cases")


CASES = {"conversation": case_conversation, "kill9": case_kill9, "sigterm": case_sigterm,
         "tenants": case_tenants, "openai": case_openai, "errors": case_errors}


def main():
    if len(sys.argv) < 2:
        print(__doc__)
        return 2
    build = os.path.abspath(sys.argv[1])
    if not os.path.exists(MODEL):
        print("skip: no default model at", MODEL)
        return 77
    names = sys.argv[2:] or list(CASES)
    for name in names:
        tmp = tempfile.mkdtemp(prefix="kvt_daemon_%s_" % name)
        t = time.time()
        try:
            CASES[name](build, tmp)
        except Exception as e:  # a crash in a case is a failure of that case
            check(False, "%s: %s: %s" % (name, type(e).__name__, e))
        print("%s: %.1f s" % (name, time.time() - t), flush=True)
        if not FAILS:
            shutil.rmtree(tmp, ignore_errors=True)
    print("test_daemon: %d failure(s)" % len(FAILS))
    return 1 if FAILS else 0


if __name__ == "__main__":
    sys.exit(main())
