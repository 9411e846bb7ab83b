#!/usr/bin/env bash
# The peers, unmodified, moved onto uvm by the installed wheel's switch (UVM_SWITCH), with the real
# packages installed beside it in the same environment, in one call:
#   1. SGLang's torch_memory_saver adapter (sgl-project/sglang 1373e4f547, .deps/sglang) driven as
#      SGLang's engine drives it (tests/peers/sglang_adapter.py): without a saver, then with
#      UVM_SWITCH=torch_memory_saver in hook modes preload and torch, then with the switch off, where
#      `import torch_memory_saver` is the real 0.0.10 again (its preload mode: the only one in which it
#      pauses CUDA graphs). Tokens must match the run
#      without a saver in every cycle, each tag must be freed while paused, and each run must name
#      the module that answered.
#   2. Megatron-LM's own suspend/resume tests (NVIDIA/Megatron-LM f8837c04ef, .deps/megatron-lm) with
#      megatron-core 0.19.2 installed and UVM_SWITCH=1: Megatron's unified_memory and its
#      torch_memory_saver are uvm's (tests/peers/megatron_tests.py prints which answered).
# No alias folder and nothing of this tree is on the path: uvm is the wheel installed for $1.
#   run_switched.sh PYTHON      (a python with the uvm-cuda wheel and torch: scripts/device_wheel.sh's)
# Needs a GPU; results under $OUT. Ends with "N passed, M failed, K blocked".
set -uo pipefail
cd "$(dirname "$0")/../.."
python=${1:?a python with the uvm-cuda wheel installed}
out=${OUT:-$(mktemp -d)}
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
passed=0 failed=0 blocked=0
tms_wheel=$(ls .deps/wheels/torch_memory_saver-*.whl 2>/dev/null | head -n 1)
mcore_wheel=$(ls .deps/wheels/megatron_core-*.whl 2>/dev/null | head -n 1)
[ -n "$tms_wheel" ] && "$python" -m pip install -q --no-deps --target "$work/real" "$tms_wheel" $(ls .whl/einops-*.whl 2>/dev/null)
[ -n "$mcore_wheel" ] && "$python" -m pip install -q --no-deps --target "$work/real" "$mcore_wheel"
export PYTHONPATH=$work/real UVM_PEERS_VIA=switch PYTHONUNBUFFERED=1
echo "uvm: $("$python" -c 'import uvm; print(uvm.__version__, uvm.__file__)'); beside: $(ls "$work/real" | grep -E 'dist-info$' | tr '\n' ' ')"

echo "== SGLang's adapter through the switch"
if [ ! -f .deps/sglang/torch_memory_saver_adapter.py ] || [ -z "$tms_wheel" ]; then
  echo "BLOCKED: SGLang's adapter (.deps/sglang) or torch_memory_saver's wheel (.deps/wheels) is not here (scripts/fetch_peers.sh)"
  blocked=$((blocked + 1))
else
  # The original pauses CUDA graphs in its preload mode only, so its run is a preload one.
  for run in off:0 preload:torch_memory_saver torch:torch_memory_saver original:0; do
    mode=${run%%:*} switch=${run#*:}
    [ "$mode" = original ] && mode_arg=preload || mode_arg=$mode
    UVM_SWITCH=$switch "$python" tests/peers/sglang_adapter.py "$mode_arg" "$out/switched_sglang_$mode.json" \
      >"$out/switched_sglang_$mode.log" 2>&1
    echo "  $mode (UVM_SWITCH=$switch): exit $? $(tail -n 1 "$out/switched_sglang_$mode.log" | cut -c1-150)"
  done
  if "$python" - "$out" <<'PY'
import json, sys
out = sys.argv[1]
runs = {}
for mode in ("off", "preload", "torch", "original"):
    try:
        runs[mode] = json.load(open(f"{out}/switched_sglang_{mode}.json"))
    except (OSError, ValueError) as error:
        runs[mode] = {"error": str(error)}
reference = runs["off"]
failed = 0
expected = {"preload": "uvm.memory_saver", "torch": "uvm.memory_saver", "original": "torch_memory_saver"}
for mode, module in expected.items():
    run, problems = runs[mode], []
    if "error" in run or "error" in reference:
        problems.append((run.get("error") or reference.get("error"))[-300:])
    else:
        if not run["saver"].startswith(module):
            problems.append(f"import torch_memory_saver gave {run['saver']}, not {module}")
        for index, (mine, theirs) in enumerate(zip(run["cycles"], reference["cycles"])):
            if mine["tokens_before_release"] != theirs["tokens_before_release"]:
                problems.append(f"cycle {index}: tokens differ from the run without a saver")
            for tag, freed in mine["freed"].items():
                if freed < run["sizes"][tag] * 0.9:
                    problems.append(f"cycle {index}: {tag} freed {freed} of {run['sizes'][tag]} bytes")
        if run["tokens_after_last_resume"] != reference["tokens_after_last_resume"]:
            problems.append("tokens after the last resume differ")
    failed += bool(problems)
    print(f"  {'FAIL' if problems else 'PASS'} {mode}: {run.get('saver', '?')}; " + ("; ".join(problems) or
          f"{len(run['cycles'])} cycles, tokens identical to SGLang without a saver, every tag freed while paused"))
sys.exit(failed)
PY
  then passed=$((passed + 3)); else failed=$((failed + 1)); fi
fi

echo "== Megatron-LM's own suspend/resume tests through the switch ($(cat .deps/megatron-lm/COMMIT 2>/dev/null || echo 'not fetched'))"
if [ ! -f .deps/megatron-lm/tests/unit_tests/inference/engines/test_dynamic_engine.py ] || [ -z "$mcore_wheel" ]; then
  echo "BLOCKED: Megatron-LM's tests (.deps/megatron-lm) or megatron-core's wheel (.deps/wheels) is not here"
  blocked=$((blocked + 1))
else
  UVM_SWITCH=1 WORLD_SIZE=1 LOCAL_RANK=0 MASTER_PORT=29660 "$python" tests/peers/megatron_tests.py .deps/megatron-lm \
    -k "test_suspend_resume_cycle or test_speculative_decoding_suspend_resume" >"$out/switched_megatron_lm.log" 2>&1
  grep -E "^megatron.core.inference.unified_memory is" "$out/switched_megatron_lm.log"
  line=$(grep -E '^=* ?[0-9]+ (passed|failed)' "$out/switched_megatron_lm.log" | tail -n 1)
  echo "  $line"
  grep -E "^(on uvm|passed without|FAIL)" "$out/switched_megatron_lm.log"
  # Only the tests that paused and resumed memory through uvm count (megatron_tests.py's last line).
  count=$(sed -nE 's/^on uvm: ([0-9]+) of [0-9]+ passed tests.*/\1/p' "$out/switched_megatron_lm.log" | tail -n 1)
  count=${count:-0}
  if grep -q "unified_memory is uvm " "$out/switched_megatron_lm.log" &&
     grep -q "is a uvm.memory_saver object" "$out/switched_megatron_lm.log" &&
     [ "$count" -gt 0 ] && ! [[ "$line" =~ failed|error ]]; then
    passed=$((passed + count))
  else
    failed=$((failed + 1)); tail -n 30 "$out/switched_megatron_lm.log"
  fi
fi
echo "$passed passed, $failed failed, $blocked blocked"
[ "$failed" = 0 ]
