#!/usr/bin/env bash
# The main job: builds libuvm (installing missing tools first), runs the C demo on GPU 0 — allocate,
# fill on the GPU, offload to the host, check, bring back — and then, where torch is installed, the
# offload benchmark (python -m uvm bench; results in bench-out/). Without a GPU it builds and says
# that no CUDA device is present.
set -euo pipefail
cd "$(dirname "$0")/.."
source scripts/build.sh
echo "built $(ls "$build"/libuvm.so.*.*.* 2>/dev/null | head -n 1)"
set +e
"$build/uvm_demo"
status=$?
set -e
case $status in
  0) echo "demo finished on GPU 0"
     if python3 -c 'import torch' 2>/dev/null; then
       PYTHONPATH=python_shim python3 -m uvm bench --out bench-out
     else
       echo "NOTE: torch is not installed, so the offload benchmark (python -m uvm bench) did not run."
     fi ;;
  2) echo "NOTE: no CUDA device is present on this machine; libuvm is built, the demo did not run." ;;
  *) echo "demo failed (exit $status)"; exit "$status" ;;
esac
