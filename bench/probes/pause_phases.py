"""Where a traced uvm_pause or uvm_resume spent its time, phase by phase, read from UVM_TRACE files
(`NODE_TRACE=1 scripts/device_run.sh`: the node bench's ranks, one file each): for each call that
moved more than `--min-gb`, each phase as its first start and last end (ms into the call), its time
summed over its operations, and how many there were. A compressed copy's calls have a "code" phase;
the others have "copy" phases instead. What a call spends after its copies (releases it waited
for, with no copy beside them) is what overlapping would win.

    python bench/probes/pause_phases.py TRACE_DIR   # traces named uvm-<pid>.json
"""
from __future__ import annotations

import argparse
import json
from collections import defaultdict
from pathlib import Path


def phases(events: list[dict], call: dict) -> dict[str, list[dict]]:
    """The phases recorded for `call`, by name (a phase on the GPU may end after the call returned)."""
    start, end = call["ts"], call["ts"] + call["dur"]
    found: dict[str, list[dict]] = defaultdict(list)
    for e in events:
        if e.get("ph") == "X" and e.get("args", {}).get("call") == call["name"] and start <= e["ts"] < end:
            found[e["name"]].append(e)
    return found


def describe(events: list[dict], call: dict) -> str:
    t0 = call["ts"]
    ms = lambda us: round(us / 1000, 1)
    gbps = call["args"]["bytes"] / call["dur"] / 1e3
    lines = [f"{call['name']} {ms(call['dur'])} ms, {call['args']['bytes'] / 2**30:.2f} GiB, {gbps:.1f} GB/s"]
    for name, found in sorted(phases(events, call).items(), key=lambda item: min(e["ts"] for e in item[1])):
        first = min(e["ts"] for e in found) - t0
        last = max(e["ts"] + e["dur"] for e in found) - t0
        summed = sum(e["dur"] for e in found)
        lines.append(f"  {name:<8} {ms(first):>7} → {ms(last):>7} ms, {ms(summed):>7} ms summed, {len(found)} ops")
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("trace_dir", type=Path)
    parser.add_argument("--min-gb", type=float, default=1.0, help="calls that moved at least this many GB")
    args = parser.parse_args()
    for path in sorted(args.trace_dir.glob("uvm-*.json")):
        data = json.loads(path.read_text())
        events = data["traceEvents"] if isinstance(data, dict) else data
        calls = [e for e in events if e.get("name") in ("uvm_pause", "uvm_resume") and e.get("ph") == "X"
                 and e["args"].get("bytes", 0) >= args.min_gb * 1e9]
        if not calls:
            continue
        compressed = any(phases(events, call).get("code") for call in calls)
        print(f"{path.name} ({'compressed' if compressed else 'plain'} copies)")
        for call in calls:
            print(describe(events, call))


if __name__ == "__main__":
    main()
