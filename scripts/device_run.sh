#!/usr/bin/env bash
# Everything a GPU machine run needs, in one call: environment facts, build, every suite (cpu, gpu
# with compute-sanitizer), and the demo. Logs and results go to $OUT (or ./device-out).
# The device has no network: Catch2 travels as Debian's .deb in .deps/ (carry it), unpacked to /tmp.
set -uo pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-$PWD/device-out}
mkdir -p "$OUT"
exec > >(tee "$OUT/device_run.log") 2>&1

echo "== environment"
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader
nvcc --version | tail -n 2
python3 -c 'import torch; print("torch", torch.__version__, "cuda", torch.version.cuda)' 2>/dev/null || echo "torch: not importable"
meson --version

if [ ! -f /usr/include/catch2/catch.hpp ] && ls .deps/catch2_*.deb >/dev/null 2>&1; then
  rm -rf /tmp/c2 && dpkg -x .deps/catch2_*.deb /tmp/c2
  export PKG_CONFIG_PATH=/tmp/c2/usr/share/pkgconfig PKG_CONFIG_SYSROOT_DIR=/tmp/c2
fi

build=build-device
rm -rf "$build"
meson setup "$build" >"$OUT/setup.log" 2>&1 || { cat "$OUT/setup.log"; exit 1; }
ninja -C "$build" >"$OUT/build.log" 2>&1 || { tail -n 60 "$OUT/build.log"; exit 1; }
unset PKG_CONFIG_SYSROOT_DIR  # the pkg-config example must find uvm.pc as a user would

echo "== tests"
meson test -C "$build" --print-errorlogs "$@" >"$OUT/meson-test.out" 2>&1
grep -E '^ *[0-9]+/[0-9]+ ' "$OUT/meson-test.out"
cp "$build/meson-logs/testlog.txt" "$OUT/testlog.txt"
python3 scripts/summarize_tests.py "$build/meson-logs/testlog.json" | tee "$OUT/summary.txt"
status=${PIPESTATUS[0]}

echo "== demo"
"$build/uvm_demo"

echo "== doctor"
PYTHONPATH=python_shim python3 -m uvm doctor

echo "== JIT build bench"
PYTHONPATH=python_shim python3 bench/jit_bench.py
exit "$status"
