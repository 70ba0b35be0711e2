#!/usr/bin/env python3
"""
bench/device_summary.py BENCH_GPU_JSONL [PARITY_TXT ...] [--sweep SWEEP_JSONL] — the device check's
summary: every target of the GPU issue with its measured ratio from
bench_gpu's JSON lines (met / not met), the fastest decode-attention kernel
per shape class, the fastest decode variant (kernel x combine x staging) per
batch x context class and codec with the rows of gpu/cuda/cuda_attn.cu's
decode_choices that the run says to write, and each target that the lines do
not measure, named as unmeasured. --sweep adds bench_gpu --batch-sweep's lines
(batch throughput: weight streaming per batch, batch-64 GEMMs against cuBLAS).
Prints text; with --json OUT also writes the summary as one JSON
object per target to OUT. Reads only what it is given: a figure absent from
the lines is reported as unmeasured, never filled in.
"""
import json
import sys


def load(path):
    rows = []
    try:
        with open(path, encoding="utf-8", errors="replace") as f:
            for line in f:
                line = line.strip()
                if line.startswith("{"):
                    try:
                        rows.append(json.loads(line))
                    except json.JSONDecodeError:
                        pass
    except OSError as e:
        print("device_summary: cannot read %s: %s" % (path, e))
    return rows


def shape_class(r):
    return "%s KV heads x group %s x d %s at %dK" % (r["kv_heads"], r["group"], r["head_dim"], r["context"] // 1024)


def resume_targets(rows, target):
    """Issue 18 item 6: resume TTFT from T1 (bench_gpu --resume-ttft lines). The target is that
    pipelined TTFT approaches max(copy, compute); met here means within 1.2x of it (and faster
    than sequential). Each history and T1 codec is its own target."""
    rt = [r for r in rows if r.get("bench") == "resume_ttft" and "skipped" not in r]
    for r in rows:
        if r.get("bench") == "resume_ttft" and "skipped" in r:
            print("  resume_ttft %s %d tokens: skipped (%s)" % (r.get("t1_codec"), r.get("history", 0), r["skipped"]))
    if not rt:
        target("resume TTFT from T1, pipelined vs max(copy, compute) (4K/16K/32K)", None, "<= 1.2", None,
               "unmeasured (no resume_ttft lines)")
        return
    devs = [r.get("name", "") for r in rows if r.get("bench") == "device" and "resume_ttft" in r.get("mode", "")]
    on_cpu = bool(devs) and devs[-1].startswith("cpu")
    print("== resume TTFT from T1 (ms): sequential, pipelined, copy, compute%s" %
          (" -- CPU backend: NOT GPU figures" if on_cpu else ""))
    for r in rt:
        print("  %-4s T1, %5d-token history + %d: seq %.1f (promote %.1f), pipe %.1f, copy %.1f, compute %.1f;"
              " pipe/seq %.3f, pipe/max %.3f, %d groups" %
              (r["t1_codec"], r["history"], r["new_tokens"], r["seq_ttft_ms"], r["seq_promote_ms"], r["pipe_ttft_ms"],
               r["copy_ms"], r["compute_ms"], r["pipe_vs_seq"], r["pipe_vs_max"], r["groups"]))
        note = "pipelined / sequential %.3f" % r["pipe_vs_seq"]
        if on_cpu or "tiny" in r.get("model", ""):
            note += "; %s: not a GPU figure of the target's shape" % ("CPU backend" if on_cpu else "tiny model")
        target("resume TTFT %s T1, %d-token history: pipelined / max(copy, compute)" % (r["t1_codec"], r["history"]),
               r["pipe_vs_max"], "<= 1.2",
               None if on_cpu else (r["pipe_vs_max"] <= 1.2 and r["pipe_vs_seq"] < 1.0), note)


# gpu/cuda/cuda_attn.cu decode_choices: a row per pool kind (fp16, 8-bit) from each of these contexts up
CHOICE_FROM = (0, 8192, 32768)


def variants_summary(rows, target):
    """Decode variants (bench_gpu's decode_variant / decode_8bit_ratio lines): the fastest per class, the targets
    of items 2 and 3 on the best variant, and the decode_choices rows the run says to pick."""
    var = [r for r in rows if r.get("bench") == "decode_variant" and not r.get("skipped")]
    rat = [r for r in rows if r.get("bench") == "decode_8bit_ratio"]
    for r in var + rat:  # the class: its context before a dry run's division (KVT_BENCH_VARIANTS_SMALL)
        r["context"] = r.get("class_context", r["context"])
    print("== fastest decode variant per batch x context class (kernel x combine x staging)")
    if not var:
        print("  unmeasured (no decode_variant lines)")
    best = {}
    for r in var:
        k = (r["batch"], r["context"], r["codec"])
        if k not in best or r["us"] < best[k]["us"]:
            best[k] = r
    for (b, ctx, codec), r in sorted(best.items()):
        base = [x for x in var if (x["batch"], x["context"], x["codec"]) == (b, ctx, codec) and x["variant"] == "k1"]
        gain = " (%.2fx the default k1)" % (base[0]["us"] / r["us"]) if base else ""
        print("  %2d x %5dK %-5s %-16s %8.1f us  %.3f of copy%s" % (b, ctx // 1024, codec, r["variant"], r["us"],
                                                                  r["vs_copy"], gain))
    for r in rows:
        if r.get("bench") == "decode_variant" and r.get("skipped"):
            print("  %d x %dK skipped: over the bench's %.0f s budget" % (r["batch"], r["context"] // 1024,
                                                                          r["budget_s"]))
    for r in rows:
        if r.get("bench") == "decode_variants_time":
            print("  the variants took %.1f s (%d classes, %d variants)" % (r["seconds"], r["classes"], r["variants"]))
    # item 2 on the best variant
    f16 = {(b, ctx): r for (b, ctx, codec), r in best.items() if codec == "f16"}
    big = [r for (b, ctx), r in f16.items() if b * ctx >= 65536]
    for r in sorted(big, key=lambda r: (r["batch"], r["context"])):
        target("decode attention vs d2d copy, %d x %dK (best variant: %s)" % (r["batch"], r["context"] // 1024,
                                                                            r["variant"]),
               r["vs_copy"], ">= 0.85", r["vs_copy"] >= 0.85)
    if not big:
        target("decode attention vs d2d copy, batch x context >= 64K (best variant)", None, ">= 0.85", None,
               "unmeasured (no decode_variant lines)")
    r4 = f16.get((1, 4096))
    target("decode attention vs d2d copy, 1 x 4K (best variant%s)" % (": " + r4["variant"] if r4 else ""),
           r4 and r4["vs_copy"], ">= 0.5", r4 and r4["vs_copy"] >= 0.5, "" if r4 else "unmeasured")
    # item 3: per kernel (its best variant on each side), and best against best
    if rat:
        print("== 8-bit KV decode speed-up over fp16 per variant (>= 16K context; target >= 1.6)")
        for r in sorted(rat, key=lambda r: (r["codec"], r["batch"], r["context"], r["variant"])):
            print("  %-5s %2d x %3dK %-16s %.3f" % (r["codec"], r["batch"], r["context"] // 1024, r["variant"],
                                                   r["speedup"]))
    for codec in ("fp8", "int8"):
        for (b, ctx), r16 in sorted(f16.items()):
            r8 = best.get((b, ctx, codec))
            if ctx < 16384 or not r8:
                continue
            v = r16["us"] / r8["us"]
            target("%s KV decode speed-up over fp16, %d x %dK (best %s vs best %s)" % (
                codec.upper(), b, ctx // 1024, r8["variant"], r16["variant"]), v, ">= 1.6", v >= 1.6)
            for k in (1, 2, 3):
                ks = [x for x in rat if x["kernel"] == k and x["codec"] == codec and (x["batch"], x["context"]) == (b, ctx)]
                if ks:
                    m = max(ks, key=lambda x: x["speedup"])
                    print("  %s %d x %dK kernel %d: best speed-up %.3f (%s)" % (codec, b, ctx // 1024, k,
                                                                             m["speedup"], m["variant"]))
    if var and not rat:
        target("8-bit KV decode speed-up over fp16 at >= 16K (per variant)", None, ">= 1.6", None, "unmeasured")
    # the rows to write: per pool kind and context range, the variant with the least time over its classes
    if var:
        print("== decode_choices rows this run says to write (gpu/cuda/cuda_attn.cu; least total time over the classes "
              "in each range)")
        for q8 in (False, True):
            for i, lo in enumerate(CHOICE_FROM):
                hi = CHOICE_FROM[i + 1] if i + 1 < len(CHOICE_FROM) else 1 << 40
                cls = [r for r in var if lo <= r["context"] < hi and (r["codec"] != "f16") == q8]
                tot = {}
                for r in cls:
                    tot.setdefault(r["variant"], [r, 0.0, 0])
                    tot[r["variant"]][1] += r["us"]
                    tot[r["variant"]][2] += 1
                most = max((n for _, _, n in tot.values()), default=0)
                cands = [(t, r) for r, t, n in tot.values() if n == most]  # variants measured on every class
                if not cands:
                    print("\t/* %s, from %d: unmeasured */" % ("8-bit" if q8 else "fp16", lo))
                    continue
                t, r = min(cands, key=lambda c: c[0])
                print("\t{ %s, %d, %d, %s, %s }, /* %s: %.1f us over %d runs */" % (
                    "true" if q8 else "false", lo, r["kernel"], "true" if r["combine"] == "fused" else "false",
                    "true" if r["staged"] else "false", r["variant"], t, most))


SWEEP_MODELS = ("llama-3.2-1B shape", "llama-3-8B shape")
SWEEP_DTYPES = ("f16", "q4_k")


def sweep_targets(rows, target):
    """Issue 18 item 5 from bench_gpu --batch-sweep's lines: per model and dtype, tok/s and the
    weights' streaming fraction per batch (target at batch 1: >= 0.7), and the batch-64 GEMMs
    against cuBLAS's best for the same shapes (target >= 0.6 overall)."""
    sw = [r for r in rows if r.get("bench") == "batch_sweep"]
    gm = [r for r in rows if r.get("bench") == "gemm_vs_cublas"]
    gs = [r for r in rows if r.get("bench") == "gemm_vs_cublas_step"]
    tm = [r for r in rows if r.get("bench") == "batch_sweep_time"]
    print("== batch throughput (bench_gpu --batch-sweep)")
    if tm:
        print("  sweep took %.1f s (budget %.0f s)" % (tm[-1]["seconds"], tm[-1]["budget_s"]))
    models = [m for m in SWEEP_MODELS] + sorted({r["model"] for r in sw if r.get("model") not in SWEEP_MODELS})
    for model in models:
        for dt in SWEEP_DTYPES:
            mine = [r for r in sw if r.get("model") == model and r.get("dtype") == dt]
            ok = [r for r in mine if "tok_s" in r]
            skipped = [r for r in mine if "skipped" in r]
            for r in ok:
                print("  %-20s %-5s batch %3d: %9.1f tok/s, step %7.3f ms, weights vs copy %.3f, KV/weights %.2f, "
                      "graph launches/tok %.2f, host syncs/tok %.2f" %
                      (model, dt, r["batch"], r["tok_s"], r["step_ms"], r["weights_vs_copy"],
                       r["kv_bytes_per_step"] / r["weight_bytes"], r["graph_launches_per_token"],
                       r["host_syncs_per_token"]))
            for r in mine:
                if "error" in r:
                    print("  %-20s %-5s batch %s FAILED with %d" % (model, dt, r.get("batch", "?"), r["error"]))
            if model not in SWEEP_MODELS:  # --tiny: proves the mode runs, judged against nothing
                continue
            b1 = [r for r in ok if r["batch"] == 1]
            note = "skipped: " + skipped[0]["skipped"] if skipped else ("unmeasured (no line)" if not b1 else
                                                                         "%.1f tok/s" % b1[0]["tok_s"])
            target("batch 1 weights vs copy (weight-streaming limit), %s %s" % (model, dt),
                   b1[0]["weights_vs_copy"] if b1 else None, ">= 0.7",
                   b1[0]["weights_vs_copy"] >= 0.7 if b1 else None, note)
        for dt in SWEEP_DTYPES:
            for r in gm:
                if r.get("model") == model and r.get("dtype") == dt:
                    print("  %-20s %-5s GEMM %-8s %5d x %5d (x%d): %8.1f us, cuBLAS %s us, ratio %s%s" %
                          (model, dt, r["shape"], r["n_in"], r["n_out"], r["gemms"], r["us"],
                           "%.1f" % r["cublas_us"] if r.get("cublas_us") is not None else "-",
                           "%.3f" % r["vs_cublas"] if r.get("vs_cublas") is not None else "unmeasured",
                           " (vs cuBLAS fp16 on the widened shape)" if dt != "f16" else ""))
            if model not in SWEEP_MODELS:
                continue
            skipped = [r for r in sw if r.get("model") == model and r.get("dtype") == dt and "skipped" in r]
            st = [r for r in gs if r.get("model") == model and r.get("dtype") == dt]
            v = st[0].get("vs_cublas") if st else None
            target("batch 64 GEMMs vs cuBLAS's best for those shapes, %s %s" % (model, dt), v, ">= 0.6",
                   v >= 0.6 if v is not None else None,
                   ("vs cuBLAS fp16, widened" if dt != "f16" else "") if v is not None else
                   (st[0].get("why", "") if st else "skipped: " + skipped[0]["skipped"] if skipped else
                    "unmeasured (no line)"))


def main(argv):
    if len(argv) < 2:
        sys.stderr.write(__doc__)
        return 2
    out_json = None
    if "--json" in argv:
        i = argv.index("--json")
        out_json = argv[i + 1]
        argv = argv[:i] + argv[i + 2:]
    sweep_rows = []
    if "--sweep" in argv:
        i = argv.index("--sweep")
        sweep_rows = load(argv[i + 1])
        argv = argv[:i] + argv[i + 2:]
    rows = load(argv[1])
    targets = []  # (name, value or None, target text, met or None, note)

    def target(name, value, want, met, note=""):
        targets.append({"target": name, "value": value, "want": want, "met": met, "note": note})

    att = [r for r in rows if r.get("bench") == "decode_attention"]
    # fastest kernel per shape class (fp16 and fp8 separately)
    best = {}
    for r in att:
        for codec, key in (("f16", "f16_us"), ("fp8", "fp8_us")):
            k = (shape_class(r), codec)
            if key in r and (k not in best or r[key] < best[k][1]):
                best[k] = (r.get("kernel", 1), r[key], r)  # lines from before the kernel field: kernel 1
    print("== fastest decode-attention kernel per shape class")
    if not best:
        print("  unmeasured (no decode_attention lines)")
    for (cls, codec), (kern, us, _) in sorted(best.items()):
        print("  %-40s %-4s kernel %d (%.1f us)" % (cls, codec, kern, us))

    def best_row(ctx, kvh=8):
        cands = [b for (cls, codec), b in best.items() if codec == "f16" and b[2]["context"] == ctx and b[2]["kv_heads"] == kvh]
        return cands[0][2] if cands else None

    r64, r4 = best_row(65536), best_row(4096)
    target("decode attention vs d2d copy, batch 1 x 64K (best kernel)", r64 and r64["f16_vs_copy"], ">= 0.85",
           r64 and r64["f16_vs_copy"] >= 0.85, r64 and "kernel %d" % r64.get("kernel", 1) or "")
    target("decode attention vs d2d copy, batch 1 x 4K (best kernel)", r4 and r4["f16_vs_copy"], ">= 0.5",
           r4 and r4["f16_vs_copy"] >= 0.5, r4 and "kernel %d" % r4.get("kernel", 1) or "")
    for ctx in (16384, 32768, 65536):
        fp8 = [b for (cls, codec), b in best.items() if codec == "fp8" and b[2]["context"] == ctx and b[2]["kv_heads"] == 8]
        f16 = best_row(ctx)
        v = f16["f16_us"] / fp8[0][1] if fp8 and f16 else None
        target("FP8 KV decode speed-up over fp16 at %dK (best of each)" % (ctx // 1024), v, ">= 1.6",
               None if v is None else v >= 1.6)
    variants_summary(rows, target)
    steps = [r for r in rows if r.get("bench") == "decode_step" and "error" not in r]
    g1 = [r for r in steps if r.get("path") == "graph" and r.get("batch") == 1]
    if g1:
        r = g1[0]
        target("graph decode, batch 1: host syncs per token", r["host_syncs_per_token"], "<= 1",
               r["host_syncs_per_token"] <= 1.0)
        target("graph decode, batch 1: graph launches per token", r["graph_launches_per_token"], "<= 1",
               r["graph_launches_per_token"] <= 1.0)
        target("graph decode, batch 1: weights streamed vs the copy (the weight-streaming limit)",
               r["weights_vs_copy"], ">= 0.7", r["weights_vs_copy"] >= 0.7, "%.1f tok/s" % r["tok_s"])
    else:
        target("graph decode, batch 1 (syncs, launches, weight streaming)", None, "<= 1, <= 1, >= 0.7", None,
               "unmeasured (no graph decode_step line)")
    for r in steps:
        if r.get("batch", 1) > 1:
            print("  decode_step %s batch %d: %.0f tok/s, weights vs copy %.3f" %
                  (r["path"], r["batch"], r["tok_s"], r["weights_vs_copy"]))
    for r in rows:
        if r.get("bench") == "decode_step" and "error" in r:
            print("  decode_step batch %d FAILED with %d" % (r["batch"], r["error"]))
    cl = [r for r in steps if r.get("path", "").startswith("forward")]
    if cl and g1:
        print("  batch 1: graph %.1f tok/s vs forward+host argmax %.1f tok/s (%.2fx); kernels a token %.1f vs %.1f" %
              (g1[0]["tok_s"], cl[0]["tok_s"], g1[0]["tok_s"] / cl[0]["tok_s"], g1[0]["graph_kernels_per_token"],
               cl[0]["kernels_per_token"]))
    sweep_targets(rows + sweep_rows, target)
    resume_targets(rows, target)
    for p in argv[2:]:
        try:
            tail = open(p, encoding="utf-8", errors="replace").read().strip().splitlines()[-1:]
        except OSError:
            tail = ["(missing)"]
        print("  %s: %s" % (p, tail[0] if tail else "(empty)"))
    print("== targets")
    for t in targets:
        v = "unmeasured" if t["value"] is None else "%.3f" % t["value"]
        m = "" if t["met"] is None else ("met" if t["met"] else "NOT MET")
        print("  %-78s %-10s %-8s %-7s %s" % (t["target"], v, t["want"], m, t["note"]))
    if out_json:
        with open(out_json, "w", encoding="utf-8") as f:
            for t in targets:
                f.write(json.dumps(t) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
