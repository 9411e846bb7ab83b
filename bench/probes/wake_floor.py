"""The floors under a sleep and a wake that follow the training step's free, read from UVM_TRACE
files of the RL bench (`RL_TRACE=1 scripts/device_run.sh`): how close each call came to what the
driver leaves possible.

A wake: after the claim's free, one map stalls while the driver takes the freed memory back (no
order of calls avoids it: measurements.md, "Why a wake stops near 85 % of pinned memcpy"). Until
it ends only the bytes mapped before it can be copied, so no copy method can finish sooner than

    floor = max(stall end, bytes copied before it / link) + the bytes after it / link

with the link the fastest copy of the trace (a lone copy of at least 16 MiB). A sleep call: its
releases, and whether copies ran beside them (a release with no copies beside it is a wait the
call cannot hide: measurements.md, "The drop-in at the native calls' speed").

    python bench/probes/wake_floor.py RESULTS_JSON TRACE_DIR   # traces named rl-<pid>.json, as device_run writes
"""
from __future__ import annotations

import argparse
import json
import os
import statistics

MIN_LINK_COPY = 16 << 20


def calls_with_phases(events: list[dict]) -> list[tuple[dict, list[dict]]]:
    """Each uvm call on a host thread with the phase events that name it, up to the next call on
    that thread (a move's copies may end after its call returned)."""
    calls = sorted((e for e in events if e.get("ph") == "X" and e["name"].startswith("uvm_")), key=lambda e: e["ts"])
    out = []
    for i, call in enumerate(calls):
        later = [c["ts"] for c in calls[i + 1:] if c["tid"] == call["tid"]]
        end = later[0] if later else float("inf")
        phases = [e for e in events if e.get("ph") == "X" and e.get("args", {}).get("call") == call["name"]
                  and call["ts"] <= e["ts"] < end]
        out.append((call, phases))
    return out


def link_gbps(events: list[dict]) -> float:
    """The fastest copy of at least 16 MiB: what the link gives one copy alone."""
    rates = [e["args"]["GB/s"] for e in events if e.get("name") == "copy" and e["args"].get("bytes", 0) >= MIN_LINK_COPY]
    return max(rates) if rates else 0.0


def wake_floor(call: dict, phases: list[dict], link: float) -> dict | None:
    """A wake's floor (see the module's doc), or None for a call with no map and no copy."""
    maps = [e for e in phases if e["name"] == "map"]
    copies = [e for e in phases if e["name"] == "copy"]
    if not maps or not copies or link <= 0:
        return None
    t0 = call["ts"]
    stall = max(maps, key=lambda e: e["dur"])
    stall_end = stall["ts"] + stall["dur"] - t0
    before = sum(e["args"]["bytes"] for e in copies if e["ts"] - t0 < stall_end)
    after = sum(e["args"]["bytes"] for e in copies) - before
    us_per_byte = 1e-3 / link  # GB/s = bytes per ns: 1 / link ns per byte
    floor_us = max(stall_end, before * us_per_byte) + after * us_per_byte
    ended_us = max([call["dur"]] + [e["ts"] + e["dur"] - t0 for e in copies])
    return {"call": call["name"], "seconds": ended_us / 1e6, "floor_s": floor_us / 1e6,
            "stall_s": stall["dur"] / 1e6, "stall_end_s": stall_end / 1e6, "bytes_before": before,
            "bytes_after": after, "link_gbps": link}


def sleep_releases(call: dict, phases: list[dict]) -> dict | None:
    """A call's releases: their seconds, and the part of them with no copy running beside it."""
    releases = [e for e in phases if e["name"] == "release"]
    if not releases:
        return None
    copies = [(e["ts"], e["ts"] + e["dur"]) for e in phases if e["name"] == "copy"]
    alone = 0.0
    for r in releases:
        start, end = r["ts"], r["ts"] + r["dur"]
        covered = sum(max(0, min(end, c_end) - max(start, c_start)) for c_start, c_end in copies)
        alone += max(0, r["dur"] - covered)
    return {"call": call["name"], "seconds": call["dur"] / 1e6, "release_s": sum(r["dur"] for r in releases) / 1e6,
            "release_alone_s": alone / 1e6, "copied_bytes": sum(e["args"]["bytes"] for e in phases if e["name"] == "copy")}


def report(events: list[dict], skip_first: int = 1) -> dict:
    """Steady medians (the first `skip_first` wakes and sleeps left out: the first cycle pins) of
    each wake's time and floor, and of each kind of sleep call's releases."""
    link = link_gbps(events)
    wakes, sleeps = [], {}
    for call, phases in calls_with_phases(events):
        if (w := wake_floor(call, phases, link)) is not None:
            wakes.append(w)
        elif (s := sleep_releases(call, phases)) is not None:
            sleeps.setdefault(call["name"] + (" (copies)" if s["copied_bytes"] else " (nothing to copy)"), []).append(s)
    steady = wakes[skip_first:] or wakes
    out = {"link_gbps": link, "wakes": len(wakes)}
    if steady:
        out["wake"] = {k: statistics.median(w[k] for w in steady)
                       for k in ("seconds", "floor_s", "stall_s", "stall_end_s", "bytes_before")}
    out["sleep_calls"] = {name: {k: statistics.median(s[k] for s in (rows[skip_first:] or rows))
                                 for k in ("seconds", "release_s", "release_alone_s")} for name, rows in sleeps.items()}
    return out


def lines(method: str, pattern: str, r: dict) -> list[str]:
    out = []
    if "wake" in r:
        w = r["wake"]
        out.append(f"{pattern} {method}: wake {w['seconds'] * 1e3:.1f} ms, floor {w['floor_s'] * 1e3:.1f} ms "
                   f"({w['seconds'] / w['floor_s']:.2f}x): a map stalls {w['stall_s'] * 1e3:.1f} ms, ending at "
                   f"+{w['stall_end_s'] * 1e3:.1f} ms with {w['bytes_before'] / 1e9:.2f} GB copyable before it; "
                   f"link {r['link_gbps']:.1f} GB/s")
    for name, s in r["sleep_calls"].items():
        out.append(f"{pattern} {method}: {name} {s['seconds'] * 1e3:.1f} ms, releases {s['release_s'] * 1e3:.1f} ms "
                   f"({s['release_alone_s'] * 1e3:.1f} ms with no copy beside them)")
    return out


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("results", help="the RL bench's results.json (each child's pid, method and pattern)")
    parser.add_argument("traces", help="the folder of rl-<pid>.json traces")
    args = parser.parse_args(argv)
    with open(args.results) as f:
        results = json.load(f)["results"]
    for result in results:
        path = os.path.join(args.traces, f"rl-{result['pid']}.json")
        if not os.path.exists(path):
            continue  # a child that made no uvm move (the peer's rows, pinned memcpy)
        with open(path) as f:
            events = json.load(f)
        print("\n".join(lines(result["method"], result["pattern"], report(events))))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
