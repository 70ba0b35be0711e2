#!/usr/bin/env bash
# The main job on a fresh Debian 12 machine: install dependencies, fetch the
# default model, build, and run kvtierd — the daemon — on it, in the
# foreground, with configs/kvtier.conf (loopback :8080, data in ./kvtier-data,
# the GPU when there is one, else the CPU backend). Extra arguments go to
# kvtierd (e.g. --listen 127.0.0.1:9000 --data-dir /var/lib/kvtier).
# Ctrl-C (SIGINT) or SIGTERM drains, persists every session to NVMe and exits 0.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/install_deps.sh
scripts/fetch_model.sh
cmake -S . -B build -DCMAKE_BUILD_TYPE=Release >/dev/null
cmake --build build -j"$(nproc)" --target kvtierd kvtier
cat >&2 <<'HINT'
kvtierd is starting. Try, from another terminal:
  curl -s localhost:8080/v1/chat/completions -d '{"messages":[{"role":"user","content":"What is the capital of France?"}],"session_id":"demo","temperature":0}'
  build/kvtier stats          # the tier statistics report
  build/kvtier sessions       # and, after a restart: build/kvtier resume demo
HINT
exec ./build/kvtierd -c configs/kvtier.conf "$@"
