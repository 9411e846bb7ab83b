#!/usr/bin/env bash
# Puts what tests/peers/run_vllm_tests.sh and `uvm bench vllm` need of vLLM into .deps/vllm/ (ignored
# by git; it travels to the GPU machine, which has no network): never into the repository. vLLM 0.33.0
# needs torch 2.14 to install, and its wheel is 336 MB; the GPU machine has torch 2.11 and a carry of
# 64 MiB. What its sleep-mode allocator and its allocator tests need runs on torch 2.11 (GPU.md, "vLLM on
# the GPU machine"), so this carries that and nothing else, all from PyPI, pinned:
#   vllm-site.tar.xz  the 0.33.0 wheel's Python files, vllm/cumem_allocator.abi3.so (the allocator's C
#                     extension: the CUDA driver and CPython only) and its dist-info (vLLM's platform
#                     detection reads the installed version); two compiled extensions built for torch
#                     2.14 are stand-ins here, for imports only (the allocator uses none of their ops):
#                     vllm/_C_stable_libtorch answers the two capability queries vLLM's quantization
#                     modules ask at import time ("not supported"), and vllm/vllm_flash_attn/_vllm_fa2_C
#                     is empty (vllm_flash_attn refuses to import without one)
#   tests/            from the 0.33.0 sdist (the tests are not in the wheel): test_cumem.py,
#                     test_sleep_mode_backend.py, tests/utils.py and the __init__.py files on the way,
#                     unmodified; not tests/conftest.py (it imports the engine and its model fixtures,
#                     which the model-free tests do not use)
#   wheels/           cp312 wheels of what those imports need beyond the GPU machine's Python (its
#                     transformers, numpy, pillow, psutil stay its own); openai < 3 and anthropic < 1
#                     (their newer releases need httpx2, which vLLM 0.33.0's tests predate)
# SHA256SUMS lists every file. Safe to run again; VLLM_DOWNLOADS keeps the 336 MB wheel and the sdist
# between runs (default .deps/vllm-downloads).
set -euo pipefail
cd "$(dirname "$0")/.."
version=0.33.0
out=.deps/vllm
downloads=${VLLM_DOWNLOADS:-$PWD/.deps/vllm-downloads}
mkdir -p "$downloads" && rm -rf "$out" && mkdir -p "$out/wheels" "$out/tests"

wheel=$downloads/vllm-$version-cp38-abi3-manylinux_2_28_x86_64.whl
[ -f "$wheel" ] || python3 -m pip download -q --no-deps --only-binary :all: -d "$downloads" "vllm==$version"
site=$(mktemp -d)
trap 'rm -rf "$site"' EXIT
python3 - "$wheel" "$site" "$version" <<'EOF'
import sys, zipfile
wheel, site, version = sys.argv[1:]
with zipfile.ZipFile(wheel) as archive:
    for entry in archive.infolist():
        name = entry.filename
        if name.endswith(".py") or name == "vllm/cumem_allocator.abi3.so" or name.startswith(f"vllm-{version}.dist-info/"):
            archive.extract(entry, site)
EOF
: >"$site/vllm/vllm_flash_attn/_vllm_fa2_C.py"
cat >"$site/vllm/_C_stable_libtorch.py" <<'STANDIN'
# uvm's stand-in for vLLM's compiled ops (built for torch 2.14; scripts/fetch_vllm.sh): only the
# capability queries vLLM's modules ask when they are imported, answered "not supported".
import torch
_library = torch.library.Library("_C", "DEF")
for _name in ("cutlass_scaled_mm_supports_block_fp8", "cutlass_group_gemm_supported"):
    _library.define(f"{_name}(int cuda_device_capability) -> bool")
    _library.impl(_name, lambda capability: False, "CompositeExplicitAutograd")
STANDIN
tar -cJf "$out/vllm-site.tar.xz" -C "$site" .

# The sdist's setup.py imports torch, so pip stops at its metadata; --no-clean keeps what it unpacked.
sdist_dir=$(ls -d "$downloads"/sdist/pip-download-*/vllm_* 2>/dev/null | head -n 1 || true)
if [ -z "$sdist_dir" ]; then
  mkdir -p "$downloads/sdist"
  (cd "$downloads/sdist" && TMPDIR=$PWD python3 -m pip download -q --no-deps --no-binary :all: --no-build-isolation \
    --no-clean -d . "vllm==$version" >/dev/null 2>&1 || true)
  sdist_dir=$(ls -d "$downloads"/sdist/pip-download-*/vllm_* | head -n 1)
fi
grep -q "^Version: $version$" "$sdist_dir/PKG-INFO"
for file in tests/__init__.py tests/utils.py tests/basic_correctness/__init__.py tests/basic_correctness/memory/__init__.py \
    tests/basic_correctness/memory/cumem/__init__.py tests/basic_correctness/memory/cumem/test_cumem.py \
    tests/v1/__init__.py tests/v1/worker/__init__.py tests/v1/worker/test_sleep_mode_backend.py; do
  mkdir -p "$out/$(dirname "$file")" && cp "$sdist_dir/$file" "$out/$file"
done

platforms="--platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 --platform manylinux_2_28_x86_64 --platform manylinux_2_34_x86_64"
for package in regex "anthropic<1" pydantic pydantic-core typing-inspection annotated-types httpx httpcore h11 idna anyio \
    sniffio docstring-parser jiter "openai<3" distro requests urllib3 certifi charset-normalizer pyzmq cbor2 aiohttp \
    multidict attrs yarl propcache aiohappyeyeballs aiosignal frozenlist openai-harmony msgspec pybase64 cachetools \
    uvloop py-cpuinfo fastapi starlette annotated-doc opentelemetry-api importlib-metadata zipp prometheus-client \
    partial-json-parser xgrammar apache-tvm-ffi llguidance uvicorn click watchfiles orjson typing-extensions blake3 \
    packaging; do
  # shellcheck disable=SC2086
  python3 -m pip download -q --no-deps --only-binary :all: --python-version 3.12 --implementation cp $platforms \
    -d "$out/wheels" "$package"
done
echo "vllm $version" >"$out/VERSION"
(cd "$out" && find . -type f ! -name SHA256SUMS | sort | xargs sha256sum >SHA256SUMS)
echo "vLLM $version for the GPU machine: $(du -sh "$out" | cut -f1) in $out ($(ls "$out/wheels" | wc -l) wheels)"
