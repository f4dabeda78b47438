#!/usr/bin/env bash
# Creates .venv with edge-sdk installed in editable mode plus its test tools.
# torch is pinned first: on the project's machines `torch==2.13.0` resolves to a local CPU wheel,
# while an unpinned torch would pull several GB of CUDA packages.
set -euo pipefail
cd "$(dirname "$0")/.."
python3 -m venv .venv
.venv/bin/python -m pip install --quiet --upgrade pip
.venv/bin/python -m pip install --quiet "torch==2.13.0"
.venv/bin/python -m pip install --quiet -e ".[test]"
.venv/bin/edge-sdk --version
