#!/usr/bin/env bash
# Installs what building uvm needs, when it is missing: Meson (>= 1.0), Ninja, pkg-config, a C/C++
# compiler. With UVM_DEPS=tests (what test.sh asks for) also what testing needs: binutils, Catch2
# (Debian's header-only package), e2fsprogs, the Python environment the tests run in (.venv: see
# below), and the CUDA 12 runtime headers the cuda-12.x-headers tests build against (from PyPI,
# into .deps/). The CUDA toolkit itself must already be there ($CUDA_HOME, $CUDA_PATH or
# /usr/local/cuda).
set -euo pipefail
for_tests=false
[ "${UVM_DEPS:-build}" = tests ] && for_tests=true

cuda_home=${CUDA_HOME:-${CUDA_PATH:-/usr/local/cuda}}
if [ ! -f "$cuda_home/include/cuda_runtime_api.h" ]; then
  echo "uvm: no CUDA toolkit at $cuda_home (cuda_runtime_api.h missing)." >&2
  echo "     Install the CUDA toolkit 12.x or 13.x, or point CUDA_HOME at it." >&2
  exit 1
fi

have_catch2() { [ -f /usr/include/catch2/catch.hpp ] || [ -f /usr/include/catch2/catch_all.hpp ] ||
                pkg-config --exists catch2 2>/dev/null; }
meson_ok() { command -v meson >/dev/null && meson --version | awk -F. '{exit !($1 >= 1)}'; }

missing=()
command -v ninja >/dev/null || missing+=(ninja-build)
command -v pkg-config >/dev/null || missing+=(pkg-config)
command -v g++ >/dev/null || missing+=(g++)
command -v cc >/dev/null || missing+=(gcc)
command -v python3 >/dev/null || missing+=(python3)
meson_ok || missing+=(meson)
if $for_tests; then
  command -v nm >/dev/null && command -v readelf >/dev/null || missing+=(binutils)
  have_catch2 || missing+=(catch2)
  # the small file system of the disk-full test (in /sbin, which a user's PATH may lack)
  command -v mkfs.ext4 >/dev/null || [ -x /sbin/mkfs.ext4 ] || [ -x /usr/sbin/mkfs.ext4 ] || missing+=(e2fsprogs)
fi

# apt-get as root, else through sudo; a user without sudo is told what to ask for.
as_root() {
  if [ "$(id -u)" -eq 0 ]; then "$@"
  elif command -v sudo >/dev/null; then sudo "$@"
  else
    echo "uvm: $* needs root, and sudo is not installed: ask an administrator for: ${missing[*]:-python3-venv}" >&2
    exit 1
  fi
}
if [ ${#missing[@]} -gt 0 ]; then
  echo "uvm: installing ${missing[*]}"
  as_root apt-get update -qq
  as_root env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "${missing[@]}" >/dev/null
fi
# The Python tests run in a virtualenv of uvm's own with exactly tests/python/requirements.txt in
# it, so that nothing installed on the machine by hand can make them pass or fail. UVM_PYTHON names
# another interpreter instead (the GPU machine's python3, which has torch and no network).
if $for_tests && [ -z "${UVM_PYTHON:-}" ]; then
  venv=${UVM_VENV:-$PWD/.venv}
  if [ ! -x "$venv/bin/python" ] && ! python3 -m venv "$venv" >/dev/null 2>&1; then
    rm -rf "$venv"
    echo "uvm: installing python3-venv"
    as_root apt-get update -qq
    as_root env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq python3-venv >/dev/null
    python3 -m venv "$venv"
  fi
  if ! cmp -s tests/python/requirements.txt "$venv/uvm-requirements.txt"; then
    echo "uvm: installing the test requirements into $venv"
    "$venv/bin/python" -m pip install -q --disable-pip-version-check -r tests/python/requirements.txt
    cp tests/python/requirements.txt "$venv/uvm-requirements.txt"
  fi
  export UVM_PYTHON=$venv/bin/python
fi
if ! meson_ok; then  # a distribution whose meson is older than 1.0
  echo "uvm: the system meson is older than 1.0; installing meson from PyPI"
  python3 -m pip install -q --user 'meson>=1.0'
  export PATH="$HOME/.local/bin:$PATH"
fi
# CUDA 12 runtime headers for the cuda-12.x-headers tests (they skip, saying why, without them).
if $for_tests; then
  bash scripts/fetch_cuda12.sh || echo "uvm: no CUDA 12 headers fetched; the cuda-12.x-headers tests will skip"
fi
