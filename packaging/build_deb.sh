#!/usr/bin/env bash
# Builds the Debian package of the edge-sdk C runtime: libedge_sdk.so / libedge_sdk.a, edge_sdk.h, edge_sdk.pc,
# the edge_generate example (binary and source) and jetson/README.md.
#
#   packaging/build_deb.sh amd64|arm64 [OUT_DIR]      (OUT_DIR defaults to dist/)
#
# Builds natively when the target is this machine's architecture, else cross-builds with
# jetson/cmake/aarch64-linux-gnu.cmake (arm64 only; needs gcc-aarch64-linux-gnu and libcjson-dev:arm64).
# The library is built without -march=native, so the package runs on any CPU of its architecture: it holds one build
# of the CPU kernels per instruction set and runs the best one the CPU has (kernels/cpu/isa_builds.cmake).
# Prints the path of the .deb.
set -euo pipefail

arch=${1:-}
out_dir=${2:-dist}
root=$(cd "$(dirname "$0")/.." && pwd)
version=$(sed -n 's/^__version__ = "\(.*\)"$/\1/p' "$root/edge_sdk/__init__.py")
host_arch=$(dpkg --print-architecture)

case "$arch" in
  amd64 | arm64) ;;
  *)
    echo "usage: $0 amd64|arm64 [OUT_DIR]" >&2
    exit 2
    ;;
esac
case "$arch" in
  amd64) triplet=x86_64-linux-gnu ;;
  arm64) triplet=aarch64-linux-gnu ;;
esac
# Debian multiarch library directory (GNUInstallDirs picks it only for native builds, so it is set here).
cmake_args=(-DCMAKE_BUILD_TYPE=Release -DCMAKE_INSTALL_PREFIX=/usr "-DCMAKE_INSTALL_LIBDIR=lib/$triplet"
  -DEDGE_SDK_NATIVE_ARCH=OFF -DEDGE_SDK_BUILD_TESTS=OFF)
strip=strip
if [[ "$arch" != "$host_arch" ]]; then
  if [[ "$arch" != arm64 ]]; then
    echo "$0: cross-building for $arch on $host_arch is not supported (only arm64 from other hosts)" >&2
    exit 2
  fi
  cmake_args+=("-DCMAKE_TOOLCHAIN_FILE=$root/jetson/cmake/aarch64-linux-gnu.cmake")
  strip=aarch64-linux-gnu-strip
fi

work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
cmake -S "$root/jetson" -B "$work/build" "${cmake_args[@]}" >"$work/configure.log" || {
  cat "$work/configure.log" >&2
  exit 1
}
cmake --build "$work/build" -j "$(nproc)" >"$work/build.log" || {
  cat "$work/build.log" >&2
  exit 1
}
DESTDIR="$work/package" cmake --install "$work/build" >/dev/null
find "$work/package/usr" -type f \( -name '*.so*' -o -path '*/bin/*' \) -exec "$strip" --strip-unneeded {} +

mkdir -p "$work/package/DEBIAN"
installed_size=$(du -sk "$work/package/usr" | cut -f1)
cat >"$work/package/DEBIAN/control" <<CONTROL
Package: edge-sdk-runtime
Version: $version
Architecture: $arch
Maintainer: ${EDGE_SDK_DEB_MAINTAINER:-edge-sdk maintainers <edge-sdk@localhost>}
Depends: libc6 (>= 2.34), libcjson1 (>= 1.7.10), libgomp1
Recommends: libcjson-dev, pkg-config
Section: libdevel
Priority: optional
Installed-Size: $installed_size
Description: edge-sdk C runtime for activation-sparse LLM bundles
 libedge_sdk runs bundles exported by edge-sdk (manifest.json + weights.safetensors)
 on the CPU: a C99 API (edge_sdk.h), shared and static libraries, a pkg-config
 file (edge_sdk.pc) and the edge_generate example.
CONTROL

mkdir -p "$out_dir"
deb="$out_dir/edge-sdk-runtime_${version}_${arch}.deb"
dpkg-deb --root-owner-group -Zxz --build "$work/package" "$deb" >/dev/null
echo "$deb"
