#!/bin/sh
# tests/device_check_emu.sh BUILD — bench/device_check.sh run end to end on the CPU emulator's
# binaries (BUILD/*_emu under the names the GPU bundle gives them, kvtierd, the CPU-only daemon
# smoke), every stage capped at a few seconds: a dry run of the real device check, so that a
# lent GPU's few minutes are never lost to a script error. Passes when every stage starts (its
# header printed, none skipped for lack of budget), the summary runs (bench/device_summary.py
# exits 0 and prints its table), the closing lines are printed, and the output holds no shell
# error ("command not found", "No such file", "syntax error", "unbound variable"). The figures
# and the stages' own results mean nothing here (the emulator is slow, and the caps cut them).
set -u
build=$1
src=$(cd "$(dirname "$0")/.." && pwd)
work=$(mktemp -d /tmp/kvt_device_check_emu_XXXXXX)
trap 'rm -rf "$work"' EXIT
mkdir -p "$work/bin" "$work/out"
for t in test_gpu_parity test_gpu_invariant test_gpu_graph test_t1_pool test_manager_tiers test_manager_model test_sched \
	test_manager_layered test_sched_layered bench_gpu; do
	[ -x "$build/${t}_emu" ] || { echo "missing $build/${t}_emu"; exit 1; }
	ln -s "$build/${t}_emu" "$work/bin/$t"
done
ln -s "$build/kvtierd" "$work/bin/kvtierd"
cd "$src" || exit 1
touch "$work/marker"
OUT="$work/out" KVT_DEVICE_BIN="$work/bin" KVT_SMOKE_DEVICES=cpu KVT_SMOKE_DIR="$work/smoke" \
	KVT_CHECK_S=400 KVT_PARITY_S=12 KVT_INVARIANT_S=12 KVT_GRAPH_S=12 KVT_BENCH_S=12 KVT_SWEEP_S=12 KVT_RESUME_S=12 \
	KVT_TIER_S=10 KVT_SMOKE_S=60 KVT_SDPA_S=10 bash bench/device_check.sh >"$work/log" 2>&1
echo "device_check.sh exit status: $? (not checked: the caps cut the stages short)"
# the stages the caps cut short leave their scratch folders in /tmp: remove what this run made
# (CTest runs this test alone: RUN_SERIAL, so nothing else is making /tmp/kvt_* meanwhile)
find /tmp -maxdepth 1 -name 'kvt_*' -newer "$work/marker" ! -path "$work" -exec rm -rf {} +
cat "$work/log"
ok=0
for h in "== parity" "== order rule (test_gpu_invariant)" "== graphs, counters" "== benchmarks" "== batch sweep" "== resume TTFT" \
	"== test_t1_pool on the CUDA backend" "== test_sched_layered on the CUDA backend" "== kvtierd on cuda and cpu" \
	"== pytorch sdpa" "== summary" "parity exit status:" "device check:"; do
	grep -qF -- "$h" "$work/log" || { echo "FAIL: no '$h' in the output"; ok=1; }
done
if grep -q "skipped: the check's" "$work/log"; then
	echo "FAIL: a stage was skipped for lack of budget"
	ok=1
fi
if grep -qE "command not found|No such file|syntax error|unbound variable|Traceback" "$work/log"; then
	echo "FAIL: a script error:"
	grep -nE "command not found|No such file|syntax error|unbound variable|Traceback" "$work/log"
	ok=1
fi
[ -s "$work/out/summary.txt" ] || { echo "FAIL: no summary table"; ok=1; }
exit $ok
