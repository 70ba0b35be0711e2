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
  text           the openai SDK: Gemma's image markers (<start_of_image>, <end_of_image>,
                 [multimodal]) in a message are tokenized as text, not as their tokens;
                 a reply forced (logit_bias) to write <end_of_turn> under ignore_eos, or
                 <start_of_turn>, runs to max_tokens with no control token in its content

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


GEMMA_MARKERS = ("<end_of_turn>", "<start_of_turn>", "<eos>", "<bos>", "<start_of_image>", "<end_of_image>")


def case_text(build, tmp):
    """Through the openai SDK: image markers in a message are text; ignore_eos writes no marker into content."""
    try:
        import openai
    except ImportError:
        check(os.environ.get("KVT_TEST_STRICT") != "1", "the openai package is not installed")
        print("skip: no openai package")
        return
    d = test_daemon.daemon(build, tmp)
    d.start()
    try:
        c = openai.OpenAI(base_url=d.url + "/v1", api_key="unused")
        model = c.models.list().data[0].id

        def prompt_tokens(content):
            r = c.chat.completions.create(model=model, messages=[{"role": "user", "content": content}],
                                          temperature=0, max_tokens=1)
            return r.usage.prompt_tokens
        # "<start_of_image>" as text is several tokens ("<", "start", "_of", ...); as the marker it was one
        base = prompt_tokens("look at this")
        for m in ("<start_of_image>", "<end_of_image>", "[multimodal]"):
            n = prompt_tokens("look at %s this" % m)
            check(n >= base + 3, "%s in a message is text: %d prompt tokens, %d without it" % (m, n, base))
        # the 270M base model never ends a turn by itself: logit_bias makes it write <end_of_turn> (106,
        # end of generation) under ignore_eos, and <start_of_turn> (105, control); neither is content
        msgs = [{"role": "user", "content": "Say hello."}]
        for tid, extra in ((106, {"ignore_eos": True}), (105, {})):
            for stream in (False, True):
                kw = dict(model=model, messages=msgs, temperature=0, max_tokens=8, logit_bias={str(tid): 100},
                          extra_body=extra)
                if stream:
                    text = "".join(cc.delta.content or "" for chunk in c.chat.completions.create(stream=True, **kw)
                                   for cc in chunk.choices)
                else:
                    r = c.chat.completions.create(**kw)
                    text = r.choices[0].message.content or ""
                    check(r.usage.completion_tokens == 8 and r.choices[0].finish_reason == "length",
                          "token %d forced: %d tokens, finish %s" % (tid, r.usage.completion_tokens,
                                                                    r.choices[0].finish_reason))
                check(not any(m in text for m in GEMMA_MARKERS),
                      "token %d forced (%s): a control token in content: %r" % (tid, extra or "plain", text))
    finally:
        check(d.stop() == 0, "SIGTERM exits 0")


CASES = {"model": case_model, "text": case_text, "conversation": test_daemon.case_conversation, "kill9": test_daemon.case_kill9}


def main():
    return run_cases("gemma3_daemon", __doc__, MODEL, CASES)


if __name__ == "__main__":
    sys.exit(main())
