#!/usr/bin/env bash
# Sets up a fresh machine: the Debian packages the C runtime tests need (when run as root with apt-get),
# then .venv with edge-sdk installed in editable mode plus its test tools.
# torch is pinned first: on the project's machines `torch==2.13.0` resolves to a local CPU wheel,
# while an unpinned torch would pull several GB of CUDA packages.
set -euo pipefail
cd "$(dirname "$0")/.."

# C runtime (jetson/): cJSON for the manifest, pkg-config, and the aarch64 cross compiler + qemu-user with an
# arm64 cJSON to build and run it as it runs on a Jetson. Without them those tests skip and say why.
SYSTEM_PACKAGES=(cmake gcc pkg-config libcjson-dev gcc-aarch64-linux-gnu libc6-dev-arm64-cross qemu-user)
missing_system_packages() {
  local package
  for package in "${SYSTEM_PACKAGES[@]}" libcjson-dev:arm64; do
    dpkg-query -W -f='${Status}' "$package" 2>/dev/null | grep -q "install ok installed" || echo "$package"
  done
}
if command -v apt-get >/dev/null && command -v dpkg >/dev/null; then
  if [ -n "$(missing_system_packages)" ]; then
    if [ "$(id -u)" = 0 ]; then
      if ! { dpkg --add-architecture arm64 && apt-get update -qq &&
        DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends \
          "${SYSTEM_PACKAGES[@]}" libcjson-dev:arm64 >/dev/null; }; then
        echo "setup: apt-get could not install: $(missing_system_packages | tr '\n' ' ')(those tests will skip)" >&2
      fi
    else
      echo "setup: not root, so not installing: $(missing_system_packages | tr '\n' ' ')(the C runtime tests will skip)" >&2
    fi
  fi
fi

python3 -m venv .venv
.venv/bin/python -m pip install --quiet --upgrade pip
.venv/bin/python -m pip install --quiet "torch==2.13.0"
.venv/bin/python -m pip install --quiet -e ".[test]"
.venv/bin/edge-sdk --version
