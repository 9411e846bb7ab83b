#!/usr/bin/env bash
# Fetches the CUDA 12 runtime headers (with their crt/ headers) and libcudart.so.12 that the
# cuda-12.x-headers tests build uvm against, from NVIDIA's PyPI wheels, into
# .deps/cuda-<version>/{include,lib64} (a toolkit layout for -Dtoolkit_dir). Two generations: 12.1 (int-device prefetch and advise) and 12.8 (the _v2
# location forms). Already-fetched versions are kept. Without network it says so and fails.
set -euo pipefail
cd "$(dirname "$0")/.."
deps=${UVM_DEPS_DIR:-$PWD/.deps}
status=0
for pin in 12.1:12.1.105:12.1.105 12.8:12.8.90:12.8.93; do
  IFS=: read -r version runtime_version nvcc_version <<<"$pin"
  dir="$deps/cuda-$version"
  [ -f "$dir/include/crt/host_defines.h" ] && [ -f "$dir/lib64/libcudart.so" ] && continue
  tmp=$(mktemp -d)
  # The runtime wheel has the headers and libcudart.so.12; the crt/ headers they include come in
  # the nvcc wheel, of which only include/crt is kept.
  if python3 -m pip download -q --retries 1 --timeout 20 --no-deps --only-binary=:all: \
       --python-version 3.12 --platform manylinux2014_x86_64 --platform manylinux_2_17_x86_64 \
       --platform manylinux1_x86_64 -d "$tmp" "nvidia-cuda-runtime-cu12==$runtime_version" \
       "nvidia-cuda-nvcc-cu12==$nvcc_version" 2>"$tmp/pip.log"; then
    rm -rf "$dir" && mkdir -p "$dir/lib64"
    python3 - "$tmp" "$dir" <<'PY'
import glob, os, shutil, sys, zipfile
tmp, dest = sys.argv[1], sys.argv[2]
for wheel, prefix in (("nvidia_cuda_runtime_cu12-*.whl", "nvidia/cuda_runtime/include/"),
                      ("nvidia_cuda_nvcc_cu12-*.whl", "nvidia/cuda_nvcc/include/crt/")):
    with zipfile.ZipFile(glob.glob(os.path.join(tmp, wheel))[0]) as z:
        for name in z.namelist():
            if name.startswith(prefix) and not name.endswith("/"):
                target = os.path.join(dest, "include", name.split("/include/", 1)[1])
                os.makedirs(os.path.dirname(target), exist_ok=True)
                with z.open(name) as src, open(target, "wb") as out:
                    shutil.copyfileobj(src, out)
        if "runtime" in wheel:
            with z.open("nvidia/cuda_runtime/lib/libcudart.so.12") as src, \
                 open(os.path.join(dest, "lib64", "libcudart.so.12"), "wb") as out:
                shutil.copyfileobj(src, out)
PY
    ln -s libcudart.so.12 "$dir/lib64/libcudart.so"
    echo "uvm: CUDA $version runtime headers in $dir"
  else
    echo "uvm: could not fetch the CUDA $version runtime and nvcc wheels from PyPI: $(tail -n 1 "$tmp/pip.log")" >&2
    status=1
  fi
  rm -rf "$tmp"
done
exit $status
