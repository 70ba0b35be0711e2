#!/usr/bin/env python3
"""tests/daemon/test_llama_api.py — llama-server's native API on kvtierd (docs/http-api.md,
"llama-server API"), driven with plain HTTP as llama-server's README shows it.

  python3 tests/daemon/test_llama_api.py BUILD_DIR [CASE ...]

Cases (each on its own data dir, small tiers, an ephemeral port, removed afterwards):
  endpoints  GET /props, GET /slots, POST /tokenize (with_pieces: the pieces rejoin to the
             input, a piece that is not UTF-8 alone comes as bytes), /detokenize round trip,
             /apply-template (its prompt is the chat's), /completion plain, streamed and with a
             token-id prompt, timings present and consistent (cache_n > 0 on a repeated
             prompt), timings on /v1/completions and /v1/chat/completions (and on the last
             streamed chunk)
  slots      -np 2 --slot-save-path DIR: a turn in slot 0, save; a new daemon on an EMPTY data
             dir restores slot 0 and runs the next turn without prefilling the history, with the
             reply an uninterrupted daemon gives (greedy); erase; bad filenames and slot ids
  nvme       a slot saved after a restart (its blocks read back from the NVMe tier) restores on an
             empty data dir and replies as the daemon that saved it
  refusals   a tampered snapshot (checksum), a file that is not a snapshot, and a snapshot of
             another model (Gemma 3 270M, when models/ has it) are refused with a clear 400
  flags      llama-server's command line: -m MODEL --host 127.0.0.1 --port P -c 2048 -t 2 -np 2
             --api-key K starts kvtierd, which then wants the key; an unknown flag still fails

Exit 0 pass, 1 fail, 77 skip (no default model).
"""
import json
import os
import shutil
import socket
import subprocess
import sys
import time
import urllib.request

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from kvtierd_proc import SKIPS, Daemon, check, http, run_cases  # noqa: E402

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
MODEL = os.path.join(ROOT, "models", "SmolLM2-135M-Instruct.Q4_1.gguf")
GEMMA = os.path.join(ROOT, "models", "gemma-3-270m-q4_k_m.gguf")
BT = 16
TIMING_KEYS = ("prompt_n", "prompt_ms", "prompt_per_token_ms", "prompt_per_second", "predicted_n",
               "predicted_ms", "predicted_per_token_ms", "predicted_per_second", "cache_n")


class ArgDaemon(Daemon):
    """A Daemon started with more command-line flags after -c CONF (llama-server's)."""

    def __init__(self, build, data_dir, conf, args=()):
        super().__init__(build, data_dir, conf)
        self.args = list(args)

    def start(self, timeout=300):
        real = subprocess.Popen

        def popen(argv, **kw):
            return real(list(argv) + self.args, **kw)

        subprocess.Popen = popen
        try:
            super().start(timeout)
        finally:
            subprocess.Popen = real


def conf_text(model=MODEL, data="@DATA@"):
    # f16 in T1: a block restored from a snapshot decodes bit for bit as the one computed
    return ("[server]\nlisten = 127.0.0.1:0\n[model]\npath = %s\ndevice = cpu\ncontext = 2048\n"
            "[tier.hbm]\ncapacity = 64M\n[tier.host]\ncapacity = 64M\ndtype = f16\n[tier.nvme]\ncapacity = 64M\n"
            "[index]\ndata_dir = %s\n" % (model, data))


def post(d, path, body, hdr=None):
    return http("POST", d.url + path, body, hdr)


def sse(d, path, body):
    """POST a streaming request; the decoded `data:` events, in order (raw text for non-JSON ones)."""
    req = urllib.request.Request(d.url + path, data=json.dumps(body).encode(), method="POST",
                                 headers={"Content-Type": "application/json"})
    out = []
    with urllib.request.urlopen(req, timeout=600) as r:
        for line in r.read().decode().split("\n"):
            if line.startswith("data: "):
                try:
                    out.append(json.loads(line[6:]))
                except ValueError:
                    out.append(line[6:])
    return out


def timings_ok(t, what, n_prompt=None, n_predicted=None):
    if not check(isinstance(t, dict) and all(k in t for k in TIMING_KEYS), "%s: timings %r" % (what, t)):
        return False
    ok = check(t["predicted_n"] >= 1 and t["prompt_ms"] >= 0 and t["predicted_ms"] >= 0, "%s: timings %r" % (what, t))
    if t["predicted_n"] and t["predicted_ms"] > 0:
        ok &= check(abs(t["predicted_per_token_ms"] - t["predicted_ms"] / t["predicted_n"]) < 1e-3 and
                    abs(t["predicted_per_second"] - 1e3 * t["predicted_n"] / t["predicted_ms"]) < 1e-2,
                    "%s: predicted rates agree with n and ms: %r" % (what, t))
    if t["prompt_n"] and t["prompt_ms"] > 0:
        ok &= check(abs(t["prompt_per_token_ms"] - t["prompt_ms"] / t["prompt_n"]) < 1e-3,
                    "%s: prompt rate agrees with n and ms: %r" % (what, t))
    if n_prompt is not None:
        ok &= check(t["prompt_n"] + t["cache_n"] == n_prompt, "%s: prompt_n + cache_n = %d: %r" % (what, n_prompt, t))
    if n_predicted is not None:
        ok &= check(t["predicted_n"] == n_predicted, "%s: predicted_n = %d: %r" % (what, n_predicted, t))
    return ok


def piece_bytes(p):
    return p.encode() if isinstance(p, str) else bytes(p)


def check_props_slots(d, n_slots):
    st, p = http("GET", d.url + "/props")
    check(st == 200, "GET /props: %s %s" % (st, p))
    for k in ("model_path", "model_alias", "build_info", "total_slots", "chat_template", "default_generation_settings"):
        check(k in p, "/props has %s: %r" % (k, sorted(p)))
    check(p["total_slots"] == n_slots, "/props total_slots %s" % p["total_slots"])
    check(p["default_generation_settings"]["n_ctx"] == 2048, "/props n_ctx: %r" % p["default_generation_settings"])
    check(p["model_path"].endswith(".gguf") and p["chat_template"] == "chatml", "/props model and template: %r"
          % {k: p[k] for k in ("model_path", "chat_template")})
    st, s = http("GET", d.url + "/slots")
    check(st == 200 and isinstance(s, list) and len(s) == n_slots, "GET /slots: %s %s" % (st, s))
    for i, sl in enumerate(s if isinstance(s, list) else []):
        check(sl["id"] == i and sl["n_ctx"] == 2048 and sl["is_processing"] is False and "params" in sl,
              "slot %d: %r" % (i, sl))


def check_tokenize(d):
    text = "Hello world! Ünïcödé, 漢字 and 🦙 llamas."
    st, r = post(d, "/tokenize", {"content": text})
    check(st == 200 and all(isinstance(t, int) for t in r["tokens"]), "/tokenize: %s %s" % (st, r))
    ids = r["tokens"]
    st, r2 = post(d, "/tokenize", {"content": text, "with_pieces": True})
    check(st == 200 and [t["id"] for t in r2["tokens"]] == ids, "/tokenize with_pieces: same ids")
    joined = b"".join(piece_bytes(t["piece"]) for t in r2["tokens"])
    check(joined == text.encode(), "the pieces rejoin to the input: %r" % joined)
    as_bytes = [t for t in r2["tokens"] if isinstance(t["piece"], list)]
    if as_bytes:
        check(all(isinstance(b, int) and 0 <= b < 256 for t in as_bytes for b in t["piece"]),
              "byte pieces are byte values: %r" % as_bytes)
        for t in as_bytes:
            try:
                bytes(t["piece"]).decode()
                check(False, "piece %r is valid UTF-8 alone, yet sent as bytes" % t)
            except UnicodeDecodeError:
                pass
    else:
        print("note: no piece of the sample is a partial UTF-8 sequence for this model")
    st, r3 = post(d, "/tokenize", {"content": text, "add_special": True})
    check(st == 200 and r3["tokens"][-len(ids):] == ids, "/tokenize add_special keeps the ids: %r" % r3)
    st, r4 = post(d, "/detokenize", {"tokens": ids})
    check(st == 200 and r4["content"] == text, "/detokenize round trip: %r" % r4)
    st, r5 = post(d, "/detokenize", {"tokens": [10 ** 9]})
    check(st == 400, "/detokenize of a bad id is 400: %s %s" % (st, r5))
    st, r6 = post(d, "/tokenize", {"contents": text})
    check(st == 400, "/tokenize without content is 400: %s" % st)


def check_template(d):
    msgs = [{"role": "system", "content": "You are terse."}, {"role": "user", "content": "Say hi."}]
    st, r = post(d, "/apply-template", {"messages": msgs})
    check(st == 200 and "Say hi." in r["prompt"] and "<|im_start|>assistant" in r["prompt"],
          "/apply-template: %s %r" % (st, r))
    st, chat = post(d, "/v1/chat/completions", {"messages": msgs, "max_tokens": 8, "temperature": 0})
    st2, comp = post(d, "/completion", {"prompt": r["prompt"], "n_predict": 8, "temperature": 0})
    check(st == 200 and st2 == 200, "chat and /completion of the template: %s %s" % (st, st2))
    check(comp["tokens_evaluated"] == chat["usage"]["prompt_tokens"],
          "the template's prompt is the chat's: %d vs %d tokens" % (comp["tokens_evaluated"],
                                                                    chat["usage"]["prompt_tokens"]))
    check(comp["content"] == chat["choices"][0]["message"]["content"], "same greedy reply: %r vs %r"
          % (comp["content"], chat["choices"][0]["message"]["content"]))
    timings_ok(chat.get("timings"), "/v1/chat/completions", chat["usage"]["prompt_tokens"],
               chat["usage"]["completion_tokens"])
    st, bad = post(d, "/apply-template", {"messages": "hi"})
    check(st == 400, "/apply-template with bad messages is 400: %s" % st)


def check_completion(d):
    prompt = "The history of the printing press begins in the fifteenth century, when " * 3
    st, a = post(d, "/completion", {"prompt": prompt, "n_predict": 12, "temperature": 0})
    check(st == 200, "/completion: %s %s" % (st, a))
    for k in ("content", "tokens_predicted", "tokens_evaluated", "tokens_cached", "stop", "stop_type", "timings",
              "generation_settings", "model"):
        check(k in a, "/completion has %s" % k)
    check(a["stop"] is True and a["stop_type"] in ("eos", "limit") and a["tokens_predicted"] <= 12,
          "/completion end: %r" % {k: a[k] for k in ("stop", "stop_type", "tokens_predicted")})
    timings_ok(a["timings"], "/completion", a["tokens_evaluated"], a["tokens_predicted"])
    check(a["timings"]["cache_n"] == a["tokens_cached"], "cache_n is tokens_cached")
    st, b = post(d, "/completion", {"prompt": prompt, "n_predict": 12, "temperature": 0, "cache_prompt": True})
    check(st == 200 and b["content"] == a["content"], "a repeated prompt gives the same greedy reply")
    check(b["timings"]["cache_n"] > 0 and b["tokens_cached"] == b["timings"]["cache_n"],
          "a repeated prompt is cached: %r" % b["timings"])
    timings_ok(b["timings"], "/completion repeated", b["tokens_evaluated"], b["tokens_predicted"])
    ids = post(d, "/tokenize", {"content": prompt, "add_special": True})[1]["tokens"]
    st, c = post(d, "/completion", {"prompt": ids, "n_predict": 12, "temperature": 0})
    check(st == 200 and c["content"] == a["content"] and c["tokens_evaluated"] == len(ids),
          "a token-id prompt: %s %r" % (st, c.get("content")))
    check(c["tokens"] and post(d, "/detokenize", {"tokens": c["tokens"]})[1]["content"] == c["content"],
          "the reply's tokens detokenize to its content")
    ev = sse(d, "/completion", {"prompt": prompt, "n_predict": 12, "temperature": 0, "stream": True})
    check(ev and all(isinstance(e, dict) and "content" in e and "stop" in e for e in ev), "stream chunks: %r" % ev[:3])
    check("[DONE]" not in ev, "a /completion stream has no [DONE]")
    check(ev and ev[-1]["stop"] is True and all(e["stop"] is False for e in ev[:-1]), "only the last chunk stops")
    check("".join(e["content"] for e in ev) == a["content"], "the stream's text is the reply's")
    if ev:
        timings_ok(ev[-1].get("timings"), "stream final chunk", ev[-1]["tokens_evaluated"],
                   ev[-1]["tokens_predicted"])
    st, e = post(d, "/completion", {"prompt": prompt, "grammar": "root ::= \"a\""})
    check(st == 400, "a GBNF grammar is refused: %s" % st)
    st, e = post(d, "/completion", {"prompt": prompt, "id_slot": 5})
    check(st == 400, "an id_slot past the slots is 400: %s" % st)
    st, s = post(d, "/completion", {"prompt": "Say yes", "n_predict": 40, "temperature": 0, "stop": ["\n"]})
    check(st == 200 and s["stop_type"] in ("word", "eos", "limit"), "stop words: %r" % s.get("stop_type"))


def check_v1_timings(d):
    st, r = post(d, "/v1/completions", {"prompt": "One two three", "max_tokens": 6, "temperature": 0})
    check(st == 200, "/v1/completions: %s" % st)
    timings_ok(r.get("timings"), "/v1/completions", r["usage"]["prompt_tokens"], r["usage"]["completion_tokens"])
    ev = sse(d, "/v1/chat/completions", {"messages": [{"role": "user", "content": "Hi"}], "max_tokens": 6,
                                         "temperature": 0, "stream": True})
    chunks = [e for e in ev if isinstance(e, dict)]
    check(ev and ev[-1] == "[DONE]", "an OpenAI stream still ends with [DONE]")
    final = [e for e in chunks if e.get("choices") and e["choices"][0].get("finish_reason")]
    check(final and "timings" in final[-1], "the streamed finish chunk carries timings")
    check(all("timings" not in e for e in chunks if e not in final), "only the finish chunk has timings")
    if final:
        timings_ok(final[-1]["timings"], "chat stream")


def case_endpoints(build, tmp):
    d = Daemon(build, os.path.join(tmp, "data"), conf_text())
    d.start()
    try:
        check_props_slots(d, 1)
        check_tokenize(d)
        check_template(d)
        check_completion(d)
        check_v1_timings(d)
        st, r = http("GET", d.url + "/props/x")
        check(st == 404, "an unknown route is 404: %s" % st)
        st, r = http("PUT", d.url + "/props")
        check(st == 405, "PUT /props is 405: %s" % st)
    finally:
        check(d.stop() == 0, "SIGTERM exits 0")


def slot_daemon(build, data, slots_dir, model=MODEL):
    return ArgDaemon(build, data, conf_text(model), ["-np", "2", "--slot-save-path", slots_dir])


STORY = ("Once upon a time, in a quiet village by the sea, there lived an old fisherman who told stories "
         "every evening to the children who gathered on the pier. One evening he began: ")
NEXT = " The children listened. Then the smallest child asked him a question:"


def turn(d, ids, slot=0, n=24):
    st, r = post(d, "/completion", {"prompt": ids, "n_predict": n, "temperature": 0, "id_slot": slot})
    if not check(st == 200, "/completion in slot %d: %s %s" % (slot, st, r)):
        raise RuntimeError("turn failed")
    return r


def case_slots(build, tmp):
    slots = os.path.join(tmp, "slots")
    d = slot_daemon(build, os.path.join(tmp, "a"), slots)
    d.start()
    try:
        check_props_slots(d, 2)
        ids1 = post(d, "/tokenize", {"content": STORY, "add_special": True})[1]["tokens"]
        next_ids = post(d, "/tokenize", {"content": NEXT})[1]["tokens"]
        t1 = turn(d, ids1)
        check(t1["id_slot"] == 0 and t1["stop_type"] == "limit", "turn 1 ran in slot 0 to its limit: %r"
              % {k: t1[k] for k in ("id_slot", "stop_type")})
        hist = ids1 + t1["tokens"]
        st, s = post(d, "/slots/0?action=save", {"filename": "slot0.bin"})
        check(st == 200 and s["id_slot"] == 0 and s["filename"] == "slot0.bin" and s["n_saved"] == len(hist) and
              s["n_written"] == os.path.getsize(os.path.join(slots, "slot0.bin")) and "save_ms" in s["timings"],
              "save: %s %s (history %d)" % (st, s, len(hist)))
        check(s.get("kvtier", {}).get("n_blocks", 0) >= (len(hist) - 1) // BT, "the snapshot holds the KV: %r" % s)
        st, e = post(d, "/slots/1?action=save", {"filename": "empty.bin"})
        check(st == 200 and e["n_saved"] == 0, "an empty slot saves as 0 tokens: %s %s" % (st, e))
        for bad in ("../x.bin", "a/b", "..", "", "x\\y"):
            st, r = post(d, "/slots/0?action=save", {"filename": bad})
            check(st == 400, "filename %r is refused: %s" % (bad, st))
        st, r = post(d, "/slots/7?action=save", {"filename": "x.bin"})
        check(st == 400, "slot 7 of 2 is 400: %s" % st)
        st, r = post(d, "/slots/0?action=frobnicate", {"filename": "x.bin"})
        check(st == 400, "an unknown action is 400: %s" % st)
        ref = turn(d, hist + next_ids)  # the uninterrupted daemon's next turn
        st, sl = http("GET", d.url + "/slots")
        check(st == 200 and sl[0]["kvtier"]["n_tokens"] > len(hist), "slot 0's session holds the turn: %r" % sl[0])
    finally:
        check(d.stop() == 0, "SIGTERM exits 0")
    shutil.rmtree(os.path.join(tmp, "a"))

    d2 = slot_daemon(build, os.path.join(tmp, "b"), slots)  # an EMPTY data dir, the same slot files
    d2.start()
    try:
        st, r = post(d2, "/slots/0?action=restore", {"filename": "slot0.bin"})
        check(st == 200 and r["id_slot"] == 0 and r["n_restored"] == len(hist) and
              r["n_read"] == os.path.getsize(os.path.join(slots, "slot0.bin")) and "restore_ms" in r["timings"],
              "restore: %s %s" % (st, r))
        got = turn(d2, hist + next_ids)
        full = (len(hist) - 1) // BT * BT  # the last generated token's K/V was never computed
        check(got["tokens_cached"] >= full and got["timings"]["cache_n"] == got["tokens_cached"],
              "the restored history is not prefilled again: cached %d of %d history tokens"
              % (got["tokens_cached"], len(hist)))
        check(got["tokens_cached"] == ref["tokens_cached"], "as cached as the uninterrupted daemon: %d vs %d"
              % (got["tokens_cached"], ref["tokens_cached"]))
        check(got["content"] == ref["content"] and got["tokens"] == ref["tokens"],
              "the restored slot replies as the uninterrupted daemon: %r vs %r" % (got["content"], ref["content"]))
        st, r = post(d2, "/slots/1?action=restore", {"filename": "nope.bin"})
        check(st == 400, "restoring a missing file is 400: %s %s" % (st, r))
        st, r = post(d2, "/slots/0?action=erase", {})
        check(st == 200 and r["id_slot"] == 0 and r["n_erased"] > len(hist), "erase: %s %s" % (st, r))
        st, sl = http("GET", d2.url + "/slots")
        check(sl[0]["kvtier"]["n_tokens"] == 0, "an erased slot is empty: %r" % sl[0])
    finally:
        check(d2.stop() == 0, "SIGTERM exits 0")


def case_nvme(build, tmp):
    """A slot saved after a restart: its blocks are read from the NVMe tier's records."""
    slots = os.path.join(tmp, "slots")
    d = slot_daemon(build, os.path.join(tmp, "a"), slots)
    d.start()
    try:
        ids = post(d, "/tokenize", {"content": STORY, "add_special": True})[1]["tokens"]
        hist = ids + turn(d, ids, slot=1)["tokens"]
        next_ids = post(d, "/tokenize", {"content": NEXT})[1]["tokens"]
    finally:
        check(d.stop() == 0, "SIGTERM exits 0 (the blocks are flushed to NVMe)")
    d.start()  # the same data dir: the table comes back from the index, the blocks are in T2 only
    try:
        st, s = post(d, "/slots/1?action=save", {"filename": "nvme.bin"})
        check(st == 200 and s["n_saved"] == len(hist) and s["kvtier"]["n_blocks"] == (len(hist) - 1) // BT,
              "a save after a restart holds the blocks from NVMe: %s %s" % (st, s))
        ref = turn(d, hist + next_ids, slot=1)
    finally:
        check(d.stop() == 0, "SIGTERM exits 0")
    d2 = slot_daemon(build, os.path.join(tmp, "b"), slots)
    d2.start()
    try:
        st, r = post(d2, "/slots/1?action=restore", {"filename": "nvme.bin"})
        check(st == 200 and r["kvtier"]["n_blocks"] == (len(hist) - 1) // BT, "restore: %s %s" % (st, r))
        got = turn(d2, hist + next_ids, slot=1)
        check(got["tokens_cached"] == ref["tokens_cached"] and got["content"] == ref["content"],
              "restored from NVMe records: cached %d vs %d, %r vs %r" % (got["tokens_cached"], ref["tokens_cached"],
                                                                         got["content"], ref["content"]))
    finally:
        check(d2.stop() == 0, "SIGTERM exits 0")


def case_refusals(build, tmp):
    slots = os.path.join(tmp, "slots")
    d = slot_daemon(build, os.path.join(tmp, "a"), slots)
    d.start()
    try:
        ids = post(d, "/tokenize", {"content": STORY, "add_special": True})[1]["tokens"]
        turn(d, ids, n=8)
        st, s = post(d, "/slots/0?action=save", {"filename": "good.bin"})
        check(st == 200 and s["kvtier"]["n_blocks"] > 0, "save: %s %s" % (st, s))
        raw = open(os.path.join(slots, "good.bin"), "rb").read()
        bad = bytearray(raw)
        bad[len(bad) // 2] ^= 0x40  # one flipped bit inside a block record
        open(os.path.join(slots, "tampered.bin"), "wb").write(bad)
        open(os.path.join(slots, "junk.bin"), "wb").write(b"not a slot file at all" * 10)
        open(os.path.join(slots, "short.bin"), "wb").write(raw[:len(raw) // 3])
        for name, want in (("tampered.bin", "checksum"), ("junk.bin", "not a kvtier slot file"),
                           ("short.bin", "checksum")):
            st, r = post(d, "/slots/1?action=restore", {"filename": name})
            msg = r.get("error", {}).get("message", "") if isinstance(r, dict) else ""
            check(st == 400 and want in msg, "%s is refused with a clear 400: %s %r" % (name, st, msg))
        st, sl = http("GET", d.url + "/slots")
        check(sl[1]["kvtier"]["n_tokens"] == 0, "a refused restore leaves the slot as it was")
    finally:
        check(d.stop() == 0, "SIGTERM exits 0")
    if not os.path.exists(GEMMA):
        print("note: no Gemma 3 270M in models/: the other-model refusal is not tested")
        return
    g = slot_daemon(build, os.path.join(tmp, "g"), slots, model=GEMMA)
    g.start()
    try:
        st, r = post(g, "/slots/0?action=restore", {"filename": "good.bin"})
        msg = r.get("error", {}).get("message", "") if isinstance(r, dict) else ""
        check(st == 400 and "another model" in msg, "a snapshot of another model is refused: %s %r" % (st, msg))
    finally:
        check(g.stop() == 0, "SIGTERM exits 0")


def free_port():
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()
    return port


def case_flags(build, tmp):
    """A llama-server command line starts kvtierd (the data dir from $KVTIER_CONFIG's file)."""
    data = os.path.join(tmp, "data")
    os.makedirs(data)
    conf = os.path.join(data, "kvtier.conf")
    with open(conf, "w") as f:  # only what llama-server has no flag for: the data dir, the small tiers
        f.write("[model]\ndevice = cpu\n[tier.hbm]\ncapacity = 64M\n[tier.host]\ncapacity = 64M\n"
                "[tier.nvme]\ncapacity = 64M\n[index]\ndata_dir = %s\n" % data)
    port = free_port()
    argv = [os.path.join(build, "kvtierd"), "-m", MODEL, "--host", "127.0.0.1", "--port", str(port), "-c", "2048",
            "-t", "2", "-np", "2", "--api-key", "K1,K2"]
    env = dict(os.environ, KVTIER_CONFIG=conf)
    log = os.path.join(data, "kvtierd.log")
    p = subprocess.Popen(argv, env=env, stdout=open(log, "w"), stderr=subprocess.STDOUT)
    url = "http://127.0.0.1:%d" % port
    try:
        deadline = time.time() + 300
        while time.time() < deadline and p.poll() is None:
            try:
                if http("GET", url + "/health", timeout=5)[0] == 200:
                    break
            except OSError:
                pass
            time.sleep(0.2)
        if not check(p.poll() is None, "kvtierd runs with llama-server's flags:\n" + open(log).read()[-2000:]):
            return
        st, r = http("GET", url + "/props")
        check(st == 401, "with --api-key, /props needs the key: %s" % st)
        for k in ("K1", "K2"):
            st, r = http("GET", url + "/props", headers={"Authorization": "Bearer " + k})
            check(st == 200 and r["total_slots"] == 2 and r["default_generation_settings"]["n_ctx"] == 2048,
                  "-np 2 -c 2048 with key %s: %s %s" % (k, st, r))
        st, r = http("POST", url + "/completion", {"prompt": "Hello", "n_predict": 4},
                     {"Authorization": "Bearer K1"})
        check(st == 200 and r["tokens_predicted"] >= 1, "/completion with the key: %s %s" % (st, r))
    finally:
        p.terminate()
        check(p.wait(120) == 0, "SIGTERM exits 0")
    rc = subprocess.run([os.path.join(build, "kvtierd"), "--no-such-flag", "1"], env=env,
                        capture_output=True, text=True)
    check(rc.returncode == 64 and "unknown option --no-such-flag" in rc.stderr,
          "an unknown flag fails clearly: %d %r" % (rc.returncode, rc.stderr[:200]))
    rc = subprocess.run([os.path.join(build, "kvtierd"), "-np", "0", "--check-config"], env=env,
                        capture_output=True, text=True)
    check(rc.returncode == 64 and "parallel" in rc.stderr, "-np 0 is refused naming the key: %r" % rc.stderr[:200])


CASES = {"endpoints": case_endpoints, "slots": case_slots, "nvme": case_nvme, "refusals": case_refusals,
         "flags": case_flags}

if __name__ == "__main__":
    sys.exit(run_cases("llama_api", __doc__, MODEL, CASES))
