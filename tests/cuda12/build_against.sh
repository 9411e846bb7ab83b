#!/usr/bin/env bash
# uvm built against CUDA 12 runtime headers (fetched by scripts/fetch_cuda12.sh into
# .deps/cuda-<version>): the library, the demo and every suite compile, and the CPU suites pass.
# With CUDA 12 headers uvm has no discard API, so the CPU suites check that staged offload and
# discard are refused and auto migrates ([cuda12] tests, no scenario needed).
#   build_against.sh SOURCE_ROOT BUILD_ROOT VERSION [--build-only]
# --build-only stops once it is built (the GPU machine runs that build's gpu suite instead).
# Exits 77 (a skip, with the reason) when those headers are not there.
set -uo pipefail
src=$1 build=$2 version=$3
toolkit=${UVM_DEPS_DIR:-$src/.deps}/cuda-$version
if [ ! -f "$toolkit/include/cuda_runtime_api.h" ]; then
  echo "SKIP: no CUDA $version runtime headers in $toolkit (bash scripts/fetch_cuda12.sh fetches them)"
  exit 77
fi
sub=$build/cuda-$version
if [ ! -f "$sub/build.ninja" ]; then
  # plain: no optimisation flags; this build checks that everything compiles and the CPU suites pass
  # (the sanitizer runs are the main build's)
  meson setup "$sub" "$src" -Dtoolkit_dir="$toolkit" --buildtype=plain -Dsanitizers=false >"$sub.setup.log" 2>&1 || { cat "$sub.setup.log"; exit 1; }
fi
grep -h "CUDA runtime headers" "$sub.setup.log"
ninja -C "$sub" >"$sub.build.log" 2>&1 || { tail -n 40 "$sub.build.log"; exit 1; }
echo "built libuvm.so, the demo and all test programs against CUDA $version in $sub"
[ "${4:-}" = --build-only ] && exit 0
meson test -C "$sub" --suite cpu --no-suite python --print-errorlogs
