#!/bin/bash
# Two builds of bench_engine on one model, alternating, so machine noise hits both alike
# (the A/B figures in bench/README.md, issue 31 fourth stop).
#
# Usage: bench/ab_engine.sh OLD_BENCH_ENGINE NEW_BENCH_ENGINE MODEL THREADS ROUNDS PROMPT_IDS DECODE_IDS [GEN_TOKENS]
#   e.g. git worktree add /tmp/old aae44ad && cmake -S /tmp/old -B /tmp/old/b -DKVT_CUDA=OFF &&
#        cmake --build /tmp/old/b --target bench_engine
#        bench/ab_engine.sh /tmp/old/b/bench_engine build-cpu/bench_engine models/SmolLM2-135M-Instruct.Q4_1.gguf 2 3 P D 64
# PROMPT_IDS / DECODE_IDS: files of space-separated token ids. Prints one line a run:
#   round binary decode_tok_s prefill_tok_s
set -euo pipefail
[ $# -ge 7 ] || { sed -n '5,10p' "$0"; exit 2; }
old=$1 new=$2 model=$3 threads=$4 rounds=$5 pids=$6 dids=$7 gen=${8:-64}
for r in $(seq 1 "$rounds"); do
	for b in "$old" "$new"; do
		"$b" --model "$model" --prompt-ids-file "$pids" --decode-ids-file "$dids" --threads "$threads" \
			--gen-tokens "$gen" --reps 3 2>/dev/null | tail -n 1 |
			python3 -c 'import json,sys; d=json.load(sys.stdin); print(sys.argv[1], sys.argv[2], d["decode_tok_s"], d["prefill_tok_s"])' "$r" "$b"
	done
done
