"""bench/bench_json_ws.py — what grammar-constrained JSON spends on whitespace, and how often it runs out.

    bench_json_ws.py BUILD [--baseline BUILD0] [--max-tokens 96] [--model M.gguf] [--json-object]

kvtierd from BUILD (and, with --baseline, from BUILD0 in the same run: the build before a
change) answers the same schema-constrained chat requests on the default model: 12 JSON
Schemas x 3 prompts, greedy and sampled (temperature 0.8, a fixed seed each), 72 requests
with response_format json_schema (strict); --json-object adds 24 json_object requests,
reported apart. Printed per build: the replies cut by max_tokens (finish_reason "length")
and their rate, the replies that ended and validate (Python jsonschema), completion tokens
(median, total), the share of the replies' bytes that is whitespace outside strings, and
the largest run of it; with a baseline, each figure's ratio to it. A request's reply is the
same on every run of one build (greedy, or a seeded draw), so the counts are exact; times
are not reported (this measures tokens, not speed). Data dirs are removed at the end.
"""
import argparse
import json
import os
import platform
import shutil
import statistics
import sys
import tempfile

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "tests", "daemon"))
from kvtierd_proc import Daemon, http  # noqa: E402

ROOT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..")


def obj(props, required=None):
    return {"type": "object", "properties": props, "required": list(props) if required is None else required,
            "additionalProperties": False}


S, I, N, B = {"type": "string"}, {"type": "integer"}, {"type": "number"}, {"type": "boolean"}
SCHEMAS = [
    ("person", obj({"name": S, "age": I, "email": S}),
     ["Describe a person called Ada.", "Give me a fictional user profile.", "Who is Bob? Answer as a record."]),
    ("address", obj({"street": S, "city": S, "zip": S, "country": S}),
     ["Write the address of a bakery in Paris.", "Give a postal address in Berlin.", "Where does Alice live?"]),
    ("product", obj({"name": S, "price": N, "in_stock": B, "tags": {"type": "array", "items": S, "maxItems": 4}}),
     ["Describe a coffee mug for sale.", "List a laptop in a shop.", "Describe a pair of running shoes."]),
    ("event", obj({"title": S, "date": S, "attendees": {"type": "array", "items": obj({"name": S}), "maxItems": 3}}),
     ["Plan a birthday party.", "Describe a team meeting.", "Describe a small wedding."]),
    ("recipe", obj({"dish": S, "minutes": I, "steps": {"type": "array", "items": S, "minItems": 1, "maxItems": 3}}),
     ["Give a recipe for pancakes.", "How do I make tea?", "A quick pasta recipe, please."]),
    ("book", obj({"title": S, "author": obj({"first": S, "last": S}), "year": I}),
     ["Describe a famous novel.", "Tell me about a book you like.", "Recommend a science fiction book."]),
    ("weather", obj({"city": S, "temperature": N, "unit": {"enum": ["celsius", "fahrenheit"]}, "rain": B}),
     ["What is the weather in London?", "Report the weather in Tokyo.", "Is it raining in Oslo?"]),
    ("colours", {"type": "array", "items": S, "minItems": 3, "maxItems": 3},
     ["List three colours.", "Name three fruits.", "Give three animal names."]),
    ("order", obj({"id": I, "items": {"type": "array", "minItems": 1, "maxItems": 2,
                                      "items": obj({"fruit": S, "count": I})}, "status": {"enum": ["open", "paid"]}}),
     ["Write an order of fruit.", "Record a grocery order.", "Make an order for apples and pears."]),
    ("movie", obj({"title": S, "genre": {"enum": ["drama", "comedy", "action"]}, "rating": N, "sequel": B},
                  ["title", "genre", "rating"]),
     ["Describe a movie.", "Recommend a comedy film.", "Tell me about an action movie."]),
    ("family", obj({"parent": obj({"name": S}), "children": {"type": "array", "maxItems": 2,
                                                            "items": obj({"name": S, "age": I})}}),
     ["Write a small family.", "Describe a family with two kids.", "Who is in your family?"]),
    ("task", obj({"task": S, "done": B, "priority": I, "owner": {"type": ["string", "null"]}}),
     ["Write a to-do item.", "Add a task to my list.", "What should I do today? One task."]),
]
OBJECT_PROMPTS = ["Tell me about cats, as JSON.", "Describe a city as JSON.", "List some planets in JSON.",
                  "Give a JSON object describing a car.", "Describe your day as JSON.",
                  "A JSON record of a song.", "Describe a dog in JSON.", "Give me a JSON config for a server.",
                  "A JSON object about the weather.", "Describe a house as JSON.", "JSON for a shopping list.",
                  "Describe a football team as JSON."]


def requests(with_object):
    """(kind, name, schema, body) of every request, in a fixed order."""
    out = []
    for name, schema, prompts in SCHEMAS:
        for i, p in enumerate(prompts):
            for temp in (0, 0.8):
                rf = {"type": "json_schema", "json_schema": {"name": name, "schema": schema, "strict": True}}
                out.append(("json_schema", name, schema, {"messages": [{"role": "user", "content": p}],
                                                          "temperature": temp, "seed": 100 + i,
                                                          "response_format": rf}))
    for i, p in enumerate(OBJECT_PROMPTS if with_object else []):
        for temp in (0, 0.8):
            out.append(("json_object", "object", None, {"messages": [{"role": "user", "content": p}],
                                                       "temperature": temp, "seed": 200 + i,
                                                       "response_format": {"type": "json_object"}}))
    return out


def ws_outside_strings(text):
    """(whitespace bytes outside JSON strings, the longest such run)."""
    n = run = longest = 0
    in_str = esc = False
    for ch in text:
        if in_str:
            if esc:
                esc = False
            elif ch == "\\":
                esc = True
            elif ch == '"':
                in_str = False
            continue
        if ch in " \t\r\n":
            n += 1
            run += 1
            longest = max(longest, run)
            continue
        run = 0
        in_str = ch == '"'
    return n, longest


def measure(build, model, reqs, max_tokens, tmp, tag):
    try:
        import jsonschema
    except ImportError:
        jsonschema = None
    data = os.path.join(tmp, "data-" + tag)
    d = Daemon(build, os.path.join(tmp, "conf-" + tag),
               "[server]\nlisten = 127.0.0.1:0\nmax_tokens_limit = 4096\n[model]\npath = %s\ndevice = cpu\n"
               "context = 2048\n[cache]\nenabled = false\n[tier.hbm]\ncapacity = 64M\n[tier.host]\ncapacity = 32M\n"
               "[tier.nvme]\ncapacity = 64M\n[index]\ndata_dir = %s\n" % (model, data))
    d.start()
    rows = []
    try:
        http("POST", d.url + "/v1/chat/completions", {"messages": [{"role": "user", "content": "hi"}],
                                                       "max_tokens": 4})  # warm-up
        for kind, name, schema, body in reqs:
            st, r = http("POST", d.url + "/v1/chat/completions", dict(body, max_tokens=max_tokens), timeout=600)
            if st != 200:
                raise RuntimeError("%s: status %s: %s" % (name, st, r))
            c = r["choices"][0]
            text = c["message"]["content"] or ""
            valid = False
            if c["finish_reason"] == "stop":
                try:
                    doc = json.loads(text)
                    if schema is not None and jsonschema:
                        jsonschema.validate(doc, schema)
                    valid = schema is not None or isinstance(doc, dict)
                except Exception:  # an invalid reply is counted, not fatal
                    valid = False
            ws, longest = ws_outside_strings(text)
            rows.append({"kind": kind, "name": name, "finish": c["finish_reason"], "valid": valid,
                         "tokens": r["usage"]["completion_tokens"], "bytes": len(text.encode()), "ws": ws,
                         "longest_ws": longest, "text": text})
    finally:
        d.stop()
    return rows


def summary(rows, kind):
    rs = [r for r in rows if r["kind"] == kind]
    if not rs:
        return None
    n_len = sum(r["finish"] == "length" for r in rs)
    return {"kind": kind, "requests": len(rs), "length": n_len, "length_rate": round(n_len / len(rs), 3),
            "valid": sum(r["valid"] for r in rs), "tokens_median": statistics.median(r["tokens"] for r in rs),
            "tokens_total": sum(r["tokens"] for r in rs),
            "ws_share": round(sum(r["ws"] for r in rs) / max(1, sum(r["bytes"] for r in rs)), 3),
            "longest_ws": max(r["longest_ws"] for r in rs)}


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("build")
    ap.add_argument("--baseline", help="the build to compare with (e.g. main's), run in the same invocation")
    ap.add_argument("--max-tokens", type=int, default=96)
    ap.add_argument("--model", default=os.path.join(ROOT, "models", "SmolLM2-135M-Instruct.Q4_1.gguf"))
    ap.add_argument("--json-object", action="store_true", help="also 24 json_object requests (reported apart)")
    ap.add_argument("--show", action="store_true", help="print every reply")
    a = ap.parse_args()
    model = os.path.abspath(a.model)
    reqs = requests(a.json_object)
    print(json.dumps({"bench": "json_ws", "machine": platform.machine(), "cpus": os.cpu_count(),
                      "model": os.path.basename(model), "requests": len(reqs), "max_tokens": a.max_tokens}), flush=True)
    tmp = tempfile.mkdtemp(prefix="kvt_bench_json_ws_")
    try:
        builds = ([("baseline", a.baseline)] if a.baseline else []) + [("build", a.build)]
        res = {}
        for tag, b in builds:
            rows = measure(os.path.abspath(b), model, reqs, a.max_tokens, tmp, tag)
            if a.show:
                for r in rows:
                    print(tag, r["name"], r["finish"], r["tokens"], json.dumps(r["text"]))
            res[tag] = {k: summary(rows, k) for k in ("json_schema", "json_object")}
        for kind in ("json_schema", "json_object"):
            for tag, _ in builds:
                s = res[tag][kind]
                if not s:
                    continue
                out = dict(s, build=tag)
                base = res.get("baseline", {}).get(kind)
                if tag == "build" and base:
                    out["ratio_to_baseline"] = {k: (round(s[k] / base[k], 3) if base[k] else None)
                                                for k in ("length", "tokens_median", "tokens_total", "ws_share")}
                print(json.dumps(out), flush=True)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    main()
