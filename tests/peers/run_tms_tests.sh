#!/usr/bin/env bash
# Runs torch_memory_saver's own test files (github.com/fzyzcjy/torch_memory_saver at 4a43c97, put in
# .deps/tms_test by scripts/fetch_peers.sh; never in the repository), unmodified, twice in one call:
# on uvm, where `import torch_memory_saver` and every submodule of it is uvm's (tests/peers/tms_alias:
# nothing of the original is importable in that run), and on the original (its 0.0.10 wheel from
# .deps/wheels). Then tests/peers/compare_runs.py compares the two runs test by test and fails on any
# test that passed on the original but not on uvm. Every test_examples.py test runs in both hook modes
# ("preload": LD_PRELOAD of each library's interposer through its configure_subprocess; "torch");
# XPU-only ones skip, and the 2-GPU ones skip on one GPU. Left out, for both runs alike:
#   test_merge_cuda_wheels.py  tests the original's wheel-merging build script (scripts/, not in its
#                              package): nothing a user of either library calls
#   test_utils.py::test_get_binary_path_from_package_*  the original's lookup of its own binaries by
#                              ROCm/CUDA file-name suffix in its package folder (uvm finds its interposer itself)
#   test_utils.py::test_cpu_backup_backend_rejected_on_xpu, ..._rejects_mmap_on_rocm  XPU and ROCm
#                              behaviour, reached by patching the original's module internals; uvm runs on CUDA only
# Needs a GPU. TMS_TESTS_K="expr" runs only the tests pytest's -k selects (e.g. multi_device on a
# 2-GPU machine); uvm runs first, so that a run cut short by its time limit still has uvm's results.
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
left_out=(--deselect test_utils.py::test_get_binary_path_from_package_uses_unsuffixed_rocm_binary
          --deselect test_utils.py::test_get_binary_path_from_package_keeps_cuda_suffix_selection
          --deselect test_utils.py::test_cpu_backup_backend_rejected_on_xpu
          --deselect test_utils.py::test_cpu_backup_backend_rejects_mmap_on_rocm)
run() {  # name, PYTHONPATH
  echo "== $1"
  (cd "$work/tests" && PYTHONPATH="$2" timeout 900 "$python" -m pytest test_examples.py test_configure_subprocess.py \
    test_utils.py "${left_out[@]}" -v -rs -p no:cacheprovider --junitxml="$log/tms_tests_$1.xml" \
    ${TMS_TESTS_K:+-k "$TMS_TESTS_K"} >"$log/tms_tests_$1.log" 2>&1)
  local status=$?
  echo "$1: $(tail -n 1 "$log/tms_tests_$1.log")"
  return $status
}
run uvm "$PWD/tests/peers/tms_alias:$PWD/python_shim"
uvm_status=$?
run real "$work/real"
real_status=$?
echo "exit status: original $real_status, uvm $uvm_status"
echo "== test by test (tests/peers/compare_runs.py)"
python3 tests/peers/compare_runs.py "$log/tms_tests_real.xml" "$log/tms_tests_uvm.xml"
