#!/usr/bin/env bash
# bench/device_check.sh — the CUDA backend's device check, in one go (< 8 min on one H200).
#
# Here (the build machine, no GPU needed):
#   bench/device_check.sh --bundle        # builds build-device/ for sm_90 and packs .device/
# There (the GPU machine, from the repository root, .device carried):
#   bench/device_check.sh                 # parity tests, then the benchmarks, figures to $OUT
# Prints the parity test's summary, then bench_gpu's JSON lines, then PyTorch's
# SDPA on the same decode shapes (bench/gpu_sdpa.py) where torch is there.
set -uo pipefail
cd "$(dirname "$0")/.."
if [ "${1:-}" = "--bundle" ]; then
	set -e
	grep -qx '/.device/' .git/info/exclude 2>/dev/null || echo /.device/ >>.git/info/exclude
	# x86-64-v3 (AVX2, FMA, F16C) rather than -march=native: the GPU machine's CPU may differ.
	cmake -S . -B build-device -DCMAKE_BUILD_TYPE=Release -DKVT_CUDA=ON -DKVT_NATIVE=OFF \
		-DCMAKE_C_FLAGS=-march=x86-64-v3 -DCMAKE_CUDA_ARCHITECTURES="${KVT_CUDA_ARCHS:-90}" >/dev/null
	cmake --build build-device -j"$(nproc)" --target test_gpu_parity bench_gpu
	rm -rf .device
	../shared/tools/device-bundle.sh .device build-device/test_gpu_parity build-device/bench_gpu
	exit 0
fi
out=${OUT:-/tmp/kvt-device-out}
mkdir -p "$out"
. .device/env.sh
nvidia-smi --query-gpu=name,memory.total,driver_version,clocks.sm --format=csv 2>&1 | tee "$out/gpu.txt"
echo "== parity"
timeout "${KVT_PARITY_S:-150}" test_gpu_parity 2>&1 | tee "$out/parity.txt"
parity=${PIPESTATUS[0]}
echo "== benchmarks"
timeout "${KVT_BENCH_S:-200}" bench_gpu /tmp 2>&1 | tee "$out/bench_gpu.jsonl"
echo "== pytorch sdpa"
timeout 40 env -u LD_LIBRARY_PATH python3 bench/gpu_sdpa.py "$out/bench_gpu.jsonl" 2>&1 | tee "$out/sdpa.jsonl"
echo "parity exit status: $parity"
exit "$parity"
