#!/usr/bin/env bash
# The trainer→engine weight update (tests/peers/weight_sync.py says what it does) with SGLang's
# adapter on uvm in both hook modes, beside the reference run without the saver, in one call: greedy
# tokens after every update identical to the reference's, the tokens changing from step to step (so
# that an update that did not arrive shows), every IPC tensor received on the GPU, and the update's
# time through CUDA IPC beside the same update through host memory. Needs a GPU; results under $OUT
# (weight_sync.json: the summary, with device, driver, torch and CUDA versions).
set -uo pipefail
cd "$(dirname "$0")/../.."
python=${UVM_PYTHON:-python3}
out=${OUT:-$(mktemp -d)}
for mode in off preload torch; do
  timeout 900 "$python" tests/peers/weight_sync.py "$mode" "$out/weight_sync_$mode.json" >"$out/weight_sync_$mode.log" 2>&1
  status=$?
  [ "$status" = 77 ] && { cat "$out/weight_sync_$mode.log"; exit 77; }
  tail -n 3 "$out/weight_sync_$mode.log"
done
"$python" - "$out" <<'PY'
import json, statistics, subprocess, sys
out = sys.argv[1]
runs = {}
for mode in ("off", "preload", "torch"):
    try:
        runs[mode] = json.load(open(f"{out}/weight_sync_{mode}.json"))
    except (OSError, ValueError) as error:
        runs[mode] = {"error": str(error)}
reference = runs["off"]
failed, summary = 0, {"runs": {}}
for mode in ("preload", "torch"):
    run, problems = runs[mode], []
    if "error" in run or "error" in reference:
        problems.append((run.get("error") or reference.get("error"))[-600:])
    else:
        wanted = [step["tokens"] for step in reference["steps"]]
        got = [step["tokens"] for step in run["steps"]]
        if got != wanted:
            problems.append(f"tokens differ from the reference after updates {[i for i, (a, b) in enumerate(zip(got, wanted)) if a != b]}")
        if len({json.dumps(tokens) for tokens in wanted}) < len(wanted):
            problems.append("the reference's tokens repeat from one step to the next: an update that did not arrive would not show")
        if not all(step["received_on_device"] for step in run["steps"]):
            problems.append("an IPC tensor was not received on the GPU")
        ipc = [step["ipc_update_s"] for step in run["steps"]]
        host = [step["host_update_s"] for step in run["steps"]]
        steady = slice(1, None)  # the first update maps the memory and warms both paths
        summary["runs"][mode] = {
            "ipc_update_s": ipc, "host_update_s": host, "weight_bytes": run["weight_bytes"],
            "steady_ipc_median_s": statistics.median(ipc[steady]), "steady_host_median_s": statistics.median(host[steady]),
            "steady_host_over_ipc": statistics.median(host[steady]) / statistics.median(ipc[steady]),
            "device": run["device"], "torch": run["torch"], "cuda": run["cuda"], "saver": run["saver"]}
        print(f"weight sync, hook mode {mode}: update through CUDA IPC {1e3 * statistics.median(ipc[steady]):.1f} ms, "
              f"through host memory {1e3 * statistics.median(host[steady]):.1f} ms "
              f"({summary['runs'][mode]['steady_host_over_ipc']:.1f}x), {run['weight_bytes'] / 2**20:.0f} MiB of weights; "
              f"first update {1e3 * ipc[0]:.1f} / {1e3 * host[0]:.1f} ms")
    failed += bool(problems)
    print(f"weight sync, hook mode {mode}: {'PASS' if not problems else 'FAIL: ' + '; '.join(problems)}")
summary["driver"] = subprocess.run(["nvidia-smi", "--query-gpu=driver_version", "--format=csv,noheader"],
                                   capture_output=True, text=True).stdout.strip().splitlines()[:1]
summary["steps"] = len(reference.get("steps", []))
json.dump(summary, open(f"{out}/weight_sync.json", "w"), indent=1)
print(f"{2 - failed} passed, {failed} failed")
sys.exit(1 if failed else 0)
PY
