"""Draws docs/stream_forward.png from stream_bench.py's JSON files: per shape and GPU, the forward's
time for the resident model (the floor), the link-bound ideal, uvm with every layer streamed,
uvm.stream's default (the first layers the budget holds kept) and accelerate's cpu_offload (log
scale: accelerate takes 6-10x uvm's time).

    python bench/stream_plot.py bench/results/stream/h100.json bench/results/stream/h200.json --out docs/stream_forward.png
"""
from __future__ import annotations

import argparse
import json

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

SERIES = [("resident_s", "resident (compute floor)"), ("link_ideal_s", "link-bound ideal (every layer)"),
          ("uvm_all_s", "uvm, every layer streamed"), ("uvm_stream_s", "uvm.stream (first layers kept)"),
          ("accelerate_s", "accelerate cpu_offload")]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("results", nargs="+")
    parser.add_argument("--out", default="docs/stream_forward.png")
    args = parser.parse_args()
    reports = [json.load(open(path)) for path in args.results]
    groups = [(report["versions"]["device"].replace("NVIDIA ", "").replace(" 80GB HBM3", ""), shape, row)
              for report in reports for shape, row in report["rows"].items()]
    fig, ax = plt.subplots(figsize=(11, 4.5))
    width = 0.16
    for k, (key, label) in enumerate(SERIES):
        xs = [i + (k - (len(SERIES) - 1) / 2) * width for i in range(len(groups))]
        ax.bar(xs, [row.get(key, 0) * 1e3 for _, _, row in groups], width, label=label)
    ax.set_xticks(range(len(groups)), [f"{gpu}\n{shape}" for gpu, shape, _ in groups])
    ax.set_yscale("log")
    ax.set_ylabel("one forward (ms, log scale)")
    first = reports[0]
    ax.set_title(f"{first['streamed_gib']:.1f} GiB of layers streamed within a {first['budget_gib']:g} GiB budget")
    ax.legend(loc="upper center", bbox_to_anchor=(0.5, -0.16), ncol=5, fontsize=8)
    fig.tight_layout()
    fig.savefig(args.out, dpi=110)


if __name__ == "__main__":
    main()
