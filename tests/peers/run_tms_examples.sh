#!/usr/bin/env bash
# Runs torch_memory_saver's own example programs against uvm.memory_saver, each with only its
# `from torch_memory_saver import …` line swapped for `from uvm.memory_saver import …` (their
# test helpers, torch_memory_saver.testing_utils, still come from the original's wheel). The
# examples are not ours and are not in the repository: put them in .deps/tms_examples (see its
# README) and the wheel in .deps/wheels. Needs a GPU; ends with "N passed, M failed".
set -uo pipefail
cd "$(dirname "$0")/../.."
examples=${TMS_EXAMPLES:-.deps/tms_examples}
wheel=$(ls .deps/wheels/torch_memory_saver-*.whl 2>/dev/null | head -n 1)
python=${UVM_PYTHON:-python3}
if [ ! -d "$examples" ] || [ -z "$wheel" ]; then
  echo "SKIP: torch_memory_saver's examples ($examples) or wheel (.deps/wheels) are not here"
  exit 77
fi
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
"$python" -m pip install -q --no-deps --target "$work/site" "$wheel" || exit 1
passed=0
failed=0
# The examples in hook mode "torch" only; run_tms_tests.sh runs the original's whole test file, which
# runs each in both modes (nested_region, training_engine and cuda_vmm_granularity in preload mode).
for name in simple cpu_backup cuda_graph rl_example disk_backup multi_device_torch_mode; do
  sed -E 's/^from torch_memory_saver import (torch_memory_saver|TorchMemorySaver)$/from uvm.memory_saver import \1/' \
    "$examples/$name.py" >"$work/$name.py"
  changed=$(diff "$examples/$name.py" "$work/$name.py" | grep -c '^>')
  if [ "$changed" != 1 ]; then
    echo "FAIL $name: expected exactly one import line swapped, changed $changed"
    failed=$((failed + 1))
    continue
  fi
  start=$(date +%s%N)
  if PYTHONPATH="$PWD/python_shim:$work/site" "$python" "$work/$name.py" torch >"$work/$name.log" 2>&1; then
    echo "PASS $name ($(( ($(date +%s%N) - start) / 1000000 )) ms)"
    passed=$((passed + 1))
  else
    echo "FAIL $name:"
    tail -n 25 "$work/$name.log" | sed 's/^/    /'
    failed=$((failed + 1))
  fi
  [ -n "${OUT:-}" ] && cp "$work/$name.log" "$OUT/tms_example_$name.log"
done
echo "$passed passed, $failed failed"
[ "$failed" = 0 ]
