#!/usr/bin/env bash
# Fetches the CUDA 12 runtime headers and libcudart.so.12 that the cuda-12.x-headers tests build uvm
# against, from NVIDIA's PyPI wheels, into .deps/cuda-<version>/{include,lib64} (a toolkit layout
# for -Dtoolkit_dir). Two generations: 12.1 (int-device prefetch and advise) and 12.8 (the _v2
# location forms). Already-fetched versions are kept. Without network it says so and fails.
set -euo pipefail
cd "$(dirname "$0")/.."
deps=${UVM_DEPS_DIR:-$PWD/.deps}
status=0
for pin in 12.1:12.1.105 12.8:12.8.90; do
  version=${pin%%:*} wheel_version=${pin##*:}
  dir="$deps/cuda-$version"
  [ -f "$dir/include/cuda_runtime_api.h" ] && [ -f "$dir/lib64/libcudart.so" ] && continue
  tmp=$(mktemp -d)
  if python3 -m pip download -q --retries 1 --timeout 20 --no-deps --only-binary=:all: --python-version 3.12 \
       --platform manylinux2014_x86_64 --platform manylinux1_x86_64 -d "$tmp" \
       "nvidia-cuda-runtime-cu12==$wheel_version" 2>"$tmp/pip.log" &&
     python3 -m zipfile -e "$tmp"/nvidia_cuda_runtime_cu12-*.whl "$tmp/x"; then
    rm -rf "$dir" && mkdir -p "$dir/lib64"
    cp -r "$tmp/x/nvidia/cuda_runtime/include" "$dir/"
    cp "$tmp/x/nvidia/cuda_runtime/lib/libcudart.so.12" "$dir/lib64/"
    ln -s libcudart.so.12 "$dir/lib64/libcudart.so"
    echo "uvm: CUDA $version runtime headers in $dir"
  else
    echo "uvm: could not fetch nvidia-cuda-runtime-cu12==$wheel_version from PyPI: $(tail -n 1 "$tmp/pip.log")" >&2
    status=1
  fi
  rm -rf "$tmp"
done
exit $status
