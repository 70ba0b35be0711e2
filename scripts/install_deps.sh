#!/usr/bin/env bash
# Install the Debian 12 packages kvtier builds and tests with. Idempotent:
# skips apt entirely when every package is already installed.
set -euo pipefail

pkgs=(build-essential cmake pkg-config git ca-certificates python3 python3-pip python3-venv
      libopenblas-dev libpcre2-dev
      liburing-dev liblz4-dev libsqlite3-dev libssl-dev libxxhash-dev
      libjansson-dev libmicrohttpd-dev libcurl4-openssl-dev fio
      libhiredis-dev redis-server redis-tools haproxy  # T3 (Redis Cluster), its tests, the two-node example
      lintian file man-db groff-base adduser procps  # the package test
      clang libclang-rt-14-dev  # clang: the libFuzzer targets (tests/fuzz_*.c, ctest -L fuzz)
      chromium)                 # the dashboard in a real headless browser (tests/daemon/test_retention.py)

missing=()
for p in "${pkgs[@]}"; do
	dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if [ ${#missing[@]} -eq 0 ]; then
	echo "install_deps: all ${#pkgs[@]} packages present"
	exit 0
fi
SUDO=
[ "$(id -u)" -eq 0 ] || SUDO=sudo
echo "install_deps: installing ${missing[*]}"
$SUDO apt-get update -qq
DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq --no-install-recommends "${missing[@]}"
