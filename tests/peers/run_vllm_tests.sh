#!/usr/bin/env bash
# Runs vLLM's own sleep-mode allocator tests (vLLM 0.33.0's sdist, put in .deps/vllm/tests by
# scripts/fetch_vllm.sh; never in the repository), unmodified, twice in one call, in one virtualenv:
# on vLLM's own CuMemAllocator (UVM_SWITCH unset), and on uvm's (UVM_SWITCH=vllm: the installed
# wheel's switch puts uvm.vllm.CuMemAllocator in vLLM's cumem module). Then tests/peers/compare_runs.py
# compares the two test by test and fails on any test that passed on vLLM's allocator but not on uvm's,
# except those excused below, each with why:
#   test_cumem.py::test_level2_discards_ordinary_tensor_with_weights_tag  wakes through
#       _wake_up_with_poisoned_mappings, which replaces vLLM's cumem.create_and_map to write 0xA5 into
#       memory as it is mapped; uvm maps memory in C (uvm_resume), where no Python function of vLLM's
#       is called, so the poison is never written and the test's 0xA5 check cannot hold
# The virtualenv: the GPU machine's Python and torch (through a .pth, GPU.md), the uvm wheel from
# .deps/dist (what a user installs), vLLM's Python files and cumem extension from .deps/vllm, and the
# wheels of what their imports need. The tests that build an LLM (a model and vLLM's engine) skip on
# both sides, and the worker's communicator test fails on both (importing vLLM's worker needs its
# whole engine stack, whose compiled ops need torch 2.14). Needs a GPU. Logs and reports in $OUT/vllm.
# VLLM_TESTS=0 leaves the tests out; VLLM_TESTS=uvm runs uvm's side alone; VLLM_TESTS_K="expr" runs
# the tests pytest's -k selects. VLLM_BENCH=1 then runs `uvm bench vllm` (bench/vllm_bench.py) in the same virtualenv, with
# VLLM_BENCH_ARGS; its results go to $OUT/vllm/bench. VLLM_BENCH_BEFORE=DIR (a folder with an older
# uvm wheel) then runs VLLM_AB_ROWS on it and on this one, alternating (results in $OUT/vllm/ab).
set -uo pipefail
cd "$(dirname "$0")/../.."
deps=.deps/vllm
wheel=$(ls .deps/dist/uvm_cuda-*.whl 2>/dev/null | head -n 1)
if [ ! -f "$deps/vllm-site.tar.xz" ] || [ ! -f "$deps/tests/basic_correctness/memory/cumem/test_cumem.py" ] || [ -z "$wheel" ]; then
  echo "SKIP: vLLM's files ($deps, scripts/fetch_vllm.sh) or uvm's wheel (.deps/dist, scripts/test_wheel.sh) are not here"
  exit 77
fi
out=${OUT:-device-out}/vllm
mkdir -p "$out"
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
echo "$(cat "$deps/VERSION"), its allocator tests; uvm wheel $(basename "$wheel")"
(cd "$deps" && sha256sum --quiet -c SHA256SUMS) || { echo "FAIL: .deps/vllm does not match its SHA256SUMS"; exit 1; }

venv=$work/venv
python3 -m venv "$venv"
site=$("$venv/bin/python" -c 'import site; print(site.getsitepackages()[0])')
python3 -c 'import os, torch; print(os.path.dirname(os.path.dirname(torch.__file__)))' >"$site/machine-site.pth"
mkdir -p "$work/vllm-site" && tar -xJf "$deps/vllm-site.tar.xz" -C "$work/vllm-site"
echo "$work/vllm-site" >"$site/vllm-site.pth"
"$venv/bin/python" -m pip install -q --no-index --no-deps --disable-pip-version-check "$deps"/wheels/*.whl "$wheel" ||
  { echo "FAIL: installing the wheels"; exit 1; }
"$venv/bin/python" -c "import importlib.metadata as m, torch, vllm.device_allocator.cumem as c; print('vllm', m.version('vllm'), 'uvm-cuda', m.version('uvm-cuda'), 'torch', torch.__version__, 'cumem', c.cumem_available)"
cp -r "$deps/tests" "$work/tests"  # pytest writes __pycache__ there; the fetched copy stays as fetched

run() {  # name, UVM_SWITCH
  echo "== $1"
  (cd "$work" && UVM_SWITCH=$2 PYTHONUNBUFFERED=1 timeout "${VLLM_TEST_TIMEOUT:-1200}" "$venv/bin/python" -m pytest -v -rs -p no:cacheprovider \
    tests/basic_correctness/memory/cumem/test_cumem.py tests/v1/worker/test_sleep_mode_backend.py \
    ${VLLM_TESTS_K:+-k "$VLLM_TESTS_K"} --junitxml="$out/$1.xml" >"$out/$1.log" 2>&1)
  local status=$?
  echo "$1: $(tail -n 1 "$out/$1.log")"
  return $status
}
# Which allocator each run got, asked the way vLLM's worker asks.
for switch in "" vllm; do
  UVM_SWITCH=$switch "$venv/bin/python" -c "from vllm.device_allocator import get_mem_allocator_instance as g; print('UVM_SWITCH=$switch:', type(g()).__module__)"
done
status=0
if [ "${VLLM_TESTS:-1}" = uvm ]; then  # uvm's side alone (a check of uvm's allocator, not a comparison)
  run uvm vllm
  status=$?
elif [ "${VLLM_TESTS:-1}" != 0 ]; then
  run uvm vllm
  run vllm ""
  echo "== test by test (tests/peers/compare_runs.py)"
  python3 tests/peers/compare_runs.py "$out/vllm.xml" "$out/uvm.xml" \
    --excused "test_cumem.py::test_level2_discards_ordinary_tensor_with_weights_tag=patches cumem.create_and_map, which uvm never calls"
  status=$?
fi
if [ "${VLLM_BENCH:-0}" = 1 ]; then
  echo "== uvm bench vllm ${VLLM_BENCH_ARGS:-}"
  # shellcheck disable=SC2086
  (cd "$work" && "$venv/bin/python" -m uvm bench vllm ${VLLM_BENCH_ARGS:-} --out "$out/bench") || status=1
fi
if [ -n "${VLLM_BENCH_BEFORE:-}" ]; then
  # An older wheel (a folder holding it) beside this one: VLLM_AB_ROWS (default: backups given back, and
  # given back with no pin ahead) in each, alternating, VLLM_AB_ROUNDS rounds (default 2).
  before_wheel=$(ls "$VLLM_BENCH_BEFORE"/uvm_cuda-*.whl | head -n 1)
  echo "== uvm bench vllm, before ($before_wheel) and after ($wheel), alternating"
  before=$work/venv-before
  python3 -m venv "$before"
  before_site=$("$before/bin/python" -c 'import site; print(site.getsitepackages()[0])')
  cp "$site/machine-site.pth" "$site/vllm-site.pth" "$before_site/"
  "$before/bin/python" -m pip install -q --no-index --no-deps --disable-pip-version-check "$deps"/wheels/*.whl "$before_wheel" ||
    { echo "FAIL: installing the older wheel"; exit 1; }
  for round in $(seq 1 "${VLLM_AB_ROUNDS:-2}"); do
    for side in before after; do
      python=$venv/bin/python
      [ "$side" = before ] && python=$before/bin/python
      (cd "$work" && "$python" -m uvm bench vllm --rows "${VLLM_AB_ROWS:-uvm-given-back-1,uvm-no-pin-ahead-1}" \
        ${VLLM_AB_ARGS:-} --out "$out/ab/$side-$round" >"$out/ab-$side-$round.log" 2>&1) || status=1
      grep -E "^\| uvm" "$out/ab/$side-$round/results.md" | sed "s/^/$side, round $round: /"
    done
  done
fi
exit $status
