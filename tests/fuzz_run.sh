#!/bin/sh
# tests/fuzz_run.sh — run one libFuzzer target for a bounded time (ctest -L fuzz).
#   fuzz_run.sh FUZZER SEED_DIR REGRESS_DIR SECONDS MAX_LEN
# The corpus is a scratch copy of SEED_DIR (and REGRESS_DIR) in a temporary
# directory, removed afterwards: the run never writes into the source tree.
# A crash, leak, timeout or sanitizer report fails the test; the input is kept
# in the build directory's fuzz-findings/ and the message says where to check it
# in (REGRESS_DIR, which test_fuzz_replay replays).
set -u
fuzzer=$1 seeds=$2 regress=$3 seconds=$4 max_len=$5
name=$(basename "$fuzzer")
work=$(mktemp -d "${TMPDIR:-/tmp}/kvt_${name}_XXXXXX") || exit 1
trap 'rm -rf "$work"' EXIT
mkdir -p "$work/corpus" "$work/artifacts"
cp "$seeds"/* "$work/corpus/" 2>/dev/null
[ -d "$regress" ] && cp "$regress"/* "$work/corpus/" 2>/dev/null
"$fuzzer" -max_total_time="$seconds" -max_len="$max_len" -timeout=20 -rss_limit_mb=2048 \
	-print_final_stats=1 -artifact_prefix="$work/artifacts/" "$work/corpus" >"$work/log" 2>&1
rc=$?
grep -E '^(stat::number_of_executed_units|stat::average_exec_per_sec|stat::new_units_added)' "$work/log"
if [ $rc -ne 0 ] || [ -n "$(ls -A "$work/artifacts")" ]; then
	tail -60 "$work/log"
	out=$(dirname "$fuzzer")/fuzz-findings
	mkdir -p "$out"
	cp "$work"/artifacts/* "$out/" 2>/dev/null
	echo "$name: a finding (exit $rc); input(s) in $out: fix the bug, then check the input in as $regress/<name>"
	exit 1
fi
echo "$name: no finding in ${seconds} s"
