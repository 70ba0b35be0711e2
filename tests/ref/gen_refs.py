#!/usr/bin/env python3
"""Regenerate kvtier's reference vectors from llama.cpp (via llama-cpp-python).

Writes, next to this script:
  tokenizer_ref.tsv  <hex of UTF-8 input>\t<space-separated token ids>
                     tokenized with add_bos=False, special=True (special tokens parsed)
  greedy_ref.txt     per prompt: P/I/G lines + 16 L lines with the top-10 raw logits
                     at each greedy step (see format in the file header)

Usage:  python3 tests/ref/gen_refs.py [--model PATH] [--threads N]

Requires `pip install llama-cpp-python` (see tests/ref/README.md for the version used).
"""
import argparse
import os
import sys

import llama_cpp
from llama_cpp import Llama

from ref_common import EDGE_CASES, HERE, case_bytes, greedy_steps, model_path, note_detokenize, sha256_file

DEFAULT_MODEL = model_path("SmolLM2-135M-Instruct.Q4_1.gguf")

N_GEN = 16   # greedy steps per prompt
TOP_K = 10   # logits recorded per step

# --------------------------------------------------------------------------------------
# Tokenizer cases. Python str literals; encoded as UTF-8. Order is kept in the file.
# --------------------------------------------------------------------------------------
TOKENIZER_CASES = EDGE_CASES + [
    # ASCII prose
    "The capital of France is Paris.",
    "The quick brown fox jumps over the lazy dog.",
    "Once upon a time, in a land far, far away, there lived a small dragon who loved books.",
    "HELLO WORLD, THIS IS ALL CAPS!",
    "camelCaseIdentifier and snake_case_identifier",
    # contractions
    "don't",
    "I'LL be there, we've been told, they're late, she's gone, it'd be nice",
    "Don't you think it's 'quoted' right?",
    "y'all ain't gonna believe",
    # digits
    "1234567890",
    "3.14159",
    "The year 2024 had 366 days.",
    "-42 +17 0.001 1e-9 1,000,000",
    "12345678901234567890123",
    "v1.2.3-rc4",
    # punctuation runs
    "!!!???...",
    "Wait... what?!?! --- (really) [sure] {ok} <tag>",
    "#$%^&*()_+-=~`|\\/",
    "......,,,,;;;;::::",
    "\"double quotes\" and 'single quotes'",
    # URLs / emails / paths
    "https://huggingface.co/HuggingFaceTB/SmolLM2-135M-Instruct?x=1&y=2#frag",
    "mail me at someone@example.com",
    "/usr/local/lib/python3.11/site-packages",
    # accents / European languages
    "café naïve résumé",
    "El niño comió piñata en España.",
    "Über die Brücke gehen schöne Mädchen.",
    "Größenwahn und Straße",
    "Où est la bibliothèque ? C'est très loin, à côté de l'hôpital.",
    "¿Dónde está el baño? ¡Muy bien!",
    "Ελληνικά κείμενο",
    "Привет, как дела?",
    # CJK
    "你好，世界！",
    "我爱自然语言处理。",
    "こんにちは、世界。カタカナとひらがな。",
    "東京は日本の首都です。",
    "안녕하세요 세계",
    "한국어 텍스트입니다.",
    "mixed English 和中文 and 日本語",
    # emoji
    "I love pizza 🍕!",
    "😀😃😄😁",
    "family: 👨‍👩‍👧‍👦",
    "rainbow flag 🏳️‍🌈 and pirate 🏴‍☠️",
    "flags 🇫🇷🇩🇪🇯🇵🇺🇸",
    "thumbs 👍🏽 skin tone",
    "arrows → ← ↑ ↓ and math ∑ ∫ √ ≠ ≤",
    # code
    "int main(void) {\n    printf(\"hello, world\\n\");\n    return 0;\n}\n",
    "def fib(n):\n    if n < 2:\n        return n\n    return fib(n - 1) + fib(n - 2)\n",
    "for (int i = 0; i < n; ++i) { a[i] += b[i] * 2; }",
    "    indented_line = True  # comment",
    "x=[1,2,3];y={'a':1,\"b\":2}",
    "<html><body><div class=\"x\">text</div></body></html>",
    "SELECT * FROM users WHERE id = 42;",
    # special tokens embedded in text (parsed because special=True)
    "<|im_start|>user\nhi<|im_end|>",
    "<|im_start|>system\nYou are a helpful AI assistant named SmolLM, trained by Hugging Face"
    "<|im_end|>\n<|im_start|>user\nWhat is the capital of France?<|im_end|>\n<|im_start|>assistant\n",
    "<|endoftext|>",
    "text before<|endoftext|>text after",
    "<|im_end|><|im_end|>",
    " <|im_start|> spaced <|im_end|> ",
    # partial / look-alike special tokens (must NOT be parsed as specials)
    "<|im_start",
    "<|im_start|",
    "im_start|>",
    "<|IM_START|>",
    "< |im_start| >",
    "<|endoftext",
    "<filename>main.py<file_sep>",
]

# --------------------------------------------------------------------------------------
# Greedy prompts (raw text, no chat template, add_bos=False, special=True).
# --------------------------------------------------------------------------------------
GREEDY_PROMPTS = [
    "The capital of France is",
    "The first person to walk on the Moon was Neil Armstrong, in 1969. The mission was called",
    "Photosynthesis is the process by which green plants use sunlight, water and carbon "
    "dioxide to produce",
    "Once upon a time, in a small village at the edge of a dark forest, there lived a young "
    "girl named Lily. Every morning she",
    "def fibonacci(n):\n    \"\"\"Return the n-th Fibonacci number.\"\"\"\n",
    "#include <stdio.h>\n\nint main(void) {\n",
    "<|im_start|>system\nYou are a helpful AI assistant named SmolLM, trained by Hugging Face"
    "<|im_end|>\n<|im_start|>user\nWhat is the capital of France?<|im_end|>\n"
    "<|im_start|>assistant\n",
]


def gen_tokenizer(model_path, header, out_path):
    # vocab_only: no weights loaded, tokenizer only.
    tok = Llama(model_path=model_path, vocab_only=True, verbose=False)
    lines = [
        header,
        "# format: <hex of UTF-8 input bytes>\\t<space-separated token ids>; "
        "llama_tokenize(add_special=False, parse_special=True)",
    ]
    for s, b in case_bytes(TOKENIZER_CASES):
        ids = tok.tokenize(b, add_bos=False, special=True)
        # Sanity: detokenizing (with specials rendered) must round-trip the bytes.
        note_detokenize(tok, ids, s, b)
        lines.append(f"{b.hex()}\t{' '.join(map(str, ids))}")
    with open(out_path, "w") as f:
        f.write("\n".join(lines) + "\n")
    print(f"wrote {out_path}: {len(TOKENIZER_CASES)} cases")
    del tok


def gen_greedy(model_path, threads, header, out_path):
    # Every token (prompt and generated) is decoded alone (n=1) on top of the KV cache,
    # so logits_all is not needed: we always read the last token's logits.
    # Why not one prompt batch: in llama.cpp's CPU non-flash-attention path a batched
    # decode (n>=2) gives logits differing by up to ~0.8 from n=1 decodes of the same
    # tokens (the n=1 path is the one closer to an fp64 reference), and the K/V it
    # writes differ too; token-by-token keeps the reference on the single, more
    # accurate path and independent of batch splitting.
    llm = Llama(model_path=model_path, n_ctx=512, n_batch=512, n_ubatch=512,
                n_threads=threads, n_threads_batch=threads, logits_all=False,
                verbose=False)
    lines = [
        header,
        f"# greedy: prompt (add_bos=False, special=True) then {N_GEN} argmax steps; every token "
        "decoded one at a time (n=1) with the KV cache (f16 K/V, no flash-attn, CPU)",
        "# format per prompt: P <hex prompt bytes> / I <prompt ids> / G <generated ids> / "
        f"L <step> <id>:<logit> x{TOP_K} (top-{TOP_K} of the logits that produced step's "
        "token, descending, %.6f)",
    ]
    for prompt in GREEDY_PROMPTS:
        pb = prompt.encode("utf-8")
        ids = llm.tokenize(pb, add_bos=False, special=True)
        gen, steps = greedy_steps(llm, ids, N_GEN, TOP_K)
        lines.append(f"P {pb.hex()}")
        lines.append(f"I {' '.join(map(str, ids))}")
        lines.append(f"G {' '.join(map(str, gen))}")
        for step, s in enumerate(steps):
            lines.append(f"L {step} {s}")
        text = llm.detokenize(gen, prev_tokens=ids, special=True).decode("utf-8", "replace")
        print(f"--- prompt: {prompt!r}\n    greedy: {text!r}")
    with open(out_path, "w") as f:
        f.write("\n".join(lines) + "\n")
    print(f"wrote {out_path}: {len(GREEDY_PROMPTS)} prompts x {N_GEN} steps")


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--model", default=DEFAULT_MODEL)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--outdir", default=HERE)
    args = ap.parse_args()
    if not os.path.isfile(args.model):
        sys.exit(f"model not found: {args.model} (run scripts/fetch_model.sh)")
    header = (f"# generated by tests/ref/gen_refs.py with llama-cpp-python {llama_cpp.__version__} "
              f"(CPU, n_threads={args.threads}); model {os.path.basename(args.model)} "
              f"sha256 {sha256_file(args.model)}")
    gen_tokenizer(args.model, header, os.path.join(args.outdir, "tokenizer_ref.tsv"))
    gen_greedy(args.model, args.threads, header, os.path.join(args.outdir, "greedy_ref.txt"))


if __name__ == "__main__":
    main()
