"""How a pause into fresh staging spent its time, read from UVM_TRACE files of the RL bench
(`RL_TRACE=1 scripts/device_run.sh`): for each pause that copied more than `--min-gb`, its waits
for the pinning thread and its copies, each as (start ms into the pause, ms, MiB), and when its
releases ran. A pause without retained backups pins its staging in 256 MiB steps while it copies
(docs/measurements.md, "A pause without retained memory: the wall"): copies at the link, one per
step, with the waits between them mean the pinning bounds the pause; copies slower than the link
mean something held them up.

    python bench/probes/pause_rounds.py TRACE_DIR   # traces named rl-<pid>.json, as device_run writes
"""
from __future__ import annotations

import argparse
import json
from pathlib import Path


def phases_of(events: list[dict], call: dict, name: str) -> list[dict]:
    """The `name` phases recorded for `call` (a copy may end after the call returned)."""
    start, end = call["ts"], call["ts"] + call["dur"]
    return sorted((e for e in events if e.get("name") == name and e.get("args", {}).get("call") == call["name"]
                   and start <= e["ts"] < end), key=lambda e: e["ts"])


def describe(events: list[dict], pause: dict) -> str:
    t0 = pause["ts"]
    ms = lambda us: round(us / 1000, 1)
    pins = [(ms(e["ts"] - t0), ms(e["dur"])) for e in phases_of(events, pause, "pin")]
    copies = [(ms(e["ts"] - t0), ms(e["dur"]), e["args"]["bytes"] >> 20) for e in phases_of(events, pause, "copy")]
    releases = phases_of(events, pause, "release")
    gbps = pause["args"]["bytes"] / pause["dur"] / 1e3
    lines = [f"pause {ms(pause['dur'])} ms, {gbps:.1f} GB/s; waits for pinning {pins}", f"  copies {copies}"]
    if releases:
        last = releases[-1]
        lines.append(f"  {len(releases)} releases from {ms(releases[0]['ts'] - t0)} to {ms(last['ts'] + last['dur'] - t0)} ms")
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("trace_dir", type=Path)
    parser.add_argument("--min-gb", type=float, default=2.0, help="pauses that moved at least this many GB")
    args = parser.parse_args()
    for path in sorted(args.trace_dir.glob("rl-*.json")):
        data = json.loads(path.read_text())
        events = data["traceEvents"] if isinstance(data, dict) else data
        pauses = [e for e in events if e.get("name") == "uvm_pause" and e.get("ph") == "X"
                  and e["args"].get("bytes", 0) >= args.min_gb * 1e9 and phases_of(events, e, "pin")]
        if pauses:
            print(path.name)
        for pause in pauses:
            print(describe(events, pause))


if __name__ == "__main__":
    main()
