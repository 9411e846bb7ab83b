#!/usr/bin/env bash
# What a user installs, made and installed as they would: the sdist from this tree, the wheel from
# that sdist, installed into a fresh virtualenv with the test requirements and nothing of this tree.
#
#   bash scripts/test_wheel.sh            prints the wheel and the virtualenv's python on its last line
#
# UVM_TEST_WHEEL=path.whl installs that wheel instead of building one (the GPU machine: no network
# for torch's headers, so the CPU machine's wheel travels there). UVM_WHEEL_VENV (default
# .venv-wheel) is the virtualenv, made anew; UVM_PYTHON the interpreter that builds (one with
# setuptools >= 70.1 and build: scripts/install_deps.sh's .venv) and whose base makes the virtualenv;
# UVM_WHEEL_SITE a site directory the virtualenv sees too (the GPU machine's torch).
set -euo pipefail
cd "$(dirname "$0")/.."
python=${UVM_PYTHON:-python3}
venv=${UVM_WHEEL_VENV:-$PWD/.venv-wheel}
dist=$PWD/.build-wheel/dist
wheel=${UVM_TEST_WHEEL:-}
if [ -z "$wheel" ]; then
  rm -rf "$dist" && mkdir -p "$dist"
  "$python" -m build --sdist --no-isolation --outdir "$dist" . >"$dist/sdist.log" 2>&1 ||
    { cat "$dist/sdist.log"; exit 1; }
  sdist=$(ls "$dist"/uvm_cuda-*.tar.gz)
  # Built from the sdist alone, as pip builds it for a user; what the sdist cannot carry (CUDA 12's
  # headers, torch's) comes from where this tree keeps it.
  UVM_WHEEL_CUDA12=${UVM_WHEEL_CUDA12:-$PWD/.deps/cuda-12.1} UVM_TORCH_HEADERS_DIR=${UVM_TORCH_HEADERS_DIR:-$PWD/.deps/torch} \
    "$python" -m pip wheel -q --no-deps --no-build-isolation -w "$dist" "$sdist" >"$dist/wheel.log" 2>&1 ||
    { cat "$dist/wheel.log"; exit 1; }
  wheel=$(ls "$dist"/uvm_cuda-*.whl)
fi
base=$("$python" -c 'import sys; print(getattr(sys, "_base_executable", sys.executable))')
rm -rf "$venv"
"$base" -m venv "$venv"
if [ -n "${UVM_WHEEL_SITE:-}" ]; then
  echo "$UVM_WHEEL_SITE" >"$("$venv/bin/python" -c 'import site; print(site.getsitepackages()[0])')/uvm-test-site.pth"
  # The tools come from that site too (pytest, build, setuptools): the setuptools a fresh venv of
  # Python 3.11 bundles would come first, and it is too old to build a wheel (no bdist_wheel).
  "$venv/bin/python" -m pip uninstall -q -y setuptools >/dev/null 2>&1 || true
fi
"$venv/bin/python" -m pip install -q --disable-pip-version-check --no-deps "$wheel"
if ! "$venv/bin/python" -c 'import pytest' 2>/dev/null; then
  "$venv/bin/python" -m pip install -q --disable-pip-version-check -r tests/python/requirements.txt
fi
echo "$wheel $venv/bin/python"
