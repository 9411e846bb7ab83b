"""Draws one move of a UVM_TRACE file as a timeline: a lane per host thread and stream, a bar per
phase operation, coloured by phase and labelled with its GB/s where it moved bytes.

    python bench/trace_plot.py /tmp/uvm-1234.json --call uvm_onload_ranges --index -1 --out wake.png

Needs matplotlib."""
from __future__ import annotations

import argparse
import json


def move_events(events: list[dict], call: str, index: int) -> tuple[dict, list[dict]]:
    """The `index`-th call named `call` and the phase events that belong to it (those of that call
    starting at or after it and before the next call of any name on the same thread)."""
    calls = sorted((e for e in events if e.get("ph") == "X" and e["name"].startswith("uvm_")), key=lambda e: e["ts"])
    chosen = [e for e in calls if e["name"] == call][index]
    later = [e["ts"] for e in calls if e["ts"] > chosen["ts"] and e["tid"] == chosen["tid"]]
    end = min(later) if later else float("inf")
    phases = [e for e in events if e.get("ph") == "X" and e.get("args", {}).get("call") == call
              and chosen["ts"] <= e["ts"] < end]
    return chosen, phases


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("trace")
    parser.add_argument("--call", default="uvm_onload_ranges")
    parser.add_argument("--index", type=int, default=-1, help="which call of that name (default: the last)")
    parser.add_argument("--out", default="move.png")
    args = parser.parse_args(argv)
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    with open(args.trace) as f:
        events = json.load(f)
    lanes = {e["tid"]: e["args"]["name"] for e in events if e.get("ph") == "M"}
    chosen, phases = move_events(events, args.call, args.index)
    order = sorted({e["tid"] for e in phases} | {chosen["tid"]})
    colours = {"copy": "tab:blue", "populate": "tab:orange", "map": "tab:green", "release": "tab:red",
               "wait": "tab:gray", "discard": "tab:purple", "migrate": "tab:brown", "pin": "tab:olive"}
    fig, ax = plt.subplots(figsize=(11, 1 + 0.5 * len(order)))
    t0 = chosen["ts"]
    row = {tid: i for i, tid in enumerate(order)}
    ax.broken_barh([(0, chosen["dur"] / 1e3)], (row[chosen["tid"]] - 0.45, 0.9), facecolors="none",
                   edgecolors="black", linestyles="dashed")
    for e in phases:
        y = row[e["tid"]]
        ax.broken_barh([((e["ts"] - t0) / 1e3, max(e["dur"], 1) / 1e3)], (y - 0.4, 0.8),
                       facecolors=colours.get(e["name"], "black"), edgecolors="white", linewidth=0.3)
    ax.set_yticks(range(len(order)), [lanes.get(tid, str(tid)) for tid in order])
    ax.set_xlabel(f"ms after {chosen['name']} began ({chosen['args']['bytes'] / 2**30:.2f} GiB; dashed: the call on the host)")
    handles = [plt.Rectangle((0, 0), 1, 1, color=c) for name, c in colours.items() if any(e["name"] == name for e in phases)]
    ax.legend(handles, [n for n in colours if any(e["name"] == n for e in phases)], loc="upper right", fontsize=8)
    ax.invert_yaxis()
    fig.tight_layout()
    fig.savefig(args.out, dpi=120)
    print(f"{args.out}: {len(phases)} phase operations of {chosen['name']}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
