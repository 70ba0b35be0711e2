#!/usr/bin/env bash
# The main job on a fresh Debian 12 machine: install dependencies, fetch the
# default model, build, and generate a completion. Extra arguments go to
# `kvtier generate` (e.g. -p "Once upon a time" -n 64 --chat).
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/install_deps.sh
scripts/fetch_model.sh
cmake -S . -B build -DCMAKE_BUILD_TYPE=Release >/dev/null
cmake --build build -j"$(nproc)" --target kvtier
if [ $# -eq 0 ]; then
	set -- -p "The capital of France is" -n 32
fi
exec ./build/kvtier generate -m models/SmolLM2-135M-Instruct.Q4_1.gguf "$@"
