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
                 "user", and by API key); a user mapped from an email and the
                 literal names its mapping is or once was are three tenants
  openai         the official openai client: completions, chat, streaming
  compat         what OpenAI accepts and how it refuses, through the openai client
                 and litellm: a prompt over the context is 400
                 context_length_exceeded (litellm: ContextWindowExceededError),
                 a max_tokens that does not fit is refused on max_tokens (not that
                 error); a NUL in an object key, top_p 0 (greedy), prompt null;
                 reasoning_effort as other tools send it (none, xhigh); /v1/models
                 reports max_model_len
  noqueue        [server] max_queue = 0 starts, serves, and refuses a request
                 beyond max_running with 503 overloaded until a place is free
  errors         malformed JSON, oversize body, unknown session, token ids out
                 of range, max_tokens out of range, wrong method, bad key:
                 4xx error objects, and the daemon keeps serving
  t2owner        two daemons, two data dirs, one [tier.nvme] path: the second
                 is refused while the first runs (locked) and after it stopped
                 (another index's file); then the file emptied under the
                 first: it starts, says what was lost, and sessions, stats and
                 resume count the blocks as missing
  blocksize      cache.block_tokens 16 -> 32 -> 16: every start works, and the
                 16-token session resumes from NVMe at the end
  frontdoor      X-Request-Id on every response (the client's when sane), in
                 the access log and in error bodies; CORS for server.cors_origins
                 only; every /metrics family is documented in docs/http-api.md;
                 200 idle connections from 127.0.0.1 do not keep a chat from it
                 waiting (the default 64 per address)
  chunks         chunk reuse: two documents marked {"kvtier": {"reuse": "anywhere"}}
                 sent in one order, then the other: the second reuses their
                 chunk blocks (chunk_reused_tokens > 0, never in cached_tokens);
                 at kvtier.chunk_recompute 1 the reply is a plain prefill's;
                 after a SIGTERM and a restart the chunks are found again (NVMe)

Usage: test_daemon.py BUILD_DIR [CASE ...]. Exit 0 pass, 1 fail, 77 skip
(no model). Needs the `openai` package for the openai and compat cases and
`litellm` for compat (scripts/test.sh installs them into .venv-test;
KVT_TEST_STRICT=1 makes their absence a failure).
"""
import json
import re
import os
import signal
import subprocess
import sys
import tempfile
import time
import urllib.request

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from kvtierd_proc import SKIPS, Daemon, check, http, run_cases  # noqa: E402

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
MODEL = os.path.join(ROOT, "models", "SmolLM2-135M-Instruct.Q4_1.gguf")
BT = 16


def daemon(build, data_dir, server="", extra="", model=""):
    """A kvtierd on the default model, small tiers, an ephemeral port; server: more [server] keys, model: [model]."""
    return Daemon(build, data_dir,
                  "[server]\nlisten = 127.0.0.1:0\n%s[model]\npath = %s\ndevice = cpu\ncontext = 2048\n%s"
                  "[tier.hbm]\ncapacity = 256M\n[tier.host]\ncapacity = 256M\n%s[tier.nvme]\ncapacity = 256M\n"
                  "[index]\ndata_dir = @DATA@\n" % (server, MODEL, model, extra))


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
        full = history_tokens(prev) // BT * BT
        # the session row says how far its blocks are durable: all of them once the write-through has landed
        durable, t_end = -1, time.time() + 60
        while durable != full and time.time() < t_end:
            st, lst = http("GET", b.url + "/v1/sessions")
            durable = ([s.get("durable_tokens", -1) for s in lst.get("data", []) if s["id"] == "k9"] or [-1])[0]
            if durable != full:
                time.sleep(0.05)
        check(durable == full, "the session row says %d tokens durable, the turn's blocks hold %d" % (durable, full))
        b.stop(signal.SIGKILL)
        b.restart()
        rc, out, err = kvtier(build, "resume", "k9", "--url", b.url, "--json")
        check(rc == 0, "kvtier resume exit %d: %s" % (rc, err))
        lines = [json.loads(l) for l in out.splitlines() if l.strip()]
        done = [l for l in lines if l.get("event") == "done"]
        if check(len(done) == 1, "resume printed a final report: %s" % out):
            rep = done[0]
            restored = sum(rep["restored_tokens"].values())
            check(rep["restored_tokens"]["nvme"] == full and restored == full,
                  "resume after kill -9 restored %s tokens, expected %d from nvme" % (rep["restored_tokens"], full))
            check(rep.get("durable_tokens") == full and rep.get("durable_lost_tokens") == 0,
                  "resume after kill -9: the row says %s durable (%s lost), expected %d"
                  % (rep.get("durable_tokens"), rep.get("durable_lost_tokens"), full))
        rc, out, err = kvtier(build, "resume", "k9", "--url", b.url)
        check(rc == 0 and "durable on NVMe" in out and str(full) in out, "kvtier resume says what is durable: %s" % out)
        msgs.append({"role": "user", "content": USER_TURNS[3]})
        r = chat(b, msgs, session="k9")
        check(r["usage"]["prompt_tokens_details"]["cached_tokens"] == full,
              "after kill -9: cached %d, expected %d" % (r["usage"]["prompt_tokens_details"]["cached_tokens"], full))
        check(r["choices"][0]["message"]["content"] == ref["choices"][0]["message"]["content"],
              "after kill -9 the reply differs from the uninterrupted run:\n%r\n%r"
              % (r["choices"][0]["message"]["content"], ref["choices"][0]["message"]["content"]))
        check(r["usage"]["kvtier"]["lossy_cached_tokens"] == 0,
              "an f16 host tier serves no lossy tokens: %s" % r["usage"]["kvtier"])
        rc, out, err = kvtier(build, "fsck", "--data-dir", b.data_dir, "--dry-run")
        check(rc == 75 and "kvtierd pid %d" % b.proc.pid in err,
              "fsck beside the live daemon is refused (exit 75, naming it): %d %s" % (rc, err))
    finally:
        b.stop()
    rc, out, err = kvtier(build, "fsck", "--data-dir", b.data_dir)
    check(rc == 0, "fsck clean after the kill -9 run: %d %s %s" % (rc, out, err))
    # f16 tiers: the reply served from the cache after the restart is the one with the cache off, bit for bit
    c = daemon(build, os.path.join(tmp, "c"), extra=f16 + "[cache]\nenabled = false\n")
    c.start()
    try:
        off = chat(c, msgs)
        check(off["usage"]["prompt_tokens_details"]["cached_tokens"] == 0, "cache off: nothing cached")
        check(off["choices"][0]["message"]["content"] == r["choices"][0]["message"]["content"],
              "f16: the reply from NVMe after kill -9 differs from the cache-off one:\n%r\n%r"
              % (r["choices"][0]["message"]["content"], off["choices"][0]["message"]["content"]))
    finally:
        c.stop()


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
        # a mapped name (from a free-form user) and a literal one never meet: neither the name the
        # email's mapping once was, nor the mapped name itself sent as a user, shares its cache
        st, m1 = http("POST", d.url + "/v1/completions", dict(body, user="ann@example.com"))
        st, m2 = http("POST", d.url + "/v1/completions", dict(body, user="ann@example.com"))
        check(m2["usage"]["prompt_tokens_details"]["cached_tokens"] > 0, "the email's tenant reuses: %s" % m2["usage"])
        mapped = re.findall(r"http POST /v1/completions 200 tenant=(\S+)", open(d.log).read())[-1]
        check(mapped == "_u.ann_example.com-71d4f55f72fa128dfb468a1a3901507c", "the email's tenant: %s" % mapped)
        for literal in ("ann_example.com-71d4f55f72fa128d", mapped):
            st, r = http("POST", d.url + "/v1/completions", dict(body, user=literal))
            check(st == 200 and r["usage"]["prompt_tokens_details"]["cached_tokens"] == 0,
                  "user %s shares the cache of ann@example.com: %s" % (literal, r.get("usage")))
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
    # NOTE: int16 activations here: with the default int8 SmolLM2-135M answers this chat question
    # in French ("L'Etoile, ..."; the int8 kernels before issue 49 did too), and the case checks the
    # client's round trip on a known answer, not the activation mode.
    d = daemon(build, tmp, model="activations = int16\n")
    d.start()
    try:
        c = openai.OpenAI(base_url=d.url + "/v1", api_key="unused")
        models = c.models.list()
        check(len(models.data) == 1, "models.list: %s" % models)
        m = c.models.retrieve(models.data[0].id)
        check(m.id == models.data[0].id and m.object == "model", "models.retrieve: %s" % m)
        r = c.completions.create(model=models.data[0].id, prompt="The capital of France is", max_tokens=6, temperature=0)
        check("Paris" in r.choices[0].text, "completion says Paris: %r" % r.choices[0].text)
        check(r.usage.prompt_tokens > 0 and r.usage.completion_tokens == 6, "usage: %s" % r.usage)
        r = c.chat.completions.create(model=models.data[0].id, temperature=0, max_tokens=16,
                                      messages=[{"role": "user", "content": "What is the capital of France?"}])
        check("Paris" in r.choices[0].message.content, "chat says Paris: %r" % r.choices[0].message.content)
        check(r.usage.prompt_tokens_details is not None, "usage has prompt_tokens_details")
        check(r.choices[0].message.refusal is None and "refusal" in r.choices[0].message.model_fields_set,
              "message.refusal is sent, null: %s" % r.choices[0].message)
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


def optional_module(name, case):
    """The module, or None (a failure under KVT_TEST_STRICT=1, else a note) when it is not installed."""
    try:
        return __import__(name)
    except ImportError:
        if os.environ.get("KVT_TEST_STRICT") == "1":
            check(False, "the %s package is not installed" % name)
        else:
            print("skip part of the %s case: no %s package" % (case, name))
        return None


def case_compat(build, tmp):
    openai = optional_module("openai", "compat")
    os.environ["LITELLM_LOCAL_MODEL_COST_MAP"] = "True"  # no network: litellm's bundled model map
    litellm = optional_module("litellm", "compat")
    if litellm is not None:
        litellm.suppress_debug_info = True
    if openai is None:
        return
    d = daemon(build, tmp)
    d.start()
    try:
        c = openai.OpenAI(base_url=d.url + "/v1", api_key="unused", max_retries=0)
        model = c.models.list().data[0]
        check((model.model_extra or {}).get("max_model_len") == 2048, "models.list: max_model_len %s" % model)
        st, r = http("GET", d.url + "/v1/models/" + model.id)
        check(st == 200 and r.get("max_model_len") == 2048, "/v1/models/{id}: %s %s" % (st, r))
        long_text = "word " * 3000
        q = [{"role": "user", "content": "What is the capital of France?"}]

        # a prompt over the context: OpenAI's error, on the prompt's field
        def refusal(fn, **kw):
            try:
                fn(**kw)
            except openai.BadRequestError as e:
                return e
            check(False, "%s: accepted" % sorted(kw))
            return None
        e = refusal(c.chat.completions.create, model=model.id, max_tokens=4,
                    messages=[{"role": "user", "content": long_text}])
        if e is not None:
            check(e.status_code == 400 and e.code == "context_length_exceeded" and e.param == "messages",
                  "chat over the context: %s %s %s" % (e.status_code, e.code, e.param))
            n = re.search(r"(\d+) tokens, and the model's context is 2048 tokens", e.message)
            check(n and int(n.group(1)) > 2048, "the message names the prompt's tokens and the context: %s" % e.message)
        e = refusal(c.completions.create, model=model.id, max_tokens=4, prompt=long_text)
        if e is not None:
            check(e.code == "context_length_exceeded" and e.param == "prompt", "completion over the context: %s" % e)
        # the prompt fits, max_tokens does not: refused on max_tokens, not a context-length error
        e = refusal(c.chat.completions.create, model=model.id, max_tokens=2040, messages=q)
        if e is not None:
            check(e.param == "max_tokens" and e.code is None and "may be at most" in e.message,
                  "max_tokens over what the context leaves: %s %s %s" % (e.code, e.param, e.message))
        if litellm is not None:
            kw = dict(model="openai/" + model.id, api_base=d.url + "/v1", api_key="unused", num_retries=0)
            try:
                litellm.completion(messages=[{"role": "user", "content": long_text}], max_tokens=4, **kw)
                check(False, "litellm: the prompt over the context was accepted")
            except litellm.ContextWindowExceededError:
                pass
            except Exception as x:  # noqa: BLE001 (what litellm raised instead is the failure)
                check(False, "litellm: a prompt over the context is %s, not ContextWindowExceededError: %s"
                      % (type(x).__name__, x))
            try:
                litellm.completion(messages=q, max_tokens=2040, **kw)
                check(False, "litellm: max_tokens over the context was accepted")
            except litellm.ContextWindowExceededError as x:
                check(False, "litellm: a max_tokens that does not fit is a ContextWindowExceededError: %s" % x)
            except litellm.BadRequestError:
                pass
            r = litellm.completion(messages=q, max_tokens=8, temperature=0, **kw)
            check(r.choices[0].message.content, "litellm: a plain chat: %s" % r)

        # schema-valid requests OpenAI accepts (each part fails on its own: an exception is that part's failure)
        def accepted(what, fn, **kw):
            try:
                return fn(**kw)
            except openai.APIError as x:
                check(False, "%s: refused: %s" % (what, x))
                return None
        greedy = c.chat.completions.create(model=model.id, messages=q, max_tokens=12, temperature=0)
        want = greedy.choices[0].message.content
        r = accepted("top_p 0", c.chat.completions.create, model=model.id, messages=q, max_tokens=12,
                     temperature=1.0, top_p=0, seed=7)
        check(r is None or r.choices[0].message.content == want,
              "top_p 0 is greedy: %r vs %r" % (r and r.choices[0].message.content, want))
        r = accepted("NUL in object keys", c.chat.completions.create, model=model.id, messages=q, max_tokens=12,
                     temperature=0, metadata={"note\u0000": "x"}, extra_body={"x\u0000y": {"\u0000": 1}})
        check(r is None or r.choices[0].message.content == want, "NUL in object keys: %s" % r)
        r = accepted("prompt null", c.completions.create, model=model.id, prompt=None, max_tokens=6, temperature=0)
        check(r is None or (r.usage.prompt_tokens == 1 and r.usage.completion_tokens >= 1 and r.choices[0].text),
              "prompt null: a new document: %s" % r)

        # reasoning_effort as other tools send it: the model has no reasoning mode, the reply is the same
        for effort in ("none", "minimal", "low", "medium", "high", "xhigh"):
            r = accepted("reasoning_effort " + effort, c.chat.completions.create, model=model.id, messages=q,
                         max_tokens=12, temperature=0, reasoning_effort=effort)
            check(r is None or r.choices[0].message.content == want,
                  "reasoning_effort %s: %r" % (effort, r and r.choices[0].message.content))
        chunks = accepted("streamed, reasoning_effort none", lambda **kw: list(c.chat.completions.create(**kw)),
                          model=model.id, messages=q, max_tokens=12, temperature=0, stream=True,
                          stream_options={"include_usage": True}, extra_body={"reasoning_effort": "none"})
        text = "".join(ch.choices[0].delta.content or "" for ch in chunks or [] if ch.choices)
        check(chunks is None or text == want, "streamed with reasoning_effort none: %r" % text)
        e = refusal(c.chat.completions.create, model=model.id, messages=q, max_tokens=2,
                    extra_body={"reasoning_effort": "maximum"})
        if e is not None:
            check(e.param == "reasoning_effort" and "no reasoning mode" in e.message, "reasoning_effort maximum: %s" % e)
    finally:
        check(d.stop() == 0, "exit 0 after the compat cases")


def case_noqueue(build, tmp):
    d = Daemon(build, tmp,
               "[server]\nlisten = 127.0.0.1:0\nmax_queue = 0\n[model]\npath = %s\ndevice = cpu\ncontext = 2048\n"
               "[cache]\nmax_running = 1\n[tier.hbm]\ncapacity = 64M\n[tier.host]\ncapacity = 64M\n"
               "[tier.nvme]\ncapacity = 64M\n[index]\ndata_dir = @DATA@\n" % MODEL)
    d.start()  # refused before max_queue = 0 meant anything: "sched: bad config: max_queue"
    try:
        small = {"prompt": "Hello", "max_tokens": 2, "temperature": 0}
        st, r = http("POST", d.url + "/v1/completions", small)
        check(st == 200, "max_queue = 0 serves: %s %s" % (st, r))
        # one long request holds the only place (its first token is out, so it runs) ...
        body = json.dumps({"prompt": "Count to one thousand:", "max_tokens": 400, "ignore_eos": True,
                           "temperature": 0, "stream": True}).encode()
        req = urllib.request.Request(d.url + "/v1/completions", data=body, headers={"Content-Type": "application/json"})
        with urllib.request.urlopen(req, timeout=600) as stream:
            check(stream.readline().startswith(b"data: "), "the long request streams")
            # ... so another is refused at once, with 503 overloaded and Retry-After
            st, r = http("POST", d.url + "/v1/completions", small)
            check(st == 503 and r.get("error", {}).get("code") == "overloaded",
                  "beyond max_running with no queue: %s %s" % (st, r))
        # the long one hung up: its place is free again
        deadline = time.time() + 30
        st = 0
        while time.time() < deadline and st != 200:
            st, r = http("POST", d.url + "/v1/completions", small)
            if st != 200:
                time.sleep(0.2)
        check(st == 200, "a freed place serves again: %s %s" % (st, r))
    finally:
        check(d.stop() == 0, "exit 0 with max_queue = 0")


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


def case_exposure(build, tmp):
    """A non-loopback listen address with no key is refused, unless allow_unauthenticated (then a warning)."""
    def conf(server, listen="0.0.0.0:0"):
        path = os.path.join(tmp, "exp.conf")
        with open(path, "w") as f:
            f.write("[server]\nlisten = %s\n%s[model]\npath = %s\ndevice = cpu\n[tier.nvme]\ncapacity = 64M\n"
                    "[index]\ndata_dir = %s\n" % (listen, server, MODEL, os.path.join(tmp, "data")))
        return path

    def run(server, check_only=True, listen="0.0.0.0:0"):
        args = [os.path.join(build, "kvtierd"), "-c", conf(server, listen)] + (["--check-config"] if check_only else [])
        p = subprocess.run(args, capture_output=True, text=True, timeout=120)
        return p.returncode, p.stderr
    rc, err = run("")
    check(rc == 78 and "serves the network with no API key" in err and "allow_unauthenticated = true" in err,
          "0.0.0.0 with no key is refused (EX_CONFIG): %d %s" % (rc, err))
    rc2, err2 = run("", check_only=False)
    check(rc2 == 78 and "no API key" in err2, "and kvtierd does not start: %d %s" % (rc2, err2[-300:]))
    for server in ("allow_unauthenticated = true\n", "api_keys = k1\n", "admin_keys = ops:k2\n"):
        rc, err = run(server)
        check(rc == 0, "%r: accepted: %d %s" % (server, rc, err))
    for listen in ("127.0.0.2:0", "[::1]:0"):
        rc, err = run("", listen=listen)
        check(rc == 0, "loopback %s needs no key: %d %s" % (listen, rc, err))
    keyfile = os.path.join(tmp, "keys")
    open(keyfile, "w").close()
    rc, err = run("api_key_file = %s\n" % keyfile, check_only=False)
    check(rc == 78 and "no API key" in err, "an empty api_key_file is no key: %d %s" % (rc, err[-300:]))
    d = Daemon(build, os.path.join(tmp, "open"),
               "[server]\nlisten = 0.0.0.0:0\nallow_unauthenticated = true\n[model]\npath = %s\ndevice = cpu\n"
               "[tier.nvme]\ncapacity = 64M\n[index]\ndata_dir = @DATA@\n" % MODEL)
    d.start()
    try:
        check("NO authentication" in d._log(), "allow_unauthenticated warns at start")
    finally:
        check(d.stop() == 0, "exit 0")


def metrics_documented():
    """{family: type} of the /metrics block of docs/http-api.md (a histogram's _bucket line, a summary's _sum
    line names its family)."""
    doc = open(os.path.join(ROOT, "docs", "http-api.md")).read()
    sec = doc[doc.index("## `GET /metrics`"):]
    block = sec[sec.index("```") + 3:]
    block = block[:block.index("```")]
    out = {}
    for line in block.splitlines():
        m = re.match(r"(kvtier_\w+)\S*\s.*?\b(counter|gauge|histogram|summary)\b", line)
        if m:
            name, kind = m.group(1), m.group(2)
            for suffix in {"histogram": ("_bucket",), "summary": ("_sum",)}.get(kind, ()):
                if name.endswith(suffix):
                    name = name[:-len(suffix)]
            out[name] = kind
    return out


def raw_request(d, method, path, body=None, headers=None):
    """(status, headers, body text) of one request: the response headers, which http() does not return."""
    import http.client
    c = http.client.HTTPConnection(d.url.split("//")[1], timeout=300)
    data = json.dumps(body).encode() if isinstance(body, dict) else body
    hdr = dict(headers or {})
    if data is not None:
        hdr.setdefault("Content-Type", "application/json")
    c.request(method, path, body=data, headers=hdr)
    r = c.getresponse()
    text = r.read().decode()
    c.close()
    return r.status, r.headers, text


def case_frontdoor(build, tmp):
    """X-Request-Id on every response, in the log and in error bodies; CORS for configured origins only;
    every family /metrics exposes is documented in docs/http-api.md, with its type."""
    origin = "http://localhost:3000"
    d = daemon(build, tmp, server="cors_origins = %s, https://chat.example.com\n" % origin)
    d.start()
    try:
        st, text = http("GET", d.url + "/metrics")
        check(st == 200, "/metrics: %s" % st)
        exposed = dict(re.findall(r"^# TYPE (\S+) (\S+)$", text, re.M))
        documented = metrics_documented()
        check(len(exposed) > 30, "/metrics exposes %d families" % len(exposed))
        for name, kind in sorted(exposed.items()):
            check(documented.get(name) == kind, "/metrics family %s (%s) is documented as %s in docs/http-api.md"
                  % (name, kind, documented.get(name)))
        for name in sorted(set(documented) - set(exposed)):  # only T3's and the store's are conditional (neither on here)
            check(name.startswith(("kvtier_remote_", "kvtier_store_")), "docs/http-api.md lists %s, which /metrics does not expose" % name)

        hexid = re.compile(r"^[0-9a-f]{32}$")
        st, h, _ = raw_request(d, "GET", "/health")
        check(st == 200 and hexid.match(h.get("X-Request-Id", "")), "/health: a generated X-Request-Id: %s" % h)
        chat_body = {"messages": [{"role": "user", "content": "Hi"}], "max_tokens": 2, "temperature": 0}
        st, h, _ = raw_request(d, "POST", "/v1/chat/completions", chat_body, {"X-Request-Id": "trace-7f3a;span=9"})
        check(st == 200 and h.get("X-Request-Id") == "trace-7f3a;span=9", "chat echoes the client's id: %s" % h)
        # the access line is written when the request completes, which may be just after the reply arrives
        t_end = time.time() + 10
        while not re.search(r"http POST /v1/chat/completions 200 .* id=trace-7f3a;span=9\b", d._log()) \
                and time.time() < t_end:
            time.sleep(0.05)
        check(re.search(r"http POST /v1/chat/completions 200 .* id=trace-7f3a;span=9\b", d._log()),
              "the access log line names the request id")
        st, h, text = raw_request(d, "POST", "/v1/chat/completions", dict(chat_body, stream=True),
                                  {"X-Request-Id": "stream-1"})
        check(st == 200 and h.get("X-Request-Id") == "stream-1" and "[DONE]" in text, "a stream carries it: %s" % h)
        st, h, text = raw_request(d, "POST", "/v1/completions", b"{not json", {"X-Request-Id": "bad-1"})
        err = json.loads(text).get("error", {})
        check(st == 400 and h.get("X-Request-Id") == "bad-1" and err.get("request_id") == "bad-1",
              "an error names the id in its header and body: %s %s" % (h, text))
        for insane in ("x" * 129, "two words", 'q"uote'):
            st, h, text = raw_request(d, "GET", "/v1/nothing", None, {"X-Request-Id": insane})
            rid = h.get("X-Request-Id", "")
            check(st == 404 and hexid.match(rid) and json.loads(text)["error"].get("request_id") == rid,
                  "an id of %r is replaced by a generated one: %s %s" % (insane[:20], h, text))

        pre = {"Origin": origin, "Access-Control-Request-Method": "POST",
               "Access-Control-Request-Headers": "authorization, content-type, x-stainless-os"}
        st, h, _ = raw_request(d, "OPTIONS", "/v1/chat/completions", None, pre)
        check(st == 204 and h.get("Access-Control-Allow-Origin") == origin and
              h.get("Access-Control-Allow-Methods") == "POST" and
              h.get("Access-Control-Allow-Headers") == pre["Access-Control-Request-Headers"] and h.get("X-Request-Id"),
              "preflight from an allowed origin: %s %s" % (st, h))
        st, h, _ = raw_request(d, "OPTIONS", "/v1/chat/completions", None, dict(pre, Origin="http://evil.example"))
        check(st == 405 and "Access-Control-Allow-Origin" not in h, "preflight from another origin: %s %s" % (st, h))
        st, h, _ = raw_request(d, "GET", "/v1/models", None, {"Origin": "https://chat.example.com"})
        check(st == 200 and h.get("Access-Control-Allow-Origin") == "https://chat.example.com" and
              "X-Request-Id" in h.get("Access-Control-Expose-Headers", "") and "Origin" in h.get("Vary", ""),
              "a request from an allowed origin: %s" % h)
        st, h, _ = raw_request(d, "GET", "/v1/models", None, {"Origin": "http://localhost:3001"})
        check(st == 200 and "Access-Control-Allow-Origin" not in h and "Origin" in h.get("Vary", ""),
              "a request from another origin: %s" % h)

        # 200 idle connections from 127.0.0.1 (the default limit is 64 per address): a chat from
        # 127.0.0.1 is still served within 2 s, the idle ones making room
        import socket
        host, port = d.url.split("//")[1].split(":")
        idle = [socket.create_connection((host, int(port))) for _ in range(200)]
        try:
            time.sleep(0.3)
            t0 = time.monotonic()
            try:
                st, h, _ = raw_request(d, "POST", "/v1/chat/completions", dict(chat_body, max_tokens=1))
            except OSError as e:
                st, h = "%s: %s" % (type(e).__name__, e), {}
            dt = time.monotonic() - t0
            print("frontdoor: chat with 200 idle connections from 127.0.0.1: %s in %.3f s" % (st, dt))
            check(st == 200 and dt < 2.0, "a chat from an address with 200 idle connections: %s after %.3f s" % (st, dt))
        finally:
            for c in idle:
                c.close()
    finally:
        d.stop()


def small_daemon(build, data_dir, nvme_path="", block_tokens=16):
    """A kvtierd with a 64 MiB NVMe tier, optionally at another path and block size."""
    return Daemon(build, data_dir,
                  "[server]\nlisten = 127.0.0.1:0\n[model]\npath = %s\ndevice = cpu\ncontext = 2048\n"
                  "[cache]\nblock_tokens = %d\n[tier.hbm]\ncapacity = 128M\n[tier.host]\ncapacity = 128M\n"
                  "[tier.nvme]\ncapacity = 64M\n%s[index]\ndata_dir = @DATA@\n"
                  % (MODEL, block_tokens, "path = %s\n" % nvme_path if nvme_path else ""))


def refused(d, what, needle):
    """d must fail to start, its log saying needle."""
    try:
        d.start()
    except RuntimeError as e:
        return check(needle in str(e), "%s: refused, but the log does not say %r:\n%s" % (what, needle, e))
    d.stop()
    return check(False, "%s: the daemon started" % what)


def case_t2owner(build, tmp):
    shared = os.path.join(tmp, "shared.t2")
    a = small_daemon(build, os.path.join(tmp, "a"), shared)
    b = small_daemon(build, os.path.join(tmp, "b"), shared)
    a.start()
    try:
        _, _, prev = converse(a, "own", USER_TURNS[:2])
        time.sleep(1.5)  # end-of-turn write-through: durable within 1 s
        refused(b, "a second daemon on the first one's [tier.nvme] path", "locked by another process")
    finally:
        check(a.stop() == 0, "SIGTERM exits 0")
    # b's data dir has no index: the file is refused before its owner id is read (it may be b's own, index lost)
    refused(b, "another data dir's daemon on a stopped daemon's T2 file", "give this one its own [tier.nvme] path")
    full = history_tokens(prev) // BT * BT
    # the file emptied under the index: a start, and the loss said and counted
    os.truncate(shared, 0)
    a.start()
    try:
        log = a._log()
        check(shared in log and "gone from the file" in log, "the log names the emptied file and the loss:\n%s"
              % log[-2000:])
        st, s = http("GET", a.url + "/v1/stats")
        lost = s["persist"].get("lost_at_start", 0) if st == 200 else 0
        check(lost >= full // BT - 1 and lost > 0, "stats count the lost blocks: %s" % s.get("persist"))
        check("0 durable blocks recovered, %d lost" % lost in log, "start-up line counts %d lost blocks:\n%s"
              % (lost, log[-2000:]))
        st, lst = http("GET", a.url + "/v1/sessions")
        own = [x for x in lst["data"] if x["id"] == "own"] if st == 200 else []
        check(len(own) == 1 and own[0]["blocks"] > 0 and own[0]["blocks_missing"] == own[0]["blocks"],
              "sessions show every block missing: %s" % lst)
        st, rep = http("POST", a.url + "/v1/sessions/own/resume", {})
        check(st == 200 and sum(rep["restored_tokens"].values()) == 0 and rep["missing_tokens"] >= full,
              "resume reports the tokens missing: %s" % rep)
    finally:
        check(a.stop() == 0, "SIGTERM exits 0")


def case_blocksize(build, tmp):
    sizes = (16, 32, 16)
    prev16 = None
    for i, bt in enumerate(sizes):
        d = small_daemon(build, tmp, block_tokens=bt)
        try:
            d.start()
        except RuntimeError as e:
            check(False, "start %d (block_tokens %d): %s" % (i, bt, e))
            return
        try:
            if i == 0:
                _, _, prev16 = converse(d, "bs16", USER_TURNS[:2])
                time.sleep(1.5)
            elif i == 1:
                converse(d, "bs32", USER_TURNS[:2], expect_cached=False)  # BT is 16 in its checks
                time.sleep(1.5)
            else:
                full = history_tokens(prev16) // BT * BT
                st, rep = http("POST", d.url + "/v1/sessions/bs16/resume", {})
                check(st == 200 and rep["restored_tokens"]["nvme"] == full,
                      "16 -> 32 -> 16: the 16-token session resumes %d tokens from nvme: %s" % (full, rep))
        finally:
            check(d.stop() == 0, "SIGTERM exits 0 (block_tokens %d)" % bt)




def can_mount():
    """Root can mount a tmpfs; the cases that need one skip (and say why) without it."""
    if os.geteuid() != 0:
        return False
    probe = tempfile.mkdtemp(prefix="kvt_mnt_probe_")
    try:
        ok = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=1m", "tmpfs", probe], capture_output=True).returncode == 0
        if ok:
            subprocess.run(["umount", probe])
        return ok
    finally:
        os.rmdir(probe)


class Tmpfs:
    """A small tmpfs at path (a context manager: unmounted, and the folder removed, on exit)."""
    def __init__(self, path, size):
        self.path, self.size = path, size

    def __enter__(self):
        os.makedirs(self.path, exist_ok=True)
        subprocess.run(["mount", "-t", "tmpfs", "-o", "size=" + self.size, "tmpfs", self.path], check=True)
        return self

    def __exit__(self, *exc):
        subprocess.run(["umount", "-l", self.path])
        os.rmdir(self.path)

    def free(self):
        v = os.statvfs(self.path)
        return v.f_bavail * v.f_frsize


def fill(path):
    """Write a filler file until the file system is full (ENOSPC)."""
    with open(path, "wb", buffering=0) as f:
        chunk = 1 << 20
        while chunk >= 512:
            try:
                f.write(b"\0" * chunk)
            except OSError:
                chunk //= 2


def conf_on(data_dir, nvme="capacity = 16M\n", extra=""):
    return ("[server]\nlisten = 127.0.0.1:0\n[model]\npath = %s\ndevice = cpu\ncontext = 2048\n"
            "[tier.hbm]\ncapacity = 256M\n[tier.host]\ncapacity = 256M\n[tier.nvme]\n%s%s"
            "[index]\ndata_dir = %s\n" % (MODEL, nvme, extra, data_dir))


def wait_for(what, fn, timeout=15.0):
    deadline = time.time() + timeout
    while time.time() < deadline:
        v = fn()
        if v:
            return v
        time.sleep(0.2)
    check(False, "timed out waiting for " + what)
    return None


def case_badrow(build, tmp):
    """Issue 13 item 8: one bad session row is skipped, counted and named; the others list and resume.
    Issue 27 item 1: so is one bad block row (it claims another row's T2 extent): the daemon starts."""
    d = Daemon(build, tmp, conf_on(tmp, nvme="capacity = 64M\n"))
    d.start()
    try:
        for i in range(3):
            chat(d, [{"role": "user", "content": USER_TURNS[i]}], session="br%d" % i, max_tokens=4)
    finally:
        check(d.stop() == 0, "SIGTERM exits 0")
    import sqlite3
    q = sqlite3.connect(os.path.join(tmp, "index.sqlite"))
    q.execute("UPDATE sessions SET tokens = x'010203' WHERE id = 'br1'")
    n_rows = q.execute("SELECT count(*) FROM blocks").fetchone()[0]
    cols = ("parent, tokens, off, extent_bytes, stored_bytes, generation, checksum, compressed, kv_dtype, codec, "
            "scale_layout, raw_bytes, last_use, hit_count")
    # its hash sorts after every real one, so it is walked last and the real row keeps the extent
    q.execute("INSERT INTO blocks(ns, hash, %s) SELECT ns, x'%s', %s FROM blocks ORDER BY id LIMIT 1"
              % (cols, "ff" * 32, cols))
    q.commit()
    q.close()
    check(n_rows > 0, "the turns left block rows: %d" % n_rows)
    d.restart()
    try:
        log = d._log()
        check("block %s at offset" % ("ff" * 32) in log and "overlaps another row's" in log,
              "the log names the skipped block row:\n%s" % log[-2000:])
        check("durable blocks recovered, 0 lost, 1 bad rows skipped" in log, "the start-up line counts it:\n%s"
              % log[-2000:])
        st, s = http("GET", d.url + "/v1/stats")
        check(st == 200 and s.get("persist", {}).get("skipped_at_start") == 1, "stats count the bad block row: %s"
              % s.get("persist"))
        rc, out, err = kvtier(build, "stats", "--url", d.url)
        check(rc == 0 and "SKIPPED at start-up: 1 bad index rows" in out, "kvtier stats shows it: %d %s %s"
              % (rc, out, err))
        st, lst = http("GET", d.url + "/v1/sessions")
        check(st == 200, "GET /v1/sessions with one bad row: %s %s" % (st, lst))
        if st == 200:
            check({x["id"] for x in lst["data"]} == {"br0", "br2"}, "the good sessions are listed: %s" % lst)
        rc, out, err = kvtier(build, "sessions", "--url", d.url)
        check(rc == 0 and "br0" in out and "br2" in out, "kvtier sessions with one bad row: %d %s %s" % (rc, out, err))
        rc, out, err = kvtier(build, "resume", "br2", "--url", d.url, "--json")
        check(rc == 0, "kvtier resume of a good session beside a bad row: %d %s" % (rc, err))
        st, s = http("GET", d.url + "/v1/stats")
        check(st == 200 and s.get("index", {}).get("bad_session_rows") == 1, "stats count the bad row: %s"
              % s.get("index"))
        log = d._log()
        check("session default/br1 tokens: token blob of 3 bytes" in log and "is unreadable" in log,
              "the log names the bad row")
        st, r = http("DELETE", d.url + "/v1/sessions/br1")
        check(st == 200, "the bad row can be deleted: %s %s" % (st, r))
    finally:
        d.stop()


def case_nvmecap(build, tmp):
    """Issue 13 item 2: the default NVMe capacity fits the disk; an explicit one larger than it is refused."""
    if not can_mount():
        SKIPS.append("nvmecap: needs root to mount a tmpfs")
        print("skip nvmecap: needs root to mount a tmpfs")
        return
    with Tmpfs(os.path.join(tmp, "fs"), "200m") as fs:
        data = os.path.join(fs.path, "data")
        d = Daemon(build, os.path.join(tmp, "big"), conf_on(data, nvme="capacity = 1G\n"))
        try:
            d.start(timeout=120)
            check(False, "kvtierd started with tier.nvme capacity 1G on a 200M file system")
            d.stop()
        except RuntimeError:
            pass
        log = d._log()
        check("1G (1073741824 bytes) is larger than the free space" in log and "bytes free" not in log and
              "bytes," in log, "the refusal names both numbers: %s" % log[-600:])
        check(not os.path.exists(os.path.join(data, "kvtier.t2")), "nothing preallocated")
        free = fs.free()
        d = Daemon(build, os.path.join(tmp, "auto"), conf_on(data, nvme=""))
        d.start()
        try:
            size = os.path.getsize(os.path.join(data, "kvtier.t2"))
            check(64 << 20 <= size <= free // 2, "auto T2 file %d bytes: at most half of %d free" % (size, free))
            check("tier.nvme capacity auto:" in d._log(), "the choice is logged")
            st, s = http("GET", d.url + "/v1/stats")
            check(st == 200 and s["tiers"][2]["capacity_bytes"] > 0, "the NVMe tier is on: %s" % s["tiers"][2])
        finally:
            check(d.stop() == 0, "SIGTERM exits 0")


def case_diskfull(build, tmp):
    """Issue 13 item 1: a full disk degrades (visible), then recovers; what was acknowledged survives kill -9."""
    if not can_mount():
        SKIPS.append("diskfull: needs root to mount a tmpfs")
        print("skip diskfull: needs root to mount a tmpfs")
        return
    with Tmpfs(os.path.join(tmp, "fs"), "40m") as fs:
        data = os.path.join(fs.path, "data")
        filler = os.path.join(fs.path, "filler")
        # the log and the config live outside the small file system, so the log keeps working
        d = Daemon(build, os.path.join(tmp, "conf"), conf_on(data))
        d.start()
        try:
            msgs, _, _ = converse(d, "df", USER_TURNS[:1])
            time.sleep(1.5)
            st, h = http("GET", d.url + "/health")
            check(st == 200 and h.get("status") == "ok", "health ok before: %s %s" % (st, h))
            fill(filler)
            # turns acknowledged while the disk is full
            msgs, _, _ = converse(d, "df", USER_TURNS[1:3], msgs=msgs)
            h = wait_for("/health to say degraded",
                         lambda: (lambda r: r[1] if r[0] == 200 and r[1].get("status") == "degraded" else None)(
                             http("GET", d.url + "/health")))
            check(h is not None and "index" in h.get("degraded", []), "health names the index: %s" % h)
            st, s = http("GET", d.url + "/v1/stats")
            check(s["index"]["degraded"] and s["persist"]["degraded"] and s["tiers"][2]["degraded"],
                  "stats say degraded: %s %s" % (s["index"], s["persist"]))
            st, m = http("GET", d.url + "/metrics")
            check("kvtier_index_degraded 1" in m, "metrics say degraded")
            rc, out, err = kvtier(build, "stats", "--url", d.url)
            check(rc == 0 and "DEGRADED" in out, "kvtier stats says degraded: %s" % out)
            # space returns
            os.unlink(filler)
            wait_for("/health to say ok again",
                     lambda: (lambda r: r[0] == 200 and r[1].get("status") == "ok")(http("GET", d.url + "/health")))
            persisted = s["persist"]["persisted"]
            st, s = http("GET", d.url + "/v1/stats")
            check(not s["index"]["degraded"] and s["persist"]["persisted"] > persisted,
                  "the backlog was written: %s" % s["persist"])
            msgs, _, prev = converse(d, "df", USER_TURNS[3:4], msgs=msgs)
            time.sleep(2.0)  # end-of-turn write-through: durable within 1 s
            d.stop(signal.SIGKILL)
            log = d._log()
            check(log.count("durability is degraded") == 1, "the start is logged once")
            check(log.count("durability restored") == 1, "the end is logged once")
            d.restart()
            st, lst = http("GET", d.url + "/v1/sessions")
            got = [x for x in lst.get("data", []) if x["id"] == "df"]
            check(got and got[0]["tokens"] == history_tokens(prev),
                  "after kill -9 the session has every acknowledged turn: %s, expected %d tokens"
                  % (got, history_tokens(prev)))
            full = history_tokens(prev) // BT * BT
            msgs.append({"role": "user", "content": USER_TURNS[4]})
            r = chat(d, msgs, session="df")
            check(r["usage"]["prompt_tokens_details"]["cached_tokens"] == full,
                  "after kill -9: cached %d, expected %d (the turns of the full spell included)"
                  % (r["usage"]["prompt_tokens_details"]["cached_tokens"], full))
        finally:
            d.stop()
            if os.path.exists(filler):
                os.unlink(filler)


def case_youngwal(build, tmp):
    """Issue 28 item 4: a young index (never checkpointed) whose WAL is lost or garbage after a kill -9 starts,
    its owner id taken back from the T2 file (before: "belongs to another index", exit 70), with every
    acknowledged session from the journal; a refused start's last line says why."""
    for how in ("deleted", "garbage"):
        data = os.path.join(tmp, how)
        d = small_daemon(build, data)
        d.start()
        try:
            _, _, prev = converse(d, "yw", USER_TURNS[:2])
            time.sleep(1.5)  # the blocks' end-of-turn write-through
            d.stop(signal.SIGKILL)
        finally:
            d.stop()
        wal = os.path.join(data, "index.sqlite-wal")
        if not check(os.path.exists(wal) and os.path.getsize(wal) > 0, "%s: a WAL after kill -9" % how):
            continue
        if how == "deleted":
            os.unlink(wal)
        else:
            with open(wal, "r+b") as f:
                f.write(os.urandom(os.path.getsize(wal)))
        try:
            d.start(timeout=120)
        except RuntimeError as e:
            check(False, "%s WAL on a young index: kvtierd refused to start: %s" % (how, str(e)[-600:]))
            continue
        try:
            st, lst = http("GET", d.url + "/v1/sessions")
            got = {x["id"]: x["tokens"] for x in lst.get("data", [])} if st == 200 else {}
            check(got.get("yw") == history_tokens(prev), "%s WAL: the session has its acknowledged turn: %s, "
                  "expected %d tokens" % (how, got, history_tokens(prev)))
            check("takes the owner id its T2 file recorded" in d._log(), "%s WAL: the adoption is logged" % how)
        finally:
            check(d.stop() == 0, "SIGTERM exits 0")
    # a refused start (a new data dir on another one's T2 file): the last line carries the cause
    shared = os.path.join(tmp, "deleted", "kvtier.t2")
    b = small_daemon(build, os.path.join(tmp, "other"), shared)
    refused(b, "another data dir's T2 file", "holds data")
    last = [l for l in b._log().splitlines() if "start-up failed" in l]
    check(last and "holds data" in last[-1], "the refusal's last line says why: %s" % last[-1:])


def case_keyfiles(build, tmp):
    """Issue 28 item 6: a key or secret file that is a device, a FIFO or too large is refused at start, by name,
    at once (before: api_key_file = /dev/zero spun at 50% CPU forever, a FIFO secret hung the start)."""
    fifo = os.path.join(tmp, "fifo")
    os.mkfifo(fifo, 0o600)
    big = os.path.join(tmp, "big.keys")
    with open(big, "w") as f:
        f.write(("tenant:%s\n" % ("k" * 100)) * 12000)  # about 1.3 MB
    os.chmod(big, 0o600)
    base = ("[server]\nlisten = 127.0.0.1:0\n%s[model]\npath = %s\ndevice = cpu\n[tier.nvme]\ncapacity = 16M\n"
            "[index]\ndata_dir = %s\n")
    for what, server, needle in (
            ("api_key_file = /dev/zero", "api_key_file = /dev/zero\n", "/dev/zero is not a regular file (a device)"),
            ("api_key_file = a FIFO", "api_key_file = %s\n" % fifo, "is not a regular file (a FIFO)"),
            ("api_key_file of 1.3 MB", "api_key_file = %s\n" % big, "at most 1048576 are read"),
            ("secret_file = a FIFO", "secret_file = %s\n" % fifo, "secret file %s is not a regular file (a FIFO)" % fifo)):
        t = time.time()
        refused(Daemon(build, os.path.join(tmp, "d%d" % len(what)), base % (server, MODEL, os.path.join(tmp, "data"))),
                what, needle)
        check(time.time() - t < 60, "%s: refused within a minute (%.1f s)" % (what, time.time() - t))


def case_diskfull_kill(build, tmp):
    """Issue 28 item 2: on a full disk the session rows commit on the reserve: every acknowledged turn survives a
    kill -9 during the full spell (and a restart on the still-full disk); once the reserve is used up too, a turn
    with session_id is refused 507 insufficient_storage (never acknowledged) while one without is served; when
    space returns, service resumes."""
    if not can_mount():
        SKIPS.append("diskfull_kill: needs root to mount a tmpfs")
        print("skip diskfull_kill: needs root to mount a tmpfs")
        return
    with Tmpfs(os.path.join(tmp, "fs"), "40m") as fs:
        data = os.path.join(fs.path, "data")
        filler = os.path.join(fs.path, "filler")
        d = Daemon(build, os.path.join(tmp, "conf"), conf_on(data) + "reserve = 256K\n")
        d.start()
        try:
            msgs, _, _ = converse(d, "dk", USER_TURNS[:1])
            fill(filler)
            msgs, _, prev = converse(d, "dk", USER_TURNS[1:3], msgs=msgs)  # acknowledged on the reserve
            d.stop(signal.SIGKILL)  # during the full spell
            d.restart()  # on the still-full disk
            st, lst = http("GET", d.url + "/v1/sessions")
            got = [x for x in lst.get("data", []) if x["id"] == "dk"]
            check(got and got[0]["tokens"] == history_tokens(prev),
                  "after kill -9 in the full spell the session has every acknowledged turn: %s, expected %d tokens"
                  % (got, history_tokens(prev)))
            st, h = http("GET", d.url + "/health")
            check(st == 200 and h.get("status") == "degraded", "health degraded on the full disk: %s %s" % (st, h))
            # use the reserve up: longer and longer session turns until one is refused
            refused, n_ok = None, 0
            for i in range(300):
                body = {"messages": [{"role": "user", "content": "%d %s" % (i, " ".join(USER_TURNS) * (1 + i % 4))}],
                        "max_tokens": 1, "temperature": 0, "session_id": "fill%d" % i}
                st, r = http("POST", d.url + "/v1/chat/completions", body)
                if st != 200:
                    refused = (st, r)
                    break
                n_ok += 1
            check(refused is not None and refused[0] == 507 and refused[1]["error"]["code"] == "insufficient_storage"
                  and refused[1]["error"]["type"] == "insufficient_storage",
                  "a session turn past the reserve is refused 507 insufficient_storage (after %d served): %s"
                  % (n_ok, refused))
            st, r = http("POST", d.url + "/v1/chat/completions",
                         {"messages": [{"role": "user", "content": "Hello"}], "max_tokens": 2, "temperature": 0})
            check(st == 200, "a request without session_id is served on the full disk: %s %s" % (st, r))
            # space returns: the reserve is made again, the index commits, a session turn is kept
            os.unlink(filler)
            wait_for("/health to say ok again",
                     lambda: (lambda r: r[0] == 200 and r[1].get("status") == "ok")(http("GET", d.url + "/health")),
                     timeout=30)
            msgs, _, prev = converse(d, "dk", USER_TURNS[3:4], msgs=msgs)
            d.stop(signal.SIGKILL)
            d.restart()
            st, lst = http("GET", d.url + "/v1/sessions")
            got = [x for x in lst.get("data", []) if x["id"] == "dk"]
            check(got and got[0]["tokens"] == history_tokens(prev),
                  "after space returned and kill -9 the session has its last turn: %s, expected %d tokens"
                  % (got, history_tokens(prev)))
            check("reserve is made again" in d._log(), "the reserve's return is logged")
        finally:
            d.stop()
            if os.path.exists(filler):
                os.unlink(filler)


def case_lostindex(build, tmp):
    """Issue 13 item 6: sessions survive a deleted index (rebuild-index) and a deleted WAL (the journal)."""
    d = Daemon(build, tmp, conf_on(tmp, nvme="capacity = 64M\n"))
    d.start()
    want = {}
    try:
        msgs0, _, prev = converse(d, "li0", USER_TURNS[:2])
        want["li0"] = history_tokens(prev)
        msgs1, _, prev = converse(d, "li1", USER_TURNS[2:3])
        want["li1"] = history_tokens(prev)
    finally:
        check(d.stop() == 0, "SIGTERM exits 0")
    idx = os.path.join(tmp, "index.sqlite")
    for p in (idx, idx + "-wal"):
        if os.path.exists(p):
            os.unlink(p)
    # a missing index beside a T2 file that holds data: refuse, and say what to run
    try:
        d.start(timeout=120)
        check(False, "kvtierd started on a missing index while the T2 file holds data")
        d.stop()
    except RuntimeError:
        pass
    check("is missing but the NVMe tier's file" in d._log() and "kvtier rebuild-index --data-dir" in d._log(),
          "the refusal names the fix")
    rc, out, err = kvtier(build, "rebuild-index", "--data-dir", tmp)
    check(rc == 0 and "session writes replayed from the session journal" in out,
          "rebuild-index: %d %s %s" % (rc, out, err))
    d.restart()
    try:
        st, lst = http("GET", d.url + "/v1/sessions")
        got = {x["id"]: x["tokens"] for x in lst.get("data", [])}
        check(got == want, "sessions after rebuild-index: %s, expected %s" % (got, want))
        st, rep = http("POST", d.url + "/v1/sessions/li0/resume", {})
        full = want["li0"] // BT * BT
        check(st == 200 and rep["restored_tokens"]["nvme"] == full,
              "li0 resumes its %d tokens from nvme after rebuild-index: %s" % (full, rep))
        # a new turn, then kill -9 and a lost WAL: the journal still has the session's newest history
        msgs1.append({"role": "user", "content": USER_TURNS[3]})
        r = chat(d, msgs1, session="li1")
        want["li1"] = history_tokens(r)
        time.sleep(2.0)
        d.stop(signal.SIGKILL)
    finally:
        d.stop()
    if check(os.path.exists(idx + "-wal"), "a WAL after kill -9"):
        os.unlink(idx + "-wal")
    d.restart()
    try:
        st, lst = http("GET", d.url + "/v1/sessions")
        got = {x["id"]: x["tokens"] for x in lst.get("data", [])}
        check(got == want, "sessions after a lost WAL: %s, expected %s" % (got, want))
        check("session writes of the session journal" in d._log(), "the log says what the journal restored")
    finally:
        check(d.stop() == 0, "SIGTERM exits 0")


def case_perms(build, tmp):
    """Started with umask 022, kvtierd makes the data dir 0700 and every file in it 0600; a secret others can read is refused."""
    data = os.path.join(tmp, "data")  # made by kvtierd; the test's files go to tmp
    conf = ("[server]\nlisten = 127.0.0.1:0\n[model]\npath = %s\ndevice = cpu\ncontext = 2048\n[tier.hbm]\n"
            "capacity = 128M\n[tier.host]\ncapacity = 128M\n[tier.nvme]\ncapacity = 64M\n[index]\ndata_dir = %s\n"
            % (MODEL, data))
    old = os.umask(0o022)
    try:
        d = Daemon(build, tmp, conf)
        d.start()
        try:
            chat(d, [{"role": "user", "content": "Hello"}], session="p1", max_tokens=4)
            time.sleep(1.5)  # end-of-turn write-through
        finally:
            check(d.stop() == 0, "SIGTERM exits 0")
    finally:
        os.umask(old)
    mode = lambda p: os.stat(p).st_mode & 0o7777  # noqa: E731
    check(mode(data) == 0o700, "data dir mode %o" % mode(data))
    names = sorted(os.listdir(data))
    for want in ("index.sqlite", "kvtier.t2", "secret", "sessions.journal", "kvtier.lock"):
        check(want in names, "%s is in the data dir: %s" % (want, names))
    for n in names:
        p = os.path.join(data, n)
        check(mode(p) & 0o077 == 0, "%s is private: mode %o" % (n, mode(p)))
    os.chmod(os.path.join(data, "secret"), 0o644)
    refused(Daemon(build, tmp, conf), "a group/other-readable secret", "readable by group or others")
    os.chmod(os.path.join(data, "secret"), 0o600)
    os.chmod(data, 0o755)
    d = Daemon(build, tmp, conf)
    d.start()
    try:
        check("is mode 0755" in d._log(), "an open data dir is warned about")
    finally:
        check(d.stop() == 0, "SIGTERM exits 0")


RAWFUZZ_SEEDS = [
    b"GET /health HTTP/1.1\r\nHost: x\r\n\r\n",
    b"GET /v1/models HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n",
    b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: 45\r\n\r\n"
    b'{"prompt": "Hello", "max_tokens": 2, "seed": 1}',
    b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n"
    b'3b\r\n{"messages": [{"role": "user", "content": "Hi"}], "max_tokens": 2}\r\n0\r\n\r\n',
    b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Length: 86\r\n\r\n"
    b'{"messages": [{"role": "user", "content": "Hi"}], "max_tokens": 2, "stream": true, "n": 2}',
    b"POST /v1/sessions/rf/resume HTTP/1.1\r\nHost: x\r\nContent-Length: 16\r\n\r\n{\"stream\": true}",
    b"DELETE /v1/sessions/rf?user=a HTTP/1.1\r\nHost: x\r\n\r\n",
    b"GET /v1/sessions?user=%00 HTTP/1.1\r\nHost: x\r\n\r\n",
]


def rawfuzz_mutate(rng, data):
    """One random change to a request's bytes: the kinds a hostile client sends."""
    b = bytearray(data)
    k = rng.randrange(9)
    if k == 0 and b:                       # flip bits
        for _ in range(rng.randrange(1, 8)):
            b[rng.randrange(len(b))] ^= 1 << rng.randrange(8)
    elif k == 1:                           # insert random bytes
        at = rng.randrange(len(b) + 1)
        b[at:at] = bytes(rng.randrange(256) for _ in range(rng.randrange(1, 64)))
    elif k == 2 and b:                     # delete a run
        at = rng.randrange(len(b))
        del b[at:at + rng.randrange(1, 32)]
    elif k == 3:                           # truncate
        del b[rng.randrange(len(b) + 1):]
    elif k == 4:                           # a huge header line
        at = bytes(b).find(b"\r\n")
        b[at + 2:at + 2] = b"X-" + b"a" * rng.choice((100, 5000, 40000)) + b": b\r\n"
    elif k == 5:                           # a wrong Content-Length
        b = bytearray(bytes(b).replace(b"Content-Length: ", b"Content-Length: %d" % rng.choice((0, 1, 10 ** 9, -1)), 1))
    elif k == 6:                           # duplicate a slice
        at = rng.randrange(len(b) + 1)
        b[at:at] = b[at:at + rng.randrange(1, 200)]
    elif k == 7:                           # garbage
        b = bytearray(bytes(rng.randrange(256) for _ in range(rng.randrange(1, 300))))
    else:                                  # two requests pipelined
        b += rng.choice(RAWFUZZ_SEEDS)
    return bytes(b)


def case_rawfuzz(build, tmp):
    """Mutated raw HTTP requests (bounded count, seeded) at the live daemon: no crash, no hang, no 5xx but 503."""
    import random
    import socket
    n = int(os.environ.get("KVT_RAWFUZZ_COUNT", "300"))
    seed = int(os.environ.get("KVT_RAWFUZZ_SEED", "12345"))
    rng = random.Random(seed)
    d = daemon(build, tmp, server="max_tokens_limit = 4\ndefault_max_tokens = 4\nmax_body_bytes = 64K\nheader_timeout = 1\n")
    d.start()
    port = int(d.url.rsplit(":", 1)[1])
    regress = os.path.join(ROOT, "tests", "data", "http_raw_regress")
    inputs = [open(os.path.join(regress, f), "rb").read() for f in sorted(os.listdir(regress))] \
        if os.path.isdir(regress) else []
    bad = []
    try:
        for i in range(len(inputs) + n):
            req = inputs[i] if i < len(inputs) else rawfuzz_mutate(rng, rng.choice(RAWFUZZ_SEEDS))
            s = socket.create_connection(("127.0.0.1", port), timeout=30)
            got = b""
            try:
                s.sendall(req)
                s.shutdown(socket.SHUT_WR)  # all sent: the daemon answers what it got, then closes
                while True:
                    c = s.recv(65536)
                    if not c:
                        break
                    got += c
            except socket.timeout:
                bad.append((req, "no answer within 30 s (%d bytes)" % len(got)))
            except OSError:
                pass  # reset: the daemon may close a broken request at once
            finally:
                s.close()
            for st in re.findall(rb"HTTP/1\.[01] (\d{3})", got):
                if int(st) >= 500 and int(st) not in (503, 505):  # 505: MHD refuses an HTTP version
                    bad.append((req, "status %s" % st.decode()))
            if d.proc.poll() is not None:
                bad.append((req, "the daemon died (exit %s)" % d.proc.returncode))
                break
        st, _ = http("GET", d.url + "/health")
        check(st == 200, "/health after %d raw requests: %s" % (n, st))
        st, r = http("POST", d.url + "/v1/completions", {"prompt": "Hello", "max_tokens": 2, "temperature": 0})
        check(st == 200, "a completion after the raw requests: %s %s" % (st, r))
        for req, why in bad[:5]:
            name = "raw-%08x" % (hash(req) & 0xffffffff)
            path = os.path.join(tmp, name)
            with open(path, "wb") as f:
                f.write(req)
            check(False, "raw request %s: %s (kept in %s; check it in as tests/data/http_raw_regress/%s)"
                  % (req[:120], why, path, name))
        print("rawfuzz: %d replayed + %d mutated requests (seed %d), %d bad" % (len(inputs), n, seed, len(bad)))
    finally:
        if d.proc is not None:
            check(d.stop() == 0, "exit 0 after the raw requests")


CHUNK_DOCS = [
    "Document one. The lighthouse on Gray Point was built in 1871 from granite blocks quarried two miles inland "
    "and hauled to the cliff on oxen-drawn sledges. Its lamp burned whale oil until 1890, then kerosene, and was "
    "finally electrified in 1934. The keeper's log records that in the winter of 1888 the tower was struck by "
    "lightning three times in one night without damage to the lens, which had been made in Paris.\n\n",
    "Document two. The river town of Millbrook grew around a paper mill that opened in 1902. At its peak the mill "
    "employed four hundred workers and shipped rolls of newsprint by barge to the coast every week. A fire in 1957 "
    "destroyed the east wing, and the mill closed for good in 1971, after which the building became a museum of "
    "local history with a working water wheel.\n\n",
]


def chunk_chat(d, order, question, marked=True, recompute=None, system="Answer from the documents, briefly."):
    mark = {"kvtier": {"reuse": "anywhere"}} if marked else {}
    parts = [dict({"type": "text", "text": CHUNK_DOCS[i]}, **mark) for i in order]
    parts.append({"type": "text", "text": question})
    body = {"messages": [{"role": "system", "content": system},
                         {"role": "user", "content": parts}], "max_tokens": 24, "temperature": 0}
    if recompute is not None:
        body["kvtier"] = {"chunk_recompute": recompute}
    st, r = http("POST", d.url + "/v1/chat/completions", body)
    if not check(st == 200, "chunk chat: status %s: %s" % (st, r)):
        raise RuntimeError("chat failed")
    return r["choices"][0]["message"]["content"], r["usage"]


def case_chunks(build, tmp):
    d = daemon(build, tmp)
    d.start()
    try:
        _, u1 = chunk_chat(d, [0, 1], "Question: when was the lighthouse electrified?")
        k1 = u1["kvtier"]
        check(k1["chunk_tokens"] > 2 * 64 and k1["chunk_reused_tokens"] == 0,
              "first order: %d chunk tokens, %d reused" % (k1["chunk_tokens"], k1["chunk_reused_tokens"]))
        q = "Question: what did the mill ship by barge?"
        _, u2 = chunk_chat(d, [1, 0], q)
        k2 = u2["kvtier"]
        check(k2["chunk_reused_tokens"] > 0 and k2["chunk_recomputed_tokens"] > 0,
              "second order: %d reused, %d recomputed" % (k2["chunk_reused_tokens"], k2["chunk_recomputed_tokens"]))
        check(u2["prompt_tokens_details"]["cached_tokens"] < 64,
              "chunk reuse is not cached_tokens: %d" % u2["prompt_tokens_details"]["cached_tokens"])
        text_r1, u3 = chunk_chat(d, [1, 0], q, recompute=1)
        check(u3["kvtier"]["chunk_reused_tokens"] == 0 and u3["kvtier"]["chunk_recomputed_tokens"] ==
              k2["chunk_reused_tokens"] + k2["chunk_recomputed_tokens"],
              "at recompute 1 every placed token is recomputed: %s" % u3["kvtier"])
        text_plain, u4 = chunk_chat(d, [1, 0], q, marked=False)
        check(u4["kvtier"]["chunk_tokens"] == 0, "no marks, no chunk tokens")
        check(text_r1 == text_plain, "recompute 1 gives the plain prefill's reply: %r vs %r" % (text_r1, text_plain))
        st, m = http("GET", d.url + "/metrics")
        check(st == 200, "metrics")
    finally:
        check(d.stop() == 0, "SIGTERM exits 0")
    d.restart()
    try:
        # another system prompt: no exact prefix covers the documents (both orders were cached whole above)
        _, u5 = chunk_chat(d, [1, 0], "Question: who made the lens?", system="Use the documents to answer.")
        check(u5["kvtier"]["chunk_reused_tokens"] > 0,
              "after a restart the chunks are found again: %s" % u5["kvtier"])
    finally:
        d.stop()


def metric_value(d, name):
    st, body = http("GET", d.url + "/metrics")
    check(st == 200, "metrics: %s" % st)
    text = body if isinstance(body, str) else json.dumps(body)
    for line in text.splitlines():
        if line.startswith(name + " "):
            return float(line.split()[1])
    return None


def case_lossy(build, tmp):
    """usage.kvtier.lossy_cached_tokens after a restart, per NVMe format, and its sum in /metrics and kvtier stats:
    with [tier.nvme] dtype = same an fp8 host tier's NVMe records are 8-bit (the resumed tokens are lossy);
    with f16 (the default) the NVMe copy is exact (0 lossy, and the reply equals the cache-off one)."""
    replies = {}
    for name, nvme_dtype in (("fp8", "same"), ("f16nvme", "f16")):
        d = daemon(build, os.path.join(tmp, name), extra="dtype = fp8\n")
        with open(d.conf) as f:  # the key goes into the config's own [tier.nvme] section
            conf = f.read()
        with open(d.conf, "w") as f:
            f.write(conf.replace("[tier.nvme]\n", "[tier.nvme]\ndtype = %s\n" % nvme_dtype))
        d.start()
        try:
            msgs, _, _ = converse(d, "ls", USER_TURNS[:2])
        finally:
            check(d.stop() == 0, "SIGTERM exits 0")
        d.restart()
        try:
            msgs.append({"role": "user", "content": USER_TURNS[2]})
            r = chat(d, msgs, session="ls")
            u = r["usage"]
            cached, lossy = u["prompt_tokens_details"]["cached_tokens"], u["kvtier"]["lossy_cached_tokens"]
            check(cached > 0 and u["kvtier"]["cached_tokens_by_tier"]["nvme"] > 0, "%s: served from NVMe: %s" % (name, u))
            if name == "fp8":
                check(lossy == cached, "fp8 records: every resumed token is lossy: %s" % u)
            else:
                check(lossy == 0, "f16 NVMe records: no lossy tokens: %s" % u)
            m = metric_value(d, "kvtier_lossy_cached_tokens_total")
            check(m == lossy, "%s: kvtier_lossy_cached_tokens_total %s, the response said %d" % (name, m, lossy))
            rc, out, err = kvtier(build, "stats", "--url", d.url)
            check(rc == 0 and ("lossy cached tokens" in out and (" %d (" % lossy) in out),
                  "%s: kvtier stats shows the lossy tokens (%d): %s %s" % (name, lossy, out, err))
            replies[name] = r["choices"][0]["message"]["content"]
        finally:
            d.stop()
    c = daemon(build, os.path.join(tmp, "off"), extra="[cache]\nenabled = false\n")
    c.start()
    try:
        off = chat(c, msgs)["choices"][0]["message"]["content"]
        check(off == replies.get("f16nvme"), "f16 NVMe copy: the resumed reply differs from the cache-off one:\n%r\n%r"
              % (replies.get("f16nvme"), off))
    finally:
        c.stop()


CASES = {"conversation": case_conversation, "kill9": case_kill9, "sigterm": case_sigterm,
         "tenants": case_tenants, "openai": case_openai, "compat": case_compat, "noqueue": case_noqueue,
         "errors": case_errors, "exposure": case_exposure,
         "t2owner": case_t2owner, "blocksize": case_blocksize, "badrow": case_badrow,
         "nvmecap": case_nvmecap, "diskfull": case_diskfull, "lostindex": case_lostindex, "perms": case_perms,
         "rawfuzz": case_rawfuzz, "diskfull_kill": case_diskfull_kill,
         "keyfiles": case_keyfiles, "youngwal": case_youngwal, "frontdoor": case_frontdoor,
         "chunks": case_chunks, "lossy": case_lossy}


def main():
    return run_cases("daemon", __doc__, MODEL, CASES)


if __name__ == "__main__":
    sys.exit(main())
