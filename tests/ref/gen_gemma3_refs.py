#!/usr/bin/env python3
"""llama.cpp's greedy decoding of the real Gemma 3 270M -> gemma3_greedy_ref.txt.

Prompts are tokenized by llama.cpp (add_bos=True, specials parsed), so the test
feeds token ids and does not depend on kvtier's tokenizer. Every token (prompt
and generated) is decoded alone (n=1) on llama.cpp's KV cache (f16 K/V, no flash
attention, CPU), as gen_refs.py does for the default model. Per prompt:
    P <hex of the UTF-8 prompt>
    I <prompt ids>
    G <N_GEN greedy ids>
    L <step> <id>:<logit> x TOP_K   (the top logits the step's token came from, descending)

Usage:  /work/venv-llama/bin/python tests/ref/gen_gemma3_refs.py [--model PATH] [--threads N]
"""
import argparse
import os

import llama_cpp
from llama_cpp import Llama

from ref_common import HERE, greedy_steps, model_path, sha256_file

N_GEN = 16
TOP_K = 5

PROMPTS = [
    "The capital of France is",
    "<start_of_turn>user\nWrite a haiku about the sea.<end_of_turn>\n<start_of_turn>model\n",
    "def fibonacci(n):\n    \"\"\"Return the n-th Fibonacci number.\"\"\"\n",
    "Once upon a time, in a small village at the edge of a forest, there lived",
    "1, 2, 3, 5, 8, 13,",
    "<start_of_turn>user\nExplain in one sentence why the sky is blue.<end_of_turn>\n<start_of_turn>model\n",
]


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", default=model_path("gemma-3-270m-q4_k_m.gguf"))
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--out", default=os.path.join(HERE, "gemma3_greedy_ref.txt"))
    args = ap.parse_args()
    sha = sha256_file(args.model)
    llm = Llama(model_path=args.model, n_ctx=1024, n_batch=512, n_threads=args.threads,
                n_threads_batch=args.threads, logits_all=False, verbose=False)
    lines = [
        f"# llama.cpp (llama-cpp-python {llama_cpp.__version__}, CPU, n_threads={args.threads}) greedy on "
        f"{os.path.basename(args.model)} sha256 {sha}; made by tests/ref/gen_gemma3_refs.py",
        "# prompts tokenized by llama.cpp (add_bos=True, special=True); every token decoded alone (n=1), "
        "f16 K/V, no flash attention",
        f"# P <hex prompt> / I <prompt ids> / G <{N_GEN} greedy ids> / L <step> <id>:<logit> x{TOP_K}",
    ]
    for prompt in PROMPTS:
        pb = prompt.encode("utf-8")
        ids = llm.tokenize(pb, add_bos=True, special=True)
        gen, steps = greedy_steps(llm, ids, N_GEN, TOP_K)
        steps = [f"L {step} {s}" for step, s in enumerate(steps)]
        lines += [f"P {pb.hex()}", "I " + " ".join(map(str, ids)), "G " + " ".join(map(str, gen))] + steps
    with open(args.out, "w") as f:
        f.write("\n".join(lines) + "\n")
    print(f"wrote {args.out}: {len(PROMPTS)} prompts")


if __name__ == "__main__":
    main()
