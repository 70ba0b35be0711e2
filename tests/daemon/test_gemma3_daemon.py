#!/usr/bin/env python3
"""tests/daemon/test_gemma3_daemon.py — kvtierd end to end on Gemma 3 270M.

The conversation and kill9 cases of test_daemon.py, on the real Gemma 3 270M
(Q4_K_M; SentencePiece vocabulary, Gemma's chat turns, sliding-window
layers, weights kept as stored) instead of the default model:

  model          /v1/models names the Gemma file, and a chat turn (Gemma's turn
                 format, BOS first) gets llama.cpp's greedy reply to the same
                 rendered prompt (tests/ref/gemma3_chat_ref.json; the 270M model is
                 a base model, so the reply is what the weights say, not an answer)
  conversation   6 chat turns in one session: each turn's cached_tokens equals
                 the full blocks of the previous turn's prompt and reply
  kill9          kill -9 in the middle of a conversation, restart, `kvtier
                 resume`: the next turn is served from the persisted blocks
                 (restored from NVMe) and, with fp16 tiers, says what an
                 uninterrupted daemon says

Usage: test_gemma3_daemon.py BUILD_DIR [CASE ...]. Exit 0 pass, 1 fail, 77 skip
(no Gemma 3 GGUF: scripts/fetch_model.sh fetches it).
"""
import json
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import test_daemon  # noqa: E402
from kvtierd_proc import check, http, run_cases  # noqa: E402

MODEL = os.path.join(test_daemon.ROOT, "models", "gemma-3-270m-q4_k_m.gguf")
test_daemon.MODEL = MODEL  # the cases' daemons load this model



def case_model(build, tmp):
    with open(os.path.join(test_daemon.ROOT, "tests", "ref", "gemma3_chat_ref.json")) as f:
        ref = json.load(f)
    d = test_daemon.daemon(build, tmp)
    d.start()
    try:
        st, r = http("GET", d.url + "/v1/models")
        check(st == 200 and any("gemma" in m["id"] for m in r["data"]), "/v1/models names Gemma: %s" % r)
        r = test_daemon.chat(d, [{"role": "user", "content": ref["user"]}], max_tokens=len(ref["greedy_ids"]))
        check(r["usage"]["prompt_tokens"] == len(ref["prompt_ids"]),
              "the chat turn is %d prompt tokens, llama.cpp's gemma rendering %d"
              % (r["usage"]["prompt_tokens"], len(ref["prompt_ids"])))
        text = r["choices"][0]["message"]["content"]
        check(text == ref["greedy_text"], "the greedy reply differs from llama.cpp's:\n%r\n%r" % (text, ref["greedy_text"]))
    finally:
        check(d.stop() == 0, "SIGTERM exits 0")


CASES = {"model": case_model, "conversation": test_daemon.case_conversation, "kill9": test_daemon.case_kill9}


def main():
    return run_cases("gemma3_daemon", __doc__, MODEL, CASES)


if __name__ == "__main__":
    sys.exit(main())
