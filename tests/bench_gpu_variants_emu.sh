#!/bin/sh
# tests/bench_gpu_variants_emu.sh BENCH_GPU_EMU PYTHON SUMMARY — bench_gpu's decode-variant
# harness on the CPU emulator (contexts / KVT_BENCH_VARIANTS_SMALL, one call a figure): a
# dry run of what bench/device_check.sh times on a GPU. Passes when every class ran every
# variant (no skipped class), every line parses, and bench/device_summary.py writes a
# decode_choices row for each of its 6 ranges. The times mean nothing; nothing checks them.
set -u
out=bench_gpu_variants_emu
"$1" /tmp --variants >"$out.jsonl" || { echo "bench_gpu --variants failed"; exit 1; }
"$2" "$3" "$out.jsonl" >"$out.txt" || { cat "$out.txt"; echo "device_summary.py failed"; exit 1; }
cat "$out.txt"
n_lines=$(grep -c '"bench":"decode_variant","variant"' "$out.jsonl")
n_rows=$(grep -cE '^[[:space:]]*\{ (true|false), [0-9]+, [123], (true|false), (true|false) \},' "$out.txt")
echo "decode_variant lines: $n_lines (want 6 classes x (6 fp16 + 2 x 10 8-bit) = 156); decode_choices rows: $n_rows (want 6)"
! grep -q '"skipped":true' "$out.jsonl" && [ "$n_lines" = 156 ] && [ "$n_rows" = 6 ]
