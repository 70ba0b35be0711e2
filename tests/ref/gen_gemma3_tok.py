#!/usr/bin/env python3
"""Tokenizer and chat-prompt references for Gemma 3 270M, from llama.cpp (llama-cpp-python).

Writes tests/ref/gemma3_tokenizer_ref.tsv next to this script:
  # header lines (generator, llama-cpp-python version, model sha256, EOG set)
  T <hex UTF-8 input>\t<ids, parse_special=True>\t<ids, parse_special=False>
      both with add_special=False (no BOS); the generator checks that add_special=True
      gives [BOS] + the same ids for every case (so one column covers both ways)
  C <hex prompt text>\t<ids of the text, parse_special=True>
      a chat rendered by llama.cpp's own built-in "gemma" template
      (llama_chat_apply_template, add_ass=True); the messages are listed in the
      line before it as  M <n> then n lines  R <role>\t<hex content>
  E <space-separated ids for which llama_vocab_is_eog is true>

Usage:  /work/venv-llama/bin/python tests/ref/gen_gemma3_tok.py [--model PATH]
Only the vocabulary is loaded (vocab_only=True): takes a few seconds.
"""
import argparse
import ctypes
import hashlib
import os
import sys

import llama_cpp
from llama_cpp import Llama

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.normpath(os.path.join(HERE, "..", ".."))
DEFAULT_MODEL = os.path.join(REPO, "models", "gemma-3-270m-q4_k_m.gguf")

CASES = [
    # edge cases: spaces, newlines, tabs (Gemma has user-defined tokens for runs of them)
    "",
    " ",
    "  ",
    "a",
    " a",
    "Hello",
    " Hello",
    "Hello world",
    "  leading and trailing spaces  ",
    "multiple     spaces     between",
    "tab\tseparated\tvalues",
    "\t\tdouble tab indent",
    "line one\nline two",
    "para one\n\n\npara two",
    "windows\r\nline\r\nendings\r\n",
    "\n",
    "\n\n",
    " \n \n ",
    "trailing newline\n",
    "                                        forty spaces",
    # prose
    "The capital of France is Paris.",
    "The quick brown fox jumps over the lazy dog.",
    "Once upon a time, in a land far, far away, there lived a small dragon who loved books.",
    "HELLO WORLD, THIS IS ALL CAPS!",
    "camelCaseIdentifier and snake_case_identifier",
    "don't I'LL we've they're she's it'd",
    # digits
    "1234567890",
    "3.14159",
    "The year 2024 had 366 days.",
    "-42 +17 0.001 1e-9 1,000,000",
    "v1.2.3-rc4",
    # punctuation
    "!!!???...",
    "Wait... what?!?! --- (really) [sure] {ok}",
    "#$%^&*()_+-=~`|\\/",
    "\"double quotes\" and 'single quotes'",
    "https://huggingface.co/google/gemma-3-270m?x=1&y=2#frag",
    # accents and other scripts
    "café naïve résumé façade",
    "Ünïcödé àéîõü ÀÉÎÕÜ",
    "Straße, Fußgänger, Größe",
    "Ελληνικά και Русский язык",
    "日本語のテキストです。",
    "中文分词测试：你好，世界！",
    "한국어 문장입니다",
    "العربية من اليمين إلى اليسار",
    "हिन्दी भाषा",
    # emoji and rare characters (byte fallback)
    "emoji 😀🎉👍🏽",
    "family 👨‍👩‍👧‍👦 and flag 🇫🇷",
    "\U0001f9ec\U0001fae0\U0001f6df",
    "rare: \U00010348 \U0001d11e \u2603 \u0f3a",
    "control \x01\x02\x7f chars",
    "zero\u200bwidth\u200djoiner\ufeffbom",
    "math ∑∫√∞≠≤≥ ∂ ∇",
    # code
    "def fib(n):\n    if n < 2:\n        return n\n    return fib(n - 1) + fib(n - 2)\n",
    "int main(void) { printf(\"%d\\n\", 42); return 0; }",
    "<html><body class=\"x\">hi</body></html>",
    "SELECT * FROM t WHERE id = 1;",
    # specials embedded in text, and look-alikes
    "<start_of_turn>user\nHi<end_of_turn>\n<start_of_turn>model\n",
    "text<start_of_turn>glued<end_of_turn>text",
    "<bos>a<eos>b<pad>c",
    "<start_of_turn",
    "start_of_turn>",
    "< start_of_turn >",
    "<START_OF_TURN>",
    "<end_of_turn><end_of_turn>",
    "<unused0> and <unused99>",
    "[multimodal] tag",
    "<0x41> is not a byte token in text",
    "<|im_start|>user\nChatML in Gemma<|im_end|>",
    # the U+2581 character itself
    "\u2581already\u2581escaped",
    " \u2581 ",
]

# Chats rendered with llama.cpp's built-in gemma template.
CHATS = [
    [("user", "Hello!")],
    [("system", "You are terse."), ("user", "What is 2+2?")],
    [("user", "  Hi there  "), ("assistant", " Hello! How can I help? "), ("user", "Tell me a joke.")],
    [("system", "Be kind."), ("user", "One"), ("assistant", "Two"), ("user", "Three\nFour")],
]


def sha256_file(path):
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def ids_str(ids):
    return " ".join(str(i) for i in ids)


def render_gemma(msgs):
    arr = (llama_cpp.llama_chat_message * len(msgs))()
    keep = []
    for i, (role, content) in enumerate(msgs):
        r, c = role.encode(), content.encode()
        keep += [r, c]
        arr[i].role = r
        arr[i].content = c
    buf = ctypes.create_string_buffer(1 << 16)
    n = llama_cpp.llama_chat_apply_template(b"gemma", arr, len(msgs), True, buf, len(buf))
    assert 0 < n < len(buf), f"llama_chat_apply_template failed: {n}"
    return buf.raw[:n]


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", default=DEFAULT_MODEL)
    ap.add_argument("--out", default=os.path.join(HERE, "gemma3_tokenizer_ref.tsv"))
    a = ap.parse_args()

    tok = Llama(model_path=a.model, vocab_only=True, verbose=False)
    vocab = llama_cpp.llama_model_get_vocab(tok.model)
    n_vocab = llama_cpp.llama_vocab_n_tokens(vocab)
    bos = llama_cpp.llama_vocab_bos(vocab)
    eog = [i for i in range(n_vocab) if llama_cpp.llama_vocab_is_eog(vocab, i)]
    lines = [
        f"# generated by tests/ref/gen_gemma3_tok.py with llama-cpp-python {llama_cpp.__version__} "
        f"(vocab_only); model {os.path.basename(a.model)} sha256 {sha256_file(a.model)}",
        f"# bos {bos} eos {llama_cpp.llama_vocab_eos(vocab)} eot {llama_cpp.llama_vocab_eot(vocab)} "
        f"add_bos {int(llama_cpp.llama_vocab_get_add_bos(vocab))} "
        f"add_eos {int(llama_cpp.llama_vocab_get_add_eos(vocab))}",
        "# T <hex input>\\t<ids parse_special=1>\\t<ids parse_special=0> (add_special=0; "
        "add_special=1 checked to be [bos]+ids); M/R/C: a chat by llama.cpp's gemma template; "
        "E: the EOG ids",
    ]
    seen = set()
    for s in CASES:
        b = s.encode("utf-8")
        assert b not in seen, f"duplicate case {s!r}"
        seen.add(b)
        sp = tok.tokenize(b, add_bos=False, special=True)
        nsp = tok.tokenize(b, add_bos=False, special=False)
        with_bos = tok.tokenize(b, add_bos=True, special=True)
        assert with_bos == [bos] + sp, f"add_bos changes more than the BOS for {s!r}"
        back = tok.detokenize(sp, special=True)
        if back != b:
            print(f"note: detokenize differs for {s!r}: {back!r}", file=sys.stderr)
        lines.append(f"T {b.hex()}\t{ids_str(sp)}\t{ids_str(nsp)}")
    for msgs in CHATS:
        lines.append(f"M {len(msgs)}")
        for role, content in msgs:
            lines.append(f"R {role}\t{content.encode().hex()}")
        text = render_gemma(msgs)
        lines.append(f"C {text.hex()}\t{ids_str(tok.tokenize(text, add_bos=False, special=True))}")
    lines.append("E " + ids_str(eog))
    with open(a.out, "w") as f:
        f.write("\n".join(lines) + "\n")
    print(f"wrote {a.out}: {len(CASES)} strings, {len(CHATS)} chats, EOG {eog}")


if __name__ == "__main__":
    main()
