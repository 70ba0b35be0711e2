#!/usr/bin/env python3
"""llama.cpp's logits on kvtier's synthetic GGUF of each architecture -> arch_ref.txt.

The files are written by kvtier itself (`test_arch_ref --write DIR`, the same
writer and settings the C test uses), so both sides read the same bytes. Each
file is fed the test's 40-token prompt, one token at a time (n=1) on top of
llama.cpp's KV cache (f16 K/V, no flash attention, CPU), and the full logits
row after each of the positions in POSITIONS is written as
    L <family> <position> <n_vocab logits, %.7g>

Usage:  /work/venv-llama/bin/python tests/ref/gen_arch_refs.py --bin build/test_arch_ref
"""
import argparse
import hashlib
import os
import subprocess
import tempfile

import numpy as np
import llama_cpp
from llama_cpp import Llama

HERE = os.path.dirname(os.path.abspath(__file__))
N_PROMPT = 40
# the first token, a block boundary, the gemma3 window's edge (8) and past it, the end
POSITIONS = [0, 1, 7, 8, 9, 15, 16, 23, 31, 32, 39]


def prompt():
    return [(i * 37 + 11) % 300 for i in range(N_PROMPT)]  # as prompt() in test_arch_ref.c


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--bin", required=True, help="the built test_arch_ref")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--out", default=os.path.join(HERE, "arch_ref.txt"))
    args = ap.parse_args()
    with tempfile.TemporaryDirectory(prefix="kvt-arch-ref-") as d:
        paths = subprocess.run([args.bin, "--write", d], check=True, capture_output=True,
                               text=True).stdout.split()
        lines = [
            f"# llama.cpp (llama-cpp-python {llama_cpp.__version__}, CPU, n_threads={args.threads}) logits on "
            "the synthetic GGUFs of test_arch_ref --write; made by tests/ref/gen_arch_refs.py",
            "# prompt: ids (i * 37 + 11) % 300 for i < 40, each token decoded alone (n=1) with the KV "
            "cache (f16 K/V, no flash attention)",
            "# L <family> <position> <logits of every vocabulary id, %.7g>",
        ]
        for path in paths:
            fam = os.path.basename(path)[:-len(".gguf")]
            with open(path, "rb") as f:
                sha = hashlib.sha256(f.read()).hexdigest()
            lines.append(f"# {fam}: sha256 {sha}")
            llm = Llama(model_path=path, n_ctx=64, n_batch=64, n_ubatch=64, n_threads=args.threads,
                        n_threads_batch=args.threads, logits_all=False, verbose=False)
            n_vocab = llm.n_vocab()
            llm.reset()
            for pos, t in enumerate(prompt()):
                llm.eval([t])
                if pos in POSITIONS:
                    lg = np.ctypeslib.as_array(llm._ctx.get_logits_ith(-1), shape=(n_vocab,)).copy()
                    lines.append(f"L {fam} {pos} " + " ".join(f"{x:.7g}" for x in lg))
            del llm
    with open(args.out, "w") as f:
        f.write("\n".join(lines) + "\n")
    print(f"wrote {args.out}: {len(paths)} families x {len(POSITIONS)} positions")


if __name__ == "__main__":
    main()
