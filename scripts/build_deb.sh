#!/usr/bin/env bash
# Build the Debian package: a CPU-only, portable (no -march=native), hardened
# Release build of kvtierd and kvtier in build-pkg/ (prefix /usr), then
# `cpack -G DEB`, which computes the dependencies with dpkg-shlibdeps and
# writes build-pkg/kvtier_VERSION-1_ARCH.deb. cmake/package.cmake has the
# layout and the maintainer scripts; cpack refuses a CUDA, native or sanitizer
# build (cmake/cpack_check.cmake). Prints the package's path last.
#
# Env: KVT_PKG_BUILD (build directory, default build-pkg), JOBS (default nproc).
set -euo pipefail
cd "$(dirname "$0")/.."
dir=${KVT_PKG_BUILD:-build-pkg}
# Debian's hardening flags (dpkg-buildflags with hardening=+all), as a package build gets them
cflags="-O2 -g -fstack-protector-strong -fstack-clash-protection -fcf-protection -Wformat -Werror=format-security"
cppflags="-D_FORTIFY_SOURCE=2"
ldflags="-Wl,-z,relro -Wl,-z,now"
cmake -S . -B "$dir" -DCMAKE_BUILD_TYPE=Release -DKVT_CUDA=OFF -DKVT_NATIVE=OFF -DKVT_WERROR=ON \
	-DCMAKE_INSTALL_PREFIX=/usr -DCMAKE_SKIP_INSTALL_ALL_DEPENDENCY=ON \
	"-DCMAKE_C_FLAGS=$cflags $cppflags" "-DCMAKE_EXE_LINKER_FLAGS=$ldflags" >/dev/null
cmake --build "$dir" -j"${JOBS:-$(nproc)}" --target kvtierd kvtier kvt_manual kvt_changelog
rm -f "$dir"/kvtier_*.deb
(cd "$dir" && cpack -G DEB >/dev/null)
ls "$dir"/kvtier_*.deb
