#!/usr/bin/env python3
"""llama.cpp side of kvtier's speed comparison (via llama-cpp-python, CPU).

Measures on the same GGUF and thread count as kvtier:
  (a) prefill tok/s: one N-token prompt decoded as a single batch (n_batch = n_ubatch >= N)
      into a fresh KV cache, each rep;
  (b) decode tok/s: G greedy tokens after a short prompt, one llama_decode(n=1) per token,
      the argmax over the logits included in the timed loop; the short prompt's own
      prefill is not timed.
One untimed warm-up rep of each runs first; medians over --reps are reported.

Prompt ids (printed to stderr, identical for every run unless --prompt-ids-file is given):
  x_0 = 42; x_{k+1} = (1103515245 * x_k + 12345) mod 2^31; id_k = 17 + (x_{k+1} >> 8) mod (n_vocab - 17)
i.e. pseudo-random ordinary vocab ids (SmolLM2 ids 0..16 are the special tokens).
--dump-ids F writes them (space-separated) so the harness can feed the same ids to kvtier;
--prompt-ids-file F reads ids from F instead (then n_prompt = number of ids in F).

stdout: one JSON object:
  {"prefill_tok_s", "decode_tok_s", "threads", "n_prompt", "n_gen", "llama_cpp_python", ...}
"""
import argparse
import json
import statistics
import sys
import time

import numpy as np
import llama_cpp
from llama_cpp import Llama

N_SPECIAL = 17          # SmolLM2: ids 0..16 are special/control tokens
DECODE_PROMPT = b"The capital of France is"


def lcg_ids(n, n_vocab, seed=42):
    """Deterministic pseudo-random ordinary token ids (see module docstring)."""
    x, out = seed, []
    for _ in range(n):
        x = (1103515245 * x + 12345) % (1 << 31)
        out.append(N_SPECIAL + (x >> 8) % (n_vocab - N_SPECIAL))
    return out


def log(*a):
    print(*a, file=sys.stderr, flush=True)


def main():
    ap = argparse.ArgumentParser(description="llama.cpp prefill/decode speed peer")
    ap.add_argument("--model", required=True)
    ap.add_argument("--threads", type=int, required=True)
    ap.add_argument("--prompt-tokens", type=int, default=512)
    ap.add_argument("--gen-tokens", type=int, default=64)
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--prompt-ids-file", help="space-separated prompt token ids to use")
    ap.add_argument("--dump-ids", help="write the prompt ids used to this file")
    ap.add_argument("--no-repack", action="store_true",
                    help="keep the weights as stored (llama-server -nr): no AMX/VNNI repacked copies")
    args = ap.parse_args()

    if args.no_repack:
        # Llama() takes its model parameters from llama_model_default_params(); it has no
        # argument for use_extra_bufts, so the default is changed for this process.
        default_params = llama_cpp.llama_cpp.llama_model_default_params

        def no_repack_params():
            p = default_params()
            p.use_extra_bufts = False
            return p
        llama_cpp.llama_cpp.llama_model_default_params = no_repack_params

    # Timings are meaningless if something else is using the cores: warn (stderr only).
    try:
        with open("/proc/loadavg") as f:
            load1 = float(f.read().split()[0])
        if load1 > 0.5:
            log(f"warning: 1-min load average is {load1:.2f}; other work may skew timings")
    except OSError:
        pass

    # Load the vocab first to size and validate the prompt.
    n_vocab = Llama(model_path=args.model, vocab_only=True, verbose=False).n_vocab()
    if args.prompt_ids_file:
        with open(args.prompt_ids_file) as f:
            ids = [int(t) for t in f.read().split()]
        method = f"ids from {args.prompt_ids_file}"
    else:
        ids = lcg_ids(args.prompt_tokens, n_vocab)
        method = ("LCG x0=42, x=(1103515245*x+12345) mod 2^31, "
                  f"id=17+(x>>8) mod {n_vocab - N_SPECIAL}")
    if not ids or any(not 0 <= t < n_vocab for t in ids):
        sys.exit(f"prompt ids must be non-empty and in [0, {n_vocab})")
    n_prompt = len(ids)
    if args.dump_ids:
        with open(args.dump_ids, "w") as f:
            f.write(" ".join(map(str, ids)) + "\n")
    log(f"prompt: {n_prompt} ids ({method}); first 8: {ids[:8]}")

    n_batch = max(512, n_prompt)  # the whole prompt is one batch / one ubatch
    llm = Llama(model_path=args.model, n_threads=args.threads, n_threads_batch=args.threads,
                n_ctx=max(n_prompt, 64 + args.gen_tokens) + 16, n_batch=n_batch,
                n_ubatch=n_batch, logits_all=False, verbose=False)
    short = llm.tokenize(DECODE_PROMPT, add_bos=False, special=True)
    log(f"decode prompt: {DECODE_PROMPT!r} -> {short}")

    def fresh():
        llm.reset()                 # n_tokens = 0
        llm._ctx.kv_cache_clear()   # empty KV cache (llama_memory_clear)

    def last_argmax():
        return int(np.ctypeslib.as_array(llm._ctx.get_logits_ith(-1), shape=(n_vocab,)).argmax())

    def prefill_once():
        fresh()
        t0 = time.perf_counter()
        llm.eval(ids)               # one llama_decode of n_prompt tokens (logits: last only)
        return n_prompt / (time.perf_counter() - t0)

    def decode_once():
        fresh()
        llm.eval(short)             # untimed
        gen = []
        t0 = time.perf_counter()
        for _ in range(args.gen_tokens):
            tok = last_argmax()
            gen.append(tok)
            llm.eval([tok])         # one llama_decode(n=1) per generated token
        dt = time.perf_counter() - t0
        return args.gen_tokens / dt, gen

    prefill_once()                  # warm-up (page-in weights, thread pool, allocs)
    decode_once()
    pre = [prefill_once() for _ in range(args.reps)]
    dec, gen = [], None
    for _ in range(args.reps):
        r, gen = decode_once()
        dec.append(r)
    log("prefill tok/s per rep: " + " ".join(f"{r:.1f}" for r in pre))
    log("decode  tok/s per rep: " + " ".join(f"{r:.1f}" for r in dec))
    log("greedy continuation: "
        + repr(llm.detokenize(gen, prev_tokens=short, special=True).decode("utf-8", "replace")))

    print(json.dumps({
        "prefill_tok_s": round(statistics.median(pre), 2),
        "decode_tok_s": round(statistics.median(dec), 2),
        "threads": args.threads,
        "n_prompt": n_prompt,
        "n_gen": args.gen_tokens,
        "llama_cpp_python": llama_cpp.__version__,
        "reps": args.reps,
        # best rep: less sensitive than the median to other load on the machine
        "prefill_tok_s_best": round(max(pre), 2),
        "decode_tok_s_best": round(max(dec), 2),
        "prompt_ids": method,
        "kv_type": "f16",
        "flash_attn": False,
    }))


if __name__ == "__main__":
    main()
