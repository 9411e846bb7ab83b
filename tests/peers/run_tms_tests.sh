#!/usr/bin/env bash
# Runs torch_memory_saver's own test file, test/test_examples.py (github.com/fzyzcjy/torch_memory_saver
# at 4a43c97, put in .deps/tms_test by scripts/fetch_peers.sh; never in the repository), unmodified,
# twice in one call: on the original (its 0.0.10 wheel from .deps/wheels) and on uvm, where
# `import torch_memory_saver` is uvm.memory_saver (tests/peers/tms_alias) and the original's test
# helpers still come from its wheel. Every test runs in both hook modes ("preload": LD_PRELOAD of
# each library's interposer through its configure_subprocess; "torch"); XPU-only ones skip, and
# the 2-GPU ones skip on one GPU. Prints both pytest summary lines; exits non-zero if uvm's run
# failed. Needs a GPU. TMS_TESTS_K="expr" runs only the tests pytest's -k selects (e.g. multi_device
# on a 2-GPU machine); uvm runs first, so that a run cut short by its time limit still has uvm's line.
set -uo pipefail
cd "$(dirname "$0")/../.."
tests=.deps/tms_test
wheel=$(ls .deps/wheels/torch_memory_saver-*.whl 2>/dev/null | head -n 1)
python=${UVM_PYTHON:-python3}
if [ ! -f "$tests/test_examples.py" ] || [ -z "$wheel" ]; then
  echo "SKIP: torch_memory_saver's tests ($tests, scripts/fetch_peers.sh) or wheel (.deps/wheels) are not here"
  exit 77
fi
echo "torch_memory_saver tests at $(cat "$tests/COMMIT" 2>/dev/null || echo '?'), wheel $(basename "$wheel")"
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
"$python" -m pip install -q --no-deps --target "$work/real" "$wheel" || exit 1
cp -r "$tests" "$work/tests"  # pytest writes __pycache__ there; the fetched copy stays as fetched
log=${OUT:-$work}
run() {  # name, PYTHONPATH
  echo "== $1"
  (cd "$work/tests" && PYTHONPATH="$2" timeout 900 "$python" -m pytest test_examples.py -v -rs -p no:cacheprovider \
    ${TMS_TESTS_K:+-k "$TMS_TESTS_K"} >"$log/tms_tests_$1.log" 2>&1)
  local status=$?
  grep -E "(PASSED|FAILED|SKIPPED|ERROR)" "$log/tms_tests_$1.log" | sed -E 's/^/  /' | grep -E "::" | cut -c1-160
  echo "$1: $(tail -n 1 "$log/tms_tests_$1.log")"
  return $status
}
run uvm "$PWD/tests/peers/tms_alias:$PWD/python_shim:$work/real"
uvm_status=$?
run real "$work/real"
real_status=$?
echo "summary: real exit $real_status, uvm exit $uvm_status"
[ "$uvm_status" = 0 ]
