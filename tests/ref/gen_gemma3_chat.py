#!/usr/bin/env python3
"""tests/ref/gen_gemma3_chat.py — llama.cpp's greedy reply to one Gemma 3 chat turn.

Writes tests/ref/gemma3_chat_ref.json for tests/daemon/test_gemma3_daemon.py's
model case: the chat turn rendered in Gemma's turn format (llama.cpp's built-in
gemma template, as tests/ref/gemma3_tokenizer_ref.tsv's chats), tokenized with
BOS and specials, its prompt ids, and llama.cpp's greedy continuation (ids and
text). Gemma 3 270M is a base model, so the reply is not a sensible answer; it
is what the weights say, which is what the daemon must say too.

Run with the llama-cpp-python 0.3.16 venv (~5 s):
    /work/venv-llama/bin/python tests/ref/gen_gemma3_chat.py [--model PATH]
"""
import argparse
import hashlib
import json
import os

import llama_cpp
from llama_cpp import Llama

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
USER = "Say hello in one short sentence."
N_GEN = 16


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", default=os.path.join(ROOT, "models", "gemma-3-270m-q4_k_m.gguf"))
    ap.add_argument("--out", default=os.path.join(ROOT, "tests", "ref", "gemma3_chat_ref.json"))
    a = ap.parse_args()
    m = Llama(model_path=a.model, n_ctx=512, n_threads=2, verbose=False)
    text = "<start_of_turn>user\n%s<end_of_turn>\n<start_of_turn>model\n" % USER
    ids = m.tokenize(text.encode(), add_bos=True, special=True)
    m.reset()
    m.eval(ids)
    out = []
    for _ in range(N_GEN):
        t = m.sample(temp=0.0)
        out.append(int(t))
        m.eval([t])
    with open(a.model, "rb") as f:
        sha = hashlib.sha256(f.read()).hexdigest()
    ref = {"generator": "tests/ref/gen_gemma3_chat.py", "llama_cpp_python": llama_cpp.__version__,
           "model_sha256": sha, "user": USER, "prompt": text, "prompt_ids": ids, "greedy_ids": out,
           "greedy_text": m.detokenize(out).decode("utf-8", "replace")}
    with open(a.out, "w") as f:
        json.dump(ref, f, indent=1)
        f.write("\n")
    print("wrote", a.out, out)


if __name__ == "__main__":
    main()
