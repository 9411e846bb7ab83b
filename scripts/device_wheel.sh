#!/usr/bin/env bash
# The wheel on a GPU machine as a user has it (docs/design.md, "The wheel"): the wheel CI builds
# (carried in .deps/dist: this machine has no network) installed into a fresh virtualenv that sees
# the machine's torch and nothing of this tree, then every path run with PATH holding only the
# virtualenv's bin, no compiler (UVM_CXX names none), no CUDA_HOME or CUDA_PATH, and an empty cache:
# the doctor, the wheel's own GPU tests (hook, runtime, CUDA 12 and 13 builds, no-hook fallback) and
# the GPU suites of managed and releasable pools, memory_saver in both hook modes, uvm.stream and
# block lifetimes, against the installed package; with SWITCHED=1 the peers through the switch too
# (tests/peers/run_switched.sh); with SLIME=1 the train actors of slime, AReaL and NeMo-RL started as each
# starts them (tests/peers/run_train_actors.sh). WHEEL_PYTEST names other test files, or none. Logs under $1 (default $OUT).
set -uo pipefail
cd "$(dirname "$0")/.."
out=${1:-${OUT:-device-out}}
mkdir -p "$out"
wheel=$(ls .deps/dist/uvm_cuda-*.whl 2>/dev/null | head -n 1)
[ -n "$wheel" ] || { echo "SKIP: no wheel in .deps/dist (copy the one scripts/test_wheel.sh built)"; exit 77; }
torch_site=$(python3 -c 'import os, torch; print(os.path.dirname(os.path.dirname(torch.__file__)))')
echo "wheel: $wheel; torch's site: $torch_site"
echo "CUDA runtimes NVIDIA's wheels put there: $(find "$torch_site/nvidia" -name 'libcudart.so*' 2>/dev/null | tr '\n' ' ')"
built=$(UVM_TEST_WHEEL=$wheel UVM_WHEEL_VENV=/tmp/uvm-wheel-venv UVM_WHEEL_SITE=$torch_site UVM_PYTHON=python3 \
        bash scripts/test_wheel.sh | tail -n 1) || { echo "FAIL: installing the wheel"; exit 1; }
read -r wheel python <<<"$built"
cache=$(mktemp -d)
# The shell tools the peers' scripts use, and nothing else: no compiler can be found through PATH.
tools=$cache/tools
mkdir -p "$tools"
for tool in bash sh env mktemp rm ls cat grep tail head cut tee sed awk tr sort uniq wc dirname basename cp mkdir date; do
  ln -sf "$(command -v "$tool")" "$tools/$tool"
done
bare=(env -i "HOME=$HOME" "PATH=$(dirname "$python"):$tools" LANG=C.UTF-8 "UVM_CXX=/nonexistent/c++" "UVM_CACHE_DIR=$cache/uvm"
      UVM_TEST_INSTALLED=1 "UVM_TEST_WHEEL=$wheel" PYTHONUNBUFFERED=1 "OUT=$out")
echo "== compilers on PATH: $("${bare[@]}" "$python" -c "import shutil; print([shutil.which(c) for c in ('c++', 'g++', 'gcc', 'cc', 'clang', 'nvcc')])")"
echo "== uvm doctor (the installed command)"
"${bare[@]}" "$(dirname "$python")/uvm" doctor 2>&1 | grep -v '^  UVM_' | tee "$out/wheel_doctor.txt"
tests=${WHEEL_PYTEST:-tests/python/test_wheel_gpu.py tests/python/test_pools_gpu.py tests/python/test_lifetime_gpu.py
  tests/python/test_memory_saver_gpu.py tests/python/test_preload_gpu.py tests/python/test_stream_gpu.py
  tests/python/test_torch_gpu.py}
status=0
if [ "$tests" != none ]; then
  echo "== the GPU tests against the installed wheel"
  "${bare[@]}" "$python" -m pytest $tests -q -rs -p no:cacheprovider --junitxml "$out/wheel_pytest.xml" 2>&1 |
    tee "$out/wheel_pytest.log" |
    grep -E "^(FAILED|ERROR|SKIPPED)|passed|failed"
  status=${PIPESTATUS[0]}
fi
if [ "${SWITCHED:-0}" = 1 ]; then
  echo "== the peers through the switch (tests/peers/run_switched.sh)"
  # The peers run in the machine's own environment: Triton (Megatron's speculative decoding kernels)
  # compiles its launchers with the system's C toolchain. uvm is still kept from any compiler
  # (UVM_CXX), and the empty cache below shows it built nothing.
  env -u CUDA_HOME -u CUDA_PATH "UVM_CXX=/nonexistent/c++" "UVM_CACHE_DIR=$cache/uvm" "OUT=$out" \
    bash tests/peers/run_switched.sh "$python" 2>&1 | tee "$out/switched_peers.txt"
  [ "${PIPESTATUS[0]}" -eq 0 ] || status=1
fi
if [ "${SLIME:-0}" = 1 ]; then
  echo "== the RL stacks' train actors (slime, AReaL, NeMo-RL), started as each starts them (tests/peers/run_train_actors.sh)"
  env -u CUDA_HOME -u CUDA_PATH "UVM_CXX=/nonexistent/c++" "UVM_CACHE_DIR=$cache/uvm" "OUT=$out" \
    bash tests/peers/run_train_actors.sh "$python" 2>&1 | tee "$out/train_actors.txt"
  [ "${PIPESTATUS[0]}" -eq 0 ] || status=1
fi
if [ -f "$cache/uvm/builds.log" ]; then
  echo "FAIL: something was compiled: $(cat "$cache/uvm/builds.log")"
  status=1
else
  echo "nothing was compiled (no builds.log in the empty cache)"
fi
exit "$status"
