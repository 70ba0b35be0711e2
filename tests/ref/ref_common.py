"""What the llama.cpp reference generators under tests/ref/ share: the paths, the
model hash in their headers, id lists as text, the edge-case strings both tokenizer
references start from and the walk over such cases, and the one-token-at-a-time
greedy walk.

Imported by gen_refs.py, gen_gemma3_tok.py and gen_gemma3_refs.py (run as scripts,
so this directory is on sys.path). Changing anything here changes the committed
reference files those write: regenerate them and say so in tests/ref/README.md.
"""
import hashlib
import os
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.normpath(os.path.join(HERE, "..", ".."))

# Tokenizer edge cases: spaces, newlines, tabs (in this order in both tokenizer references).
EDGE_CASES = [
    "",
    " ",
    "  ",
    "a",
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
]


def model_path(name):
    """Path of a model file in the repository's models/ folder."""
    return os.path.join(REPO, "models", name)


def sha256_file(path):
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def ids_str(ids):
    return " ".join(str(i) for i in ids)


def case_bytes(cases):
    """Each tokenizer case as (str, its UTF-8 bytes), in order; a duplicate is refused."""
    seen = set()
    for s in cases:
        b = s.encode("utf-8")
        assert b not in seen, f"duplicate case {s!r}"
        seen.add(b)
        yield s, b


def note_detokenize(tok, ids, s, b):
    """Say on stderr when detokenizing ids (specials rendered) does not give the case's bytes back."""
    back = tok.detokenize(ids, special=True)
    if back != b:
        print(f"note: detokenize differs for {s!r}: {back!r}", file=sys.stderr)


def greedy_steps(llm, ids, n_gen, top_k):
    """Decode ids one token at a time on a fresh KV cache, then n_gen argmax steps.

    Returns (gen, steps): the generated ids, and per step the top_k "<id>:<logit>"
    pairs (descending, %.6f; ties broken by the lower id, as a plain argmax) of the
    logits that produced that step's token.
    """
    import numpy as np

    n_vocab = llm.n_vocab()
    llm.reset()                     # n_tokens = 0; eval() then drops the old KV
    llm._ctx.kv_cache_clear()       # ...and be explicit: fresh KV cache per prompt
    for t in ids:
        llm.eval([t])
    gen, steps = [], []
    for step in range(n_gen):
        logits = np.ctypeslib.as_array(llm._ctx.get_logits_ith(-1), shape=(n_vocab,)).copy()
        order = np.argsort(-logits, kind="stable")[:top_k]
        nxt = int(order[0])
        gen.append(nxt)
        steps.append(" ".join(f"{int(i)}:{logits[i]:.6f}" for i in order))
        if step + 1 < n_gen:
            llm.eval([nxt])
    return gen, steps
