"""The soak: one process, many sleep/wake cycles of an RL-shaped workload through uvm.memory_saver,
every byte checked every cycle, and nothing growing.

Each cycle pauses weights kept in pinned memory, weights kept in mmap'ed memory, weights kept on
disk and a KV cache with no backup; a training step claims the freed memory with plain torch
tensors (a matmul over them) and lets it go; everything resumes; the weights must hold exactly
their pattern, the KV cache is written again and checked. Every other cycle retains the host
copies (retain_cpu_backup). After each cycle it records GPU memory in use, host RSS, pinned bytes,
open descriptors, threads and files in the backup directory; after the first cycles each must be
flat: the report gives the slope (per cycle) and max - min of each, a plot and JSON.

    python bench/soak_bench.py [--cycles 500] [--weights-mib 256] [--dir /var/tmp/uvm-soak] [--out DIR]

Bounded memory: weights 3 x --weights-mib plus a KV cache of --weights-mib, releasable device
memory (not managed), far below 25 % of the card. Exits 1 when a byte was wrong or a measure grew.
The CPU version on the CUDA test double: tests/offload/test_soak.cpp (CI)."""
from __future__ import annotations

import argparse
import json
import os
import platform
import shutil
import sys
import time
from pathlib import Path


sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "python_shim"))
import uvm  # noqa: E402
from uvm.memory_saver import torch_memory_saver as saver  # noqa: E402

torch = None  # imported by main: --plot needs no torch

MiB = 1 << 20
# What each measure may move after the warm-up, max - min and slope x cycles alike, among cycles
# with the same retain setting.
ALLOWED = {"gpu_used_mib": 64, "rss_mib": 64, "pinned_mib": 0, "descriptors": 4, "threads": 4, "backup_files": 0}


def pattern(numel: int, seed: int) -> torch.Tensor:
    """A fill that depends on every element's index (int32, no two neighbours equal)."""
    index = torch.arange(numel, device="cuda", dtype=torch.int64)
    return ((index * 2654435761 + seed * 40503) % 2147483647).to(torch.int32)


def rss_mib() -> float:
    with open("/proc/self/status") as status:
        for line in status:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    return 0.0


def sample(backup_dir: Path) -> dict:
    free, total = torch.cuda.mem_get_info()
    staging = uvm.staging()
    for _ in range(200):  # once a resume's asynchronous give-back ran: two reads 10 ms apart agree
        time.sleep(0.01)
        again = uvm.staging()
        if again["capacity_bytes"] == staging["capacity_bytes"]:
            break
        staging = again
    return {"gpu_used_mib": (total - free) / MiB, "rss_mib": rss_mib(),
            "pinned_mib": staging["capacity_bytes"] / MiB, "descriptors": len(os.listdir("/proc/self/fd")),
            "threads": len(os.listdir("/proc/self/task")),
            "backup_files": sum(1 for name in os.listdir(backup_dir) if name.endswith(".backup"))}


def trend(values: list) -> tuple:
    """(least-squares slope per cycle, max - min)."""
    n = len(values)
    mean_x, mean_y = (n - 1) / 2, sum(values) / n
    var = sum((x - mean_x) ** 2 for x in range(n))
    slope = sum((x - mean_x) * (y - mean_y) for x, y in enumerate(values)) / var if var else 0.0
    return slope, max(values) - min(values)


def environment() -> dict:
    props = torch.cuda.get_device_properties(0)
    driver = "unknown"
    try:
        import subprocess
        driver = subprocess.run(["nvidia-smi", "--query-gpu=driver_version", "--format=csv,noheader"],
                                capture_output=True, text=True, timeout=30).stdout.strip()
    except OSError:
        pass
    return {"device": props.name, "memory_gib": round(props.total_memory / (1 << 30), 1), "driver": driver,
            "torch": torch.__version__, "cuda": torch.version.cuda, "python": platform.python_version(),
            "date": time.strftime("%Y-%m-%d")}


def plot(result: dict, path: Path) -> None:
    """Each measure per cycle, the cycles that retain the host copies as a line of their own."""
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        print("matplotlib is not installed: no plot")
        return
    samples = result["samples"]
    figure, axes = plt.subplots(2, 3, figsize=(13, 6), sharex=True)
    for axis, name in zip(axes.flat, samples[0]):
        for retained, label in ((0, "copies given back"), (1, "copies retained")):
            cycles = range(retained, len(samples), 2)
            axis.plot(list(cycles), [samples[c][name] for c in cycles], linewidth=0.9, label=label)
        axis.axvline(result["warmup"], color="grey", linestyle=":")
        axis.set_title(name)
    axes.flat[0].legend(fontsize=8)
    figure.suptitle(f"uvm soak: {result['cycles']} sleep/wake cycles, {result['environment']['device']}")
    figure.tight_layout()
    figure.savefig(path, dpi=90)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--cycles", type=int, default=500)
    parser.add_argument("--warmup", type=int, default=20)
    parser.add_argument("--weights-mib", type=int, default=256)
    parser.add_argument("--dir", default="/var/tmp/uvm-soak")
    parser.add_argument("--out", default=os.environ.get("OUT", "bench-out"))
    parser.add_argument("--plot", metavar="JSON", help="only draw the plot of an earlier run's soak.json into --out")
    args = parser.parse_args()
    if args.plot:
        Path(args.out).mkdir(parents=True, exist_ok=True)
        plot(json.loads(Path(args.plot).read_text()), Path(args.out) / "soak.png")
        return 0
    global torch
    import torch
    total = torch.cuda.get_device_properties(0).total_memory
    budget = 4 * args.weights_mib * MiB + 2 * args.weights_mib * MiB  # weights, KV, the training step
    if budget > total // 4:
        sys.exit(f"soak: {budget / MiB:.0f} MiB would pass 25 % of the card's {total / MiB:.0f} MiB")
    backup_dir = Path(args.dir)
    shutil.rmtree(backup_dir, ignore_errors=True)
    backup_dir.mkdir(parents=True)
    saver.set_disk_backup_dir(str(backup_dir))
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)

    numel = args.weights_mib * MiB // 4
    weights = {}
    for seed, (tag, options) in enumerate([("weights-pinned", {"enable_cpu_backup": True}),
                                           ("weights-mmap", {"enable_cpu_backup": True, "cpu_backup_backend": "mmap"}),
                                           ("weights-disk", {"enable_disk_backup": True})]):
        with saver.region(tag, **options):
            weights[tag] = pattern(numel, seed)
    with saver.region("kv-cache"):
        kv = torch.empty(numel, device="cuda", dtype=torch.int32)
    tags = list(weights) + ["kv-cache"]
    torch.cuda.synchronize()

    samples, wrong, started = [], [], time.perf_counter()
    for cycle in range(args.cycles):
        saver.retain_cpu_backup = bool(cycle % 2)
        for tag in tags:
            saver.pause(tag)
        # The training step: the freed memory, claimed by plain tensors and let go.
        step = torch.randn(2 * numel // 4, 2, device="cuda")
        claim = torch.empty(3 * numel, device="cuda", dtype=torch.int32).fill_(cycle)
        (step.T @ step).sum().item()
        del step, claim
        for tag in tags:
            saver.resume(tag)
        for seed, (tag, tensor) in enumerate(weights.items()):
            if not torch.equal(tensor, pattern(numel, seed)):
                wrong.append((cycle, tag))
        kv.copy_(pattern(numel, 100 + cycle))
        if not torch.equal(kv, pattern(numel, 100 + cycle)):
            wrong.append((cycle, "kv-cache"))
        torch.cuda.synchronize()
        samples.append(sample(backup_dir))
        if (cycle + 1) % 50 == 0:
            print(f"cycle {cycle + 1}/{args.cycles}: {samples[-1]}", flush=True)
    seconds = time.perf_counter() - started
    saver.retain_cpu_backup = False

    # A cycle that retains the host copies ends holding them (pinned, mmap'ed): its measures are
    # compared with the other retaining cycles', and the others' with each other.
    report, flat = {}, True
    for retained in (False, True):
        measured = [s for cycle, s in enumerate(samples) if cycle >= args.warmup and bool(cycle % 2) == retained]
        for name in samples[0]:
            values = [s[name] for s in measured]
            slope, spread = trend(values)
            ok = spread <= ALLOWED[name] and abs(slope) * len(values) <= ALLOWED[name]
            flat &= ok
            report[f"{name}{' (retained)' if retained else ''}"] = {
                "slope_per_cycle": slope, "max_minus_min": spread, "allowed": ALLOWED[name],
                "first": values[0], "last": values[-1], "flat": ok}
    result = {"environment": environment(), "cycles": args.cycles, "warmup": args.warmup,
              "weights_mib": args.weights_mib, "seconds": seconds, "wrong_bytes": wrong, "measures": report,
              "samples": samples}
    (out / "soak.json").write_text(json.dumps(result, indent=1))

    print(f"\nsoak: {args.cycles} cycles in {seconds:.0f} s on {result['environment']['device']} "
          f"(driver {result['environment']['driver']}, torch {torch.__version__}, CUDA {torch.version.cuda}); "
          f"measured after {args.warmup} cycles, cycles that retain the host copies apart")
    print("| measure | first | last | slope per cycle | max - min | allowed | flat |")
    print("| --- | ---: | ---: | ---: | ---: | ---: | --- |")
    for name, row in report.items():
        print(f"| {name} | {row['first']:.1f} | {row['last']:.1f} | {row['slope_per_cycle']:+.4f} | "
              f"{row['max_minus_min']:.1f} | {row['allowed']} | {'yes' if row['flat'] else 'NO'} |")
    print(f"bytes checked every cycle: {'all identical' if not wrong else f'{len(wrong)} WRONG, first {wrong[:3]}'}")
    plot(result, out / "soak.png")
    ok = flat and not wrong
    print(f"soak: {'PASSED' if ok else 'FAILED'}")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
