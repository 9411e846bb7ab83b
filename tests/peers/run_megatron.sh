#!/usr/bin/env bash
# Runs tests/peers/megatron_on_uvm.py with Megatron-Core's wheel from .deps/wheels installed into a
# scratch folder (no network needed: it depends only on torch, numpy and packaging, which the GPU
# machine has). Needs a GPU; ends with "N passed, M failed, K blocked".
set -uo pipefail
cd "$(dirname "$0")/../.."
python=${UVM_PYTHON:-python3}
wheel=$(ls .deps/wheels/megatron_core-*.whl 2>/dev/null | head -n 1)
if [ -z "$wheel" ]; then
  echo "SKIP: no megatron-core wheel in .deps/wheels (pip download --python-version 3.12 --only-binary=:all: --no-deps megatron-core)"
  exit 77
fi
site=$(mktemp -d)
trap 'rm -rf "$site"' EXIT
"$python" -m pip install -q --no-deps --target "$site" "$wheel" || exit 1
PYTHONPATH="$PWD/python_shim:$site" "$python" tests/peers/megatron_on_uvm.py
