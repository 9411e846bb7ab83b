"""Pause and resume with each kind of backup, side by side in one run: uvm.memory_saver's
pinned, mmap and disk backups against torch_memory_saver's (its wheel, hook_mode "torch"), the disk's
own sequential bandwidth (dd with direct I/O, same directory) and the pinned cudaMemcpy of the same
bytes. Each backend runs in a child process of its own (each library keeps process-wide state).

    python bench/backup_bench.py --dir /var/tmp/uvm-bench --gib 4 --json out.json

--ram-disk GIB (root) measures the disk backups on a faster disk than the device machine's virtual
one (bench/ram_disk.py: a loop-mounted ext4 image in /dev/shm, standing in for a local NVMe drive).

Memory is releasable device memory (not managed); it never exceeds --gib on the GPU."""
from __future__ import annotations

import argparse
import json
import os
import platform
import re
import shutil
import statistics
import subprocess
import sys
import tempfile

from ram_disk import ram_disk

CHILD = r"""
import json, os, sys, time, torch
which, backend, gib, cycles, disk_dir, gap, awake = sys.argv[1], sys.argv[2], float(sys.argv[3]), int(sys.argv[4]), sys.argv[5], float(sys.argv[6]), float(sys.argv[7])
if which == "uvm":
    from uvm.memory_saver import torch_memory_saver as saver
else:
    from torch_memory_saver import torch_memory_saver as saver
    saver.hook_mode = "torch"
def rss():
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")
options = {"pinned": dict(enable_cpu_backup=True, cpu_backup_backend="pinned"),
           "mmap": dict(enable_cpu_backup=True, cpu_backup_backend="mmap"),
           "default": dict(enable_cpu_backup=True),
           "disk": dict(enable_disk_backup=True)}[backend]
if backend == "disk":
    saver.set_disk_backup_dir(disk_dir)
saver.retain_cpu_backup = os.environ.get("BENCH_RETAIN") == "1"  # --retain: backups (and files) kept between cycles
tensor_bytes = 64 << 20
count = int(gib * (1 << 30)) // tensor_bytes
with saver.region(tag="bench", **options):
    tensors = [torch.full((tensor_bytes,), i % 251, dtype=torch.uint8, device="cuda") for i in range(count)]
torch.cuda.synchronize()
nbytes = count * tensor_bytes
rss_start = rss()
pauses, resumes, rss_paused, rss_after = [], [], [], []
for cycle in range(cycles):
    if cycle:
        time.sleep(awake)  # the rollouts between a resume and the next pause: freed blocks settle (not timed)
    torch.cuda.synchronize()
    t0 = time.perf_counter(); saver.pause("bench"); torch.cuda.synchronize(); pauses.append(time.perf_counter() - t0)
    rss_paused.append(rss())
    time.sleep(gap)  # what a training step would take: the disk settles (not timed)
    t1 = time.perf_counter(); saver.resume("bench"); torch.cuda.synchronize(); resumes.append(time.perf_counter() - t1)
    rss_after.append(rss())
ok = all(int(t[0]) == i % 251 and int(t[-1]) == i % 251 for i, t in enumerate(tensors))
time.sleep(2)  # uvm gives pinned backups back on its own thread after a resume: RSS once settled
print(json.dumps(dict(bytes=nbytes, pause_s=pauses, resume_s=resumes, rss_start=rss_start,
                      rss_paused=rss_paused, rss_after=rss_after, rss_settled=rss(), intact=ok)), flush=True)
# torch_memory_saver in hook_mode "torch" aborts on a free outside a region ("only support
# interesting region"): the tensors go inside one, and the process ends without a teardown.
with saver.region(tag="bench", **options):
    del tensors
    torch.cuda.empty_cache()
os._exit(0)
"""

PINNED = r"""
import json, sys, time, torch
nbytes = int(float(sys.argv[1]) * (1 << 30))
device = torch.empty(nbytes, dtype=torch.uint8, device="cuda")
host = torch.empty(nbytes, dtype=torch.uint8, pin_memory=True)
d2h, h2d = [], []
for _ in range(3):
    torch.cuda.synchronize(); t0 = time.perf_counter(); host.copy_(device, non_blocking=True); torch.cuda.synchronize()
    t1 = time.perf_counter(); device.copy_(host, non_blocking=True); torch.cuda.synchronize(); t2 = time.perf_counter()
    d2h.append(t1 - t0); h2d.append(t2 - t1)
print(json.dumps(dict(bytes=nbytes, d2h_s=d2h, h2d_s=h2d)))
"""


def disk_bandwidth(directory: str, gib: float) -> dict:
    """dd of `gib` GiB with O_DIRECT, 16 MiB requests, write then read, in `directory`."""
    path = os.path.join(directory, "dd-probe")
    count = int(gib * 64)
    result = {}
    for name, args in (("write", ["if=/dev/zero", f"of={path}", "oflag=direct", "conv=fsync"]),
                       ("read", [f"if={path}", "of=/dev/null", "iflag=direct"])):
        out = subprocess.run(["dd", *args, "bs=16M", f"count={count}"], capture_output=True, text=True)
        match = re.search(r"copied, ([\d.]+) s", out.stderr)
        result[name + "_gbps"] = count * (16 << 20) / float(match.group(1)) / 1e9 if match else None
    os.unlink(path)
    return result


def child(code: str, args: list[str], env: dict | None = None) -> dict:
    out = subprocess.run([sys.executable, "-c", code, *args], capture_output=True, text=True,
                         env={**os.environ, **(env or {})}, timeout=600)
    lines = [line for line in out.stdout.splitlines() if line.startswith("{")]
    if out.returncode != 0 or not lines:
        return {"error": (out.stderr or out.stdout)[-800:]}
    return json.loads(lines[-1])


def versions() -> dict:
    import torch
    found = {"python": platform.python_version(), "torch": torch.__version__, "cuda": torch.version.cuda}
    if torch.cuda.is_available():
        found["device"] = torch.cuda.get_device_name(0)
    smi = subprocess.run(["nvidia-smi", "--query-gpu=driver_version", "--format=csv,noheader"],
                         capture_output=True, text=True)
    found["driver"] = smi.stdout.strip()
    found["kernel"] = platform.release()
    return found


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--dir", default="/var/tmp/uvm-backup-bench", help="a directory on the disk to measure")
    parser.add_argument("--gib", type=float, default=4.0)
    parser.add_argument("--cycles", type=int, default=3)
    parser.add_argument("--threads", default="auto", help="UVM_BACKUP_THREADS settings to run uvm's mmap and disk "
                        "backups with (comma-separated)")
    parser.add_argument("--no-peer", action="store_true")
    parser.add_argument("--no-disk", action="store_true", help="CPU backups only (no dd, no disk runs)")
    parser.add_argument("--disk-only", action="store_true", help="disk backups only (no CPU-backup runs)")
    parser.add_argument("--ram-disk", type=float, metavar="GIB",
                        help="measure on a loop-mounted ext4 image of GIB GiB in /dev/shm instead of --dir (root)")
    parser.add_argument("--rounds", type=int, default=1, help="times the CPU-backup runs take turns")
    parser.add_argument("--variant", action="append", default=[], metavar="VAR=x[,VAR=y]",
                        help="one more run of each uvm backup per round with this environment (repeatable)")
    parser.add_argument("--gap", type=float, default=0.0, metavar="S",
                        help="seconds between each pause and its resume, not timed (a training step's length)")
    parser.add_argument("--awake", type=float, default=0.0, metavar="S",
                        help="seconds between each resume and the next pause, not timed (the rollouts' length)")
    parser.add_argument("--disk-rounds", type=int, default=2, help="times the disk runs take turns")
    parser.add_argument("--retain", action="store_true",
                        help="the disk runs once more each round with retain_cpu_backup on, both libraries: the file "
                             "stays from one cycle to the next")
    parser.add_argument("--json")
    args = parser.parse_args()
    if args.ram_disk:
        with ram_disk(args.ram_disk) as mount:
            args.dir = mount
            return run(args)
    os.makedirs(args.dir, mode=0o700, exist_ok=True)
    return run(args)


def variant_env(variant: str) -> dict[str, str]:
    """--variant's "VAR=x,VAR=y" as an environment."""
    return dict(pair.split("=", 1) for pair in variant.split(","))


def run(args: argparse.Namespace) -> int:
    report = {"versions": versions(), "gib": args.gib, "dir": args.dir, "ram_disk_gib": args.ram_disk, "gap_s": args.gap, "awake_s": args.awake,
              "filesystem": subprocess.run(["stat", "-f", "-c", "%T", args.dir], capture_output=True,
                                           text=True).stdout.strip(),
              "disk": None if args.no_disk else disk_bandwidth(args.dir, args.gib),
              "pinned": child(PINNED, [str(args.gib)]), "runs": []}
    threads = args.threads.split(",")
    runs = []
    for _ in range(0 if args.disk_only else args.rounds):
        runs += [("uvm", backend, {}) for backend in ("default", "pinned")]
        runs += [("uvm", "mmap", {"UVM_BACKUP_THREADS": t}) for t in threads]
        runs += [("uvm", backend, variant_env(v)) for v in args.variant for backend in ("default", "pinned", "mmap")]
        if not args.no_peer:
            runs += [("torch_memory_saver", backend, {}) for backend in ("default", "pinned", "mmap")]
    # The disk's speed drifts over minutes (burst credits, the host's cache): uvm's and the peer's
    # disk backups take turns, and dd runs again after them.
    for _ in range(0 if args.no_disk else args.disk_rounds):
        runs += [("uvm", "disk", {"UVM_BACKUP_THREADS": t}) for t in threads]
        runs += [("uvm", "disk", variant_env(v)) for v in args.variant]
        runs += [] if args.no_peer else [("torch_memory_saver", "disk", {})]
        if args.retain:
            runs += [("uvm", "disk", {"BENCH_RETAIN": "1"})]
            runs += [] if args.no_peer else [("torch_memory_saver", "disk", {"BENCH_RETAIN": "1"})]
    for which, backend, env in runs:
        work = tempfile.mkdtemp(dir=args.dir)
        result = child(CHILD, [which, backend, str(args.gib), str(args.cycles), work, str(args.gap), str(args.awake)], env)
        shutil.rmtree(work, ignore_errors=True)
        result.update(which=which, backend=backend, env=env)
        report["runs"].append(result)
    report["disk_after"] = None if args.no_disk else disk_bandwidth(args.dir, args.gib)
    pinned = report["pinned"]
    limit_out = pinned["bytes"] / min(pinned["d2h_s"]) / 1e9 if "bytes" in pinned else None
    limit_in = pinned["bytes"] / min(pinned["h2d_s"]) / 1e9 if "bytes" in pinned else None
    disk = report["disk"]
    where = f"a RAM-backed loop disk of {args.ram_disk} GiB" if args.ram_disk else "the machine's disk"
    print(f"device: {report['versions']}; {args.gib} GiB in 64 MiB tensors; {args.gap} s between pause and resume, {args.awake} s awake before the next pause; dir {args.dir} ({report['filesystem']}, {where})")
    after = report["disk_after"]
    if disk:
        print(f"disk (dd, O_DIRECT, 16 MiB): write {disk['write_gbps']:.2f} GB/s, read {disk['read_gbps']:.2f} GB/s "
              f"(after the runs: {after['write_gbps']:.2f}, {after['read_gbps']:.2f})")
    print(f"pinned cudaMemcpy: D2H {limit_out:.1f} GB/s, H2D {limit_in:.1f} GB/s")
    print("| library | backup | env | pause GB/s | resume GB/s | pause / limit | resume / limit | RSS after resume − before (MiB) | 2 s later | intact |")
    print("|---|---|---|---|---|---|---|---|---|---|")
    for run in report["runs"]:
        if "error" in run:
            print(f"| {run['which']} | {run['backend']} | {run['env']} | error: {run['error'][-200:]!r} |")
            continue
        pause = run["bytes"] / statistics.median(run["pause_s"]) / 1e9
        resume = run["bytes"] / statistics.median(run["resume_s"]) / 1e9
        out_limit = disk["write_gbps"] if run["backend"] == "disk" else limit_out
        in_limit = disk["read_gbps"] if run["backend"] == "disk" else limit_in
        run.update(pause_gbps=pause, resume_gbps=resume, pause_fraction=pause / out_limit, resume_fraction=resume / in_limit)
        grown = (run["rss_after"][-1] - run["rss_start"]) / (1 << 20)
        settled = (run["rss_settled"] - run["rss_start"]) / (1 << 20)
        print(f"| {run['which']} | {run['backend']} | {run['env'] or ''} | {pause:.2f} | {resume:.2f} | "
              f"{pause / out_limit:.2f} | {resume / in_limit:.2f} | {grown:.0f} | {settled:.0f} | {run['intact']} |")
    mmap_summary(report)
    disk_summary(report)
    disk_summary(report, retained=True)
    if args.json:
        with open(args.json, "w") as f:
            json.dump(report, f, indent=1)
    return 0


def per_cycle(run: dict, phase: str) -> list[float]:
    """A run's GB/s in each of its cycles, of `phase` ("pause" or "resume")."""
    return [run["bytes"] / seconds / 1e9 for seconds in run[f"{phase}_s"]]


def mmap_summary(report: dict) -> None:
    """uvm's mmap backup against its pinned one (the goal: within 10 %), over every cycle of every
    round and round by round (the k-th mmap run against the k-th pinned run), for the default runs
    and each --variant's (against the pinned runs of the same variant)."""
    def variant(run: dict) -> str:  # UVM_BACKUP_THREADS alone is the default runs' own setting
        return json.dumps({k: v for k, v in run["env"].items() if k != "UVM_BACKUP_THREADS"}, sort_keys=True)
    ok = [r for r in report["runs"] if r["which"] == "uvm" and "error" not in r]
    report["mmap_summary"] = {}
    for kind in sorted({variant(r) for r in ok if r["backend"] == "mmap"}):
        mmap = [r for r in ok if r["backend"] == "mmap" and variant(r) == kind]
        pinned = [r for r in ok if r["backend"] == "pinned" and variant(r) == kind]
        if not pinned:
            continue
        summary = {}
        for phase in ("pause", "resume"):
            ours = statistics.median(x for r in mmap for x in per_cycle(r, phase))
            theirs = statistics.median(x for r in pinned for x in per_cycle(r, phase))
            by_round = [statistics.median(per_cycle(m, phase)) / statistics.median(per_cycle(p, phase))
                        for m, p in zip(mmap, pinned)]
            summary[phase] = dict(mmap_gbps=ours, pinned_gbps=theirs, ratio=ours / theirs, by_round=by_round)
            print(f"mmap {phase} {kind}, every cycle: {ours:.2f} GB/s against pinned {theirs:.2f}: "
                  f"{ours / theirs:.2f} (by round: {', '.join(f'{x:.2f}' for x in by_round)})")
        report["mmap_summary"][kind] = summary


def disk_summary(report: dict, retained: bool = False) -> None:
    """uvm's disk backup against the peer's over every cycle of every round: single cycles on a
    drifting disk say little, so the medians of all of them and the rounds each side won. With
    `retained`, the runs with retain_cpu_backup on (--retain)."""
    cycles: dict[str, dict[str, list[float]]] = {}
    rounds: dict[str, list[float]] = {}
    label = "disk (retained)" if retained else "disk"
    for run in report["runs"]:
        if retained:
            default = run["env"] == {"BENCH_RETAIN": "1"}
        else:
            default = run["env"] == ({"UVM_BACKUP_THREADS": "auto"} if run["which"] == "uvm" else {})
        if run["backend"] != "disk" or "error" in run or not default:
            continue
        mine = cycles.setdefault(run["which"], {"pause": [], "resume": []})
        for phase in ("pause", "resume"):
            mine[phase] += per_cycle(run, phase)
        rounds.setdefault(run["which"], []).append(run["resume_gbps"])
    if set(cycles) != {"uvm", "torch_memory_saver"}:
        return
    summary = {}
    for phase in ("pause", "resume"):
        ours, theirs = (statistics.median(cycles[w][phase]) for w in ("uvm", "torch_memory_saver"))
        summary[phase] = dict(uvm_gbps=ours, peer_gbps=theirs, ratio=ours / theirs,
                              uvm_cycles=cycles["uvm"][phase], peer_cycles=cycles["torch_memory_saver"][phase])
        print(f"{label} {phase}, every cycle: uvm median {ours:.2f} GB/s "
              f"({min(cycles['uvm'][phase]):.2f}-{max(cycles['uvm'][phase]):.2f}), torch_memory_saver {theirs:.2f} "
              f"({min(cycles['torch_memory_saver'][phase]):.2f}-{max(cycles['torch_memory_saver'][phase]):.2f}): "
              f"{ours / theirs:.2f}x")
    won = sum(a > b for a, b in zip(rounds["uvm"], rounds["torch_memory_saver"]))
    summary["resume_rounds_won"] = [won, len(rounds["uvm"])]
    print(f"{label} resume: uvm's median ahead in {won} of {len(rounds['uvm'])} rounds")
    report["disk_summary_retained" if retained else "disk_summary"] = summary


if __name__ == "__main__":
    sys.exit(main())
