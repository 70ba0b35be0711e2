"""bench/bench_lossy.py — what an 8-bit host tier trades: greedy agreement with the cache off.

    bench_lossy.py BUILD [--conversations 100] [--codecs fp8,int8] [--max-tokens 24] [--model M.gguf]

For each codec, kvtierd (that [tier.host] dtype, the default model unless --model) answers
turn 1 of N two-turn conversations with a session each, is stopped (SIGTERM: every block
persisted to NVMe in that codec) and restarted, and answers turn 2: its whole history then
comes from the 8-bit records (T2 -> T1 -> T0), reported as usage.kvtier.lossy_cached_tokens.
A kvtierd with the cache off answers the same turn-2 messages (turn 1 is computed afresh in
both, so its replies are the same). Printed per codec: the conversations whose turn-2 reply
equals the cache-off one (greedy agreement), whose first token agrees, the cached and lossy
tokens. Data dirs (256 MiB NVMe tier: room for every block) are removed at the end.
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


def conversation(i):
    """The two user turns of conversation i (deterministic)."""
    a, b = TOPICS[i % len(TOPICS)], TOPICS[(i * 7 + 3) % len(TOPICS)]
    u1 = ASKS[(i // len(TOPICS)) % len(ASKS)] % a
    f = FOLLOW[i % len(FOLLOW)]
    return u1, (f % b if "%s" in f else f)


def chat(d, messages, session, max_tokens):
    body = {"messages": messages, "max_tokens": max_tokens, "temperature": 0}
    if session:
        body["session_id"] = session
    st, r = http("POST", d.url + "/v1/chat/completions", body, timeout=300)
    if st != 200:
        raise RuntimeError("status %s: %s" % (st, r))
    return r


def conf(model, data, host_dtype, cache=True):
    return ("[server]\nlisten = 127.0.0.1:0\n[model]\npath = %s\ndevice = cpu\ncontext = 2048\n"
            "[cache]\nenabled = %s\n[tier.hbm]\ncapacity = 256M\n[tier.host]\ncapacity = 256M\ndtype = %s\n"
            "[tier.nvme]\ncapacity = 256M\n[index]\ndata_dir = %s\n"
            % (model, "true" if cache else "false", host_dtype, data))


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("build")
    ap.add_argument("--conversations", type=int, default=100)
    ap.add_argument("--codecs", default="fp8,int8")
    ap.add_argument("--max-tokens", type=int, default=24)
    ap.add_argument("--model", default=os.path.join(ROOT, "models", "SmolLM2-135M-Instruct.Q4_1.gguf"))
    a = ap.parse_args()
    build = os.path.abspath(a.build)
    model = os.path.abspath(a.model)
    tmp = tempfile.mkdtemp(prefix="kvt_bench_lossy_")
    n = a.conversations
    print(json.dumps({"bench": "lossy", "machine": platform.machine(), "cpus": os.cpu_count(),
                      "model": os.path.basename(model), "conversations": n, "max_tokens": a.max_tokens}), flush=True)
    try:
        turn2 = {}  # codec -> list of (messages, reply, usage)
        for codec in a.codecs.split(","):
            t0 = time.time()
            data = os.path.join(tmp, "data-" + codec)
            d = Daemon(build, os.path.join(tmp, "conf-" + codec), conf(model, data, codec))
            d.start()
            hist = []
            try:
                for i in range(n):
                    u1, _ = conversation(i)
                    r = chat(d, [{"role": "user", "content": u1}], "c%d" % i, a.max_tokens)
                    hist.append([{"role": "user", "content": u1},
                                 {"role": "assistant", "content": r["choices"][0]["message"]["content"]}])
            finally:
                d.stop()  # SIGTERM: every session's blocks persisted in this codec
            d.start()
            out = []
            try:
                for i in range(n):
                    _, u2 = conversation(i)
                    msgs = hist[i] + [{"role": "user", "content": u2}]
                    r = chat(d, msgs, "c%d" % i, a.max_tokens)
                    out.append((msgs, r["choices"][0]["message"]["content"], r["usage"]))
            finally:
                d.stop()
            turn2[codec] = out
            print(json.dumps({"bench": "lossy", "codec": codec, "phase": "served", "seconds": round(time.time() - t0, 1)}),
                  flush=True)
        # the reference: cache off, the same turn-2 messages (turn 1 is computed afresh everywhere, so the same)
        first = next(iter(turn2.values()))
        d = Daemon(build, os.path.join(tmp, "conf-off"), conf(model, os.path.join(tmp, "data-off"), "f16", cache=False))
        d.start()
        ref = []
        try:
            for msgs, _, _ in first:
                ref.append(chat(d, msgs, None, a.max_tokens)["choices"][0]["message"]["content"])
        finally:
            d.stop()
        for codec, out in turn2.items():
            same_hist = all(out[i][0] == first[i][0] for i in range(n))
            agree = sum(out[i][1] == ref[i] for i in range(n))
            first_word = sum((out[i][1].split()[:1] == ref[i].split()[:1]) for i in range(n))
            cached = sum(u["prompt_tokens_details"]["cached_tokens"] for _, _, u in out)
            lossy = sum(u["kvtier"]["lossy_cached_tokens"] for _, _, u in out)
            print(json.dumps({"bench": "lossy", "codec": codec, "conversations": n, "same_turn1": same_hist,
                              "greedy_agreement": round(agree / n, 3), "agree": agree,
                              "first_word_agreement": round(first_word / n, 3), "cached_tokens": cached,
                              "lossy_cached_tokens": lossy}), flush=True)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
