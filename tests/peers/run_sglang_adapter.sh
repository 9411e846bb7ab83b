#!/usr/bin/env bash
# SGLang's adapter on uvm (tests/peers/sglang_adapter.py says what it drives) in both hook modes,
# beside SGLang without the memory saver, in one call: greedy tokens identical to the run without
# it in every cycle, and each tag's memory freed while paused. Needs a GPU; results under $OUT.
set -uo pipefail
cd "$(dirname "$0")/../.."
python=${UVM_PYTHON:-python3}
out=${OUT:-$(mktemp -d)}
for mode in off preload torch; do
  "$python" tests/peers/sglang_adapter.py "$mode" "$out/sglang_$mode.json" >"$out/sglang_$mode.log" 2>&1
  status=$?
  [ "$status" = 77 ] && { cat "$out/sglang_$mode.log"; exit 77; }
  tail -n 3 "$out/sglang_$mode.log"
done
"$python" - "$out" <<'PY'
import json, sys
out = sys.argv[1]
runs = {}
for mode in ("off", "preload", "torch"):
    try:
        runs[mode] = json.load(open(f"{out}/sglang_{mode}.json"))
    except (OSError, ValueError) as error:
        runs[mode] = {"error": str(error)}
reference = runs["off"]
failed = 0
for mode in ("preload", "torch"):
    run, problems = runs[mode], []
    if "error" in run or "error" in reference:
        problems.append((run.get("error") or reference.get("error"))[-300:])
    else:
        wanted = [c["tokens_before_release"] for c in reference["cycles"]] + [reference["tokens_after_last_resume"]]
        got = [c["tokens_before_release"] for c in run["cycles"]] + [run["tokens_after_last_resume"]]
        if got != wanted:
            problems.append(f"tokens differ from the run without the saver in decodes {[i for i, (a, b) in enumerate(zip(got, wanted)) if a != b]}")
        for number, cycle in enumerate(run["cycles"]):
            for tag in ("weights", "kv_cache"):
                if cycle["freed"][tag] < 0.9 * run["sizes"][tag]:
                    problems.append(f"cycle {number}: pause({tag}) freed {cycle['freed'][tag]} of {run['sizes'][tag]} bytes")
            if run["sizes"]["cuda_graph"] >= 2 << 20 and cycle["freed"]["cuda_graph"] < 0.5 * run["sizes"]["cuda_graph"]:
                problems.append(f"cycle {number}: pause(cuda_graph) freed {cycle['freed']['cuda_graph']} of {run['sizes']['cuda_graph']}")
    failed += bool(problems)
    print(f"sglang adapter, hook mode {mode}: {'PASS' if not problems else 'FAIL: ' + '; '.join(problems)}")
print(f"{2 - failed} passed, {failed} failed")
sys.exit(1 if failed else 0)
PY
