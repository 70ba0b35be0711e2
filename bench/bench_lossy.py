"""bench/bench_lossy.py — what an 8-bit host/NVMe tier trades: whole greedy replies against the cache off.

    bench_lossy.py BUILD [--n 100] [--codecs f16,fp8,int8] [--modes restart,t1] [--tokens 24,64]
                         [--model M.gguf] [--nvme-dtype same|f16] [--hbm 16M] [--out FILE]

For each codec ([tier.host] dtype) and mode, N two-turn conversations (a session each):
  restart: kvtierd answers turn 1 of every conversation, is stopped (SIGTERM: every block
           persisted to NVMe) and restarted, and answers turn 2: its whole history comes
           from the NVMe records (T2 -> T1 -> T0);
  t1:      one kvtierd with a small T0 ([tier.hbm] capacity --hbm) and [cache] persist =
           write_back (with end_of_turn a block leaving T0 is already on NVMe and is dropped,
           so T1 would not hold it) answers turn 1 of every
           conversation, then turn 2 of every one in the same process: by then each
           history's blocks have been pushed out of T0 into the host tier (T1) by the
           conversations after it, and three unrelated prompts push out the rest, so turn 2 is a T1 -> T0 promote
           of the packed blocks (cached_host in the output says how many tokens were);
  evict:   as t1, with the shipped [cache] persist = end_of_turn: a block is on NVMe when it
           leaves T0, so it is dropped there, and turn 2 in the same process comes from the
           NVMe records (cached_nvme) — what an in-process eviction serves on the shipped config.
Turn 2 asks for max(--tokens) greedy tokens with logprobs, so each reply is a token list.
A kvtierd with the cache off answers the same turn-2 messages (each distinct history once).
Reported per codec and mode, for every length in --tokens: the conversations whose first
L reply tokens equal the cache-off ones (whole-reply agreement at L; a reply that ended
earlier must end at the same token), the first-word agreement, the mean and minimum first
divergence position among the replies that differ, the cached tokens by tier and the lossy
ones (usage.kvtier.lossy_cached_tokens). --nvme-dtype sets [tier.nvme] dtype: same (the
NVMe records in the host format, the default here) or f16 (the NVMe copy kept in f16 while
T1 keeps the 8-bit one: the shipped default). Data dirs (512 MiB NVMe) are removed.
JSON lines on stdout (and appended to --out).
"""
import argparse
import json
import os
import platform
import shutil
import sys
import tempfile
import time

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "tests", "daemon"))
from kvtierd_proc import Daemon, http  # noqa: E402

ROOT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..")
TOPICS = ["the sea", "mountains", "rivers", "deserts", "forests", "the moon", "volcanoes", "glaciers", "islands",
          "caves", "rain", "snow", "wind", "bees", "owls", "whales", "wolves", "ants", "horses", "cats"]
ASKS = ["Write two sentences about %s.", "Give three facts about %s.", "Describe %s to a child.",
        "What is surprising about %s?", "Write a short poem about %s."]
FOLLOW = ["Now say it in fewer words.", "Which of those is most important, and why?", "Add one more detail.",
          "Summarize your answer in one sentence.", "Say the same about %s."]
TURN1_TOKENS = 24


def conversation(i):
    """The two user turns of conversation i (deterministic)."""
    a, b = TOPICS[i % len(TOPICS)], TOPICS[(i * 7 + 3) % len(TOPICS)]
    u1 = ASKS[(i // len(TOPICS)) % len(ASKS)] % a
    f = FOLLOW[i % len(FOLLOW)]
    return u1, (f % b if "%s" in f else f)


def chat(d, messages, session, max_tokens, logprobs=False):
    body = {"messages": messages, "max_tokens": max_tokens, "temperature": 0}
    if logprobs:
        body["logprobs"] = True
    if session:
        body["session_id"] = session
    st, r = http("POST", d.url + "/v1/chat/completions", body, timeout=600)
    if st != 200:
        raise RuntimeError("status %s: %s" % (st, r))
    return r


def reply_tokens(r):
    """The reply as its token strings, and whether it ended before max_tokens."""
    ch = r["choices"][0]
    toks = [t["token"] for t in (ch.get("logprobs") or {}).get("content") or []]
    return toks, ch.get("finish_reason") != "length"


ACTIVATIONS = ""  # [model] activations (--activations; "" = the shipped default)


def conf(model, data, host_dtype, cache=True, hbm="256M", nvme_dtype="same", persist="end_of_turn"):
    nv = "dtype = %s\n" % nvme_dtype
    act = "activations = %s\n" % ACTIVATIONS if ACTIVATIONS else ""
    return ("[server]\nlisten = 127.0.0.1:0\n[model]\npath = %s\ndevice = cpu\ncontext = 512\n%s"
            "[cache]\nenabled = %s\npersist = %s\n[tier.hbm]\ncapacity = %s\n[tier.host]\ncapacity = 512M\ndtype = %s\n"
            "[tier.nvme]\ncapacity = 512M\n%s[index]\ndata_dir = %s\n"
            % (model, act, "true" if cache else "false", persist, hbm, host_dtype, nv, data))


def turn1_all(d, n):
    hist = []
    for i in range(n):
        u1, _ = conversation(i)
        r = chat(d, [{"role": "user", "content": u1}], "c%d" % i, TURN1_TOKENS)
        hist.append([{"role": "user", "content": u1},
                     {"role": "assistant", "content": r["choices"][0]["message"]["content"]}])
    return hist


def push_out_of_t0(d):
    """Three unrelated ~350-token prompts: more than the small T0 holds, so every history is in T1 after."""
    with open(os.path.join(ROOT, "bench", "data", "devils_dictionary.txt")) as f:
        words = f.read().split()
    for k in range(3):
        chat(d, [{"role": "user", "content": " ".join(words[k * 260:(k + 1) * 260])}], None, 1)


def turn2_all(d, hist, max_tokens):
    out = []
    for i, h in enumerate(hist):
        _, u2 = conversation(i)
        msgs = h + [{"role": "user", "content": u2}]
        r = chat(d, msgs, "c%d" % i, max_tokens, logprobs=True)
        out.append((msgs, reply_tokens(r), r["usage"]))
    return out


def run_mode(a, build, model, tmp, codec, mode, max_tokens):
    """Turn-2 results of one codec in one mode: [(messages, (tokens, ended), usage)]."""
    tag = "%s-%s" % (codec, mode)
    data = os.path.join(tmp, "data-" + tag)
    hbm = a.hbm if mode in ("t1", "evict") else "256M"
    nv = a.nvme_dtype
    d = Daemon(build, os.path.join(tmp, "conf-" + tag), conf(model, data, codec, hbm=hbm, nvme_dtype=nv,
                                                                 persist="write_back" if mode == "t1" else "end_of_turn"))
    d.start()
    try:
        hist = turn1_all(d, a.n)
        if mode == "restart":
            d.stop()  # SIGTERM: every session's blocks persisted
            d.start()
        else:
            push_out_of_t0(d)
        return turn2_all(d, hist, max_tokens)
    finally:
        d.stop()
        shutil.rmtree(data, ignore_errors=True)


def agree_at(out, ref, L):
    """Whole-reply agreement at L tokens: the first L tokens equal (or both replies ended equal before L)."""
    (t, e), (rt, re_) = out, ref
    a, b = t[:L], rt[:L]
    if a != b:
        return False
    if len(a) < L:  # one ended before L: the other must end at the same place
        return e and re_ and len(t) == len(rt)
    return True


def first_div(out, ref):
    t, rt = out[0], ref[0]
    for k in range(min(len(t), len(rt))):
        if t[k] != rt[k]:
            return k
    return None if len(t) == len(rt) else min(len(t), len(rt))


def summarize(a, codec, mode, out, refs, lengths, model, seconds):
    n = len(out)
    row = {"bench": "lossy", "model": os.path.basename(model), "codec": codec, "mode": mode,
           "nvme_dtype": a.nvme_dtype, "activations": ACTIVATIONS or "default", "conversations": n, "seconds": round(seconds, 1)}
    refl = [refs[json.dumps(m)] for m, _, _ in out]
    for L in lengths:
        row["agree_%d" % L] = sum(agree_at(out[i][1], refl[i], L) for i in range(n))
    row["first_word"] = sum("".join(out[i][1][0]).split()[:1] == "".join(refl[i][0]).split()[:1] for i in range(n))
    divs = [first_div(out[i][1], refl[i]) for i in range(n)]
    divs = [x for x in divs if x is not None]
    row["n_diverged"] = len(divs)
    row["first_divergence_mean"] = round(sum(divs) / len(divs), 1) if divs else None
    row["first_divergence_min"] = min(divs) if divs else None
    row["cached_tokens"] = sum(u["prompt_tokens_details"]["cached_tokens"] for _, _, u in out)
    for t in ("hbm", "host", "nvme"):
        row["cached_" + t] = sum(u["kvtier"]["cached_tokens_by_tier"][t] for _, _, u in out)
    row["lossy_cached_tokens"] = sum(u["kvtier"]["lossy_cached_tokens"] for _, _, u in out)
    return row


def emit(a, row):
    line = json.dumps(row)
    print(line, flush=True)
    if a.out:
        with open(a.out, "a") as f:
            f.write(line + "\n")


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("build")
    ap.add_argument("--n", "--conversations", dest="n", type=int, default=100)
    ap.add_argument("--codecs", default="f16,fp8,int8")
    ap.add_argument("--modes", default="restart,t1")
    ap.add_argument("--tokens", default="24,64")
    ap.add_argument("--hbm", default="16M", help="[tier.hbm] capacity in t1 mode (small: histories leave T0)")
    ap.add_argument("--nvme-dtype", default="same", choices=["same", "f16"])
    ap.add_argument("--model", default=os.path.join(ROOT, "models", "SmolLM2-135M-Instruct.Q4_1.gguf"))
    ap.add_argument("--out", default=None)
    ap.add_argument("--activations", default="", choices=["", "int8", "int16"],
                    help="[model] activations of every daemon (both sides); default: the shipped default")
    a = ap.parse_args()
    global ACTIVATIONS
    ACTIVATIONS = a.activations
    build, model = os.path.abspath(a.build), os.path.abspath(a.model)
    lengths = [int(x) for x in a.tokens.split(",")]
    max_tokens = max(lengths)
    tmp = tempfile.mkdtemp(prefix="kvt_bench_lossy_")
    emit(a, {"bench": "lossy", "machine": platform.machine(), "cpus": os.cpu_count(), "model": os.path.basename(model),
             "conversations": a.n, "tokens": lengths, "turn1_tokens": TURN1_TOKENS, "hbm_t1": a.hbm})
    try:
        results = []
        # alternate codecs within each mode, so machine load drifts hit every codec alike
        for mode in a.modes.split(","):
            for codec in a.codecs.split(","):
                t0 = time.time()
                results.append((codec, mode, run_mode(a, build, model, tmp, codec, mode, max_tokens), time.time() - t0))
        # the reference: cache off, each distinct turn-2 history once
        refs = {}
        d = Daemon(build, os.path.join(tmp, "conf-off"), conf(model, os.path.join(tmp, "data-off"), "f16", cache=False))
        d.start()
        try:
            for _, _, out, _ in results:
                for msgs, _, _ in out:
                    k = json.dumps(msgs)
                    if k not in refs:
                        refs[k] = reply_tokens(chat(d, msgs, None, max_tokens, logprobs=True))
        finally:
            d.stop()
        for codec, mode, out, secs in results:
            emit(a, summarize(a, codec, mode, out, refs, lengths, model, secs))
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
