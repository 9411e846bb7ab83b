"""vLLM's sleep mode, side by side in one run: vLLM's own CuMemAllocator and uvm's (uvm.vllm, put in
its place by UVM_SWITCH=vllm), on the same tensors, each allocator in a fresh process, through vLLM's
own `get_mem_allocator_instance()` and the tags and sleep calls its worker uses (vLLM's
CuMemBackend.suspend: level 1 keeps weights, runtime state and graphs; level 2 keeps runtime state and
graphs; a wake brings everything back).

The tensors: an 8B model's weights in bf16 as vLLM lays them out (32 layers of fused qkv, o, fused
gate_up, down and two norms; embedding, final norm and LM head: 195 tensors, 14.96 GiB with the
defaults), filled like trained weights (normal, std 0.02), and a 4 GiB KV cache in 32 per-layer
tensors under "kv_cache". All of it is device memory (no managed memory). A cycle: sleep, wake, the
weights checked against their checksums, --awake seconds awake (the engine serving; what a wake
leaves to the background runs then).

Rows (each with --cycles cycles; the first sleep apart, the others' median):
  vLLM CuMemAllocator            vLLM's allocator: level 1, and level 2
  uvm (default)                  uvm's: backups kept from one sleep to the next (the host memory
                                 vLLM's keeps too), level 1 and level 2
  uvm, backups given back        UVM_VLLM_RETAIN_BACKUPS=0: after a wake the pinned memory is given back
                                 and the next sleep's pinned again ahead, in the background
  uvm, given back, no pin ahead  the same with UVM_PREPARE_PAUSE=0: every sleep pins afresh
  uvm, compressed                UVM_COMPRESS_BACKUPS=1, backups kept
  pinned memcpy                  the same tensors copied to pinned host memory and back, one copy each
                                 (the link's limit; it frees nothing)
Also: the host memory each holds while awake (RSS over the process's before the model was made, read
at the end of the awake time).

--gpus N: N tensor-parallel worker processes per row, one per GPU, each holding its 1/N of every
matrix and 1/N of the KV cache, as vLLM's workers get the engine's sleep and wake together: they wait
for each other before every sleep and every wake, and a cycle takes as long as its slowest worker
(what the engine waits for). Host memory held is the workers' total.

    python -m uvm bench vllm [--cycles 4] [--layers 32] [--kv-gib 4] [--gpus 1] [--rows ...] [--out DIR]

Needs vLLM importable (its allocator: tests/peers/run_vllm_tests.sh sets it up on the GPU machine)
and a GPU. Writes results.json and results.md to --out, with device, driver, torch, CUDA and vLLM
versions.
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time

ROWS = {  # name: (environment, level)
    "vllm-1": ({"UVM_SWITCH": ""}, 1),
    "vllm-2": ({"UVM_SWITCH": ""}, 2),
    "uvm-1": ({"UVM_SWITCH": "vllm"}, 1),
    "uvm-2": ({"UVM_SWITCH": "vllm"}, 2),
    "uvm-given-back-1": ({"UVM_SWITCH": "vllm", "UVM_VLLM_RETAIN_BACKUPS": "0"}, 1),
    "uvm-no-pin-ahead-1": ({"UVM_SWITCH": "vllm", "UVM_VLLM_RETAIN_BACKUPS": "0", "UVM_PREPARE_PAUSE": "0"}, 1),
    "uvm-compressed-1": ({"UVM_SWITCH": "vllm", "UVM_COMPRESS_BACKUPS": "1"}, 1),
}
LABELS = {"vllm": "vLLM CuMemAllocator", "uvm": "uvm (default: backups kept)",
          "uvm-given-back": "uvm, backups given back",
          "uvm-no-pin-ahead": "uvm, given back, no pin ahead", "uvm-compressed": "uvm, compressed (kept)"}
HIDDEN, INTERMEDIATE, VOCAB, KV_HEADS_DIM = 4096, 14336, 128256, 1024


def shapes(layers: int, tensor_parallel: int = 1) -> list[tuple[int, ...]]:
    """An 8B model's weights as vLLM holds them (qkv and gate_up fused), as one of `tensor_parallel`
    workers holds them: qkv, gate_up, the embedding and the LM head cut along their rows, o and down
    along their columns, the norms whole."""
    tp = tensor_parallel
    per_layer = [((HIDDEN + 2 * KV_HEADS_DIM) // tp, HIDDEN), (HIDDEN, HIDDEN // tp), (2 * INTERMEDIATE // tp, HIDDEN),
                 (HIDDEN, INTERMEDIATE // tp), (HIDDEN,), (HIDDEN,)]
    return [(VOCAB // tp, HIDDEN)] + per_layer * layers + [(HIDDEN,), (VOCAB // tp, HIDDEN)]


def rss_bytes() -> int:
    with open("/proc/self/status") as status:
        for line in status:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) * 1024
    return 0


def meet(barrier: str | None, name: str) -> None:
    """Waits until every worker of the row has come to `name` (a file each in the barrier folder)."""
    if not barrier:
        return
    workers, rank, folder = barrier.split(":", 2)
    open(os.path.join(folder, f"{name}.{rank}"), "w").close()
    deadline = time.monotonic() + 120  # a worker that failed never comes
    while sum(entry.startswith(name + ".") for entry in os.listdir(folder)) < int(workers):
        if time.monotonic() > deadline:
            raise TimeoutError(f"the other workers never came to {name}")
        time.sleep(0.0005)


def child(row: str, cycles: int, layers: int, kv_gib: float, awake: float, barrier: str | None = None,
          tensor_parallel: int = 1) -> dict:
    """One allocator in this process: the model made under vLLM's tags, then `cycles` sleeps and wakes
    (with the other workers of the row, when `barrier` names them)."""
    import torch
    from vllm.device_allocator import get_mem_allocator_instance
    level = ROWS[row][1]
    offload = (("weights",) if level == 1 else ()) + ("runtime", "cudagraph")  # vLLM's CuMemBackend.suspend
    allocator = get_mem_allocator_instance()
    torch.cuda.init()
    before = rss_bytes()
    generator = torch.Generator(device="cuda").manual_seed(0)
    with allocator.use_memory_pool("weights"):
        weights = [torch.empty(shape, dtype=torch.bfloat16, device="cuda").normal_(0, 0.02, generator=generator)
                   for shape in shapes(layers, tensor_parallel)]
    with allocator.use_memory_pool("kv_cache"):
        per_layer = int(kv_gib * (1 << 30)) // max(layers, 1) // 2 // tensor_parallel
        kv = [torch.zeros(per_layer, dtype=torch.bfloat16, device="cuda") for _ in range(max(layers, 1))]
    sums = [w.float().sum().item() for w in weights[:8]]
    torch.cuda.synchronize()
    made = rss_bytes()
    import gc
    start = time.perf_counter()
    gc.collect()  # what a full collection costs in this process (vLLM's sleep and wake each make one)
    full_gc = time.perf_counter() - start
    sleeps, wakes, held, correct = [], [], [], True
    for cycle in range(cycles):
        torch.cuda.synchronize()
        meet(barrier, f"sleep{cycle}")
        start = time.perf_counter()
        allocator.sleep(offload_tags=offload)
        torch.cuda.synchronize()
        sleeps.append(time.perf_counter() - start)
        meet(barrier, f"wake{cycle}")
        start = time.perf_counter()
        allocator.wake_up(None)
        torch.cuda.synchronize()
        wakes.append(time.perf_counter() - start)
        time.sleep(awake)  # the engine serves between a wake and the next sleep
        held.append(rss_bytes() - before)
        if level == 1:
            correct &= [w.float().sum().item() for w in weights[:8]] == sums
    return {"row": row, "level": level, "allocator": type(allocator).__module__, "sleeps": sleeps, "wakes": wakes,
            "weights_bytes": sum(w.numel() * 2 for w in weights), "kv_bytes": sum(k.numel() * 2 for k in kv),
            "tensors": len(weights), "rss_after_model": made - before, "rss_after_wake": held, "correct": correct, "full_gc_s": full_gc}


def pinned_memcpy(layers: int, cycles: int, barrier: str | None = None, tensor_parallel: int = 1) -> dict:
    """The same weights copied to pinned host memory and back, one copy per tensor."""
    import torch
    weights = [torch.empty(shape, dtype=torch.bfloat16, device="cuda") for shape in shapes(layers, tensor_parallel)]
    host = [torch.empty(shape, dtype=torch.bfloat16, pin_memory=True) for shape in shapes(layers, tensor_parallel)]
    out, back = [], []
    for cycle in range(cycles):
        torch.cuda.synchronize()
        meet(barrier, f"out{cycle}")
        start = time.perf_counter()
        for w, h in zip(weights, host):
            h.copy_(w, non_blocking=True)
        torch.cuda.synchronize()
        out.append(time.perf_counter() - start)
        meet(barrier, f"back{cycle}")
        start = time.perf_counter()
        for w, h in zip(weights, host):
            w.copy_(h, non_blocking=True)
        torch.cuda.synchronize()
        back.append(time.perf_counter() - start)
    nbytes = sum(w.numel() * 2 for w in weights)
    return {"row": "pinned", "outs": out, "backs": back, "to_host": statistics.median(out),
            "to_device": statistics.median(back), "bytes": nbytes}


def versions() -> dict:
    import torch
    from importlib import metadata
    smi = subprocess.run(["nvidia-smi", "--query-gpu=name,driver_version", "--format=csv,noheader"],
                         capture_output=True, text=True)
    found = {"gpu_and_driver": smi.stdout.strip().splitlines()[0] if smi.stdout.strip() else "unknown",
             "torch": torch.__version__, "cuda": torch.version.cuda}
    for package in ("vllm", "uvm-cuda"):
        try:
            found[package] = metadata.version(package)
        except metadata.PackageNotFoundError:
            found[package] = "not installed"
    return found


def run_child(row: str, args) -> dict:
    """One row in a fresh process, or in --gpus processes at once ("pinned": the memcpy baseline)."""
    env = {**os.environ, **(ROWS[row][0] if row in ROWS else {})}
    command = [sys.executable, os.path.abspath(__file__), "--child", row, "--cycles", str(args.cycles),
               "--layers", str(args.layers), "--kv-gib", str(args.kv_gib), "--awake", str(args.awake)]
    if args.gpus == 1:
        done = subprocess.run(command, env=env, capture_output=True, text=True, timeout=1800)
        return result_of(row, done.returncode, done.stdout, done.stderr)
    with tempfile.TemporaryDirectory() as folder:
        workers = [subprocess.Popen(command + ["--gpus", str(args.gpus), "--barrier", f"{args.gpus}:{rank}:{folder}"],
                                    env={**env, "CUDA_VISIBLE_DEVICES": str(rank)}, stdout=subprocess.PIPE,
                                    stderr=subprocess.PIPE, text=True) for rank in range(args.gpus)]
        results = []
        for worker in workers:
            out, err = worker.communicate(timeout=1800)
            results.append(result_of(row, worker.returncode, out, err))
    failed = [r for r in results if "error" in r]
    if failed:
        return failed[0]
    joined = dict(results[0])
    joined["workers"] = results
    if row == "pinned":  # every GPU's copies at once: each cycle as long as the slowest
        joined["outs"] = [max(times) for times in zip(*(r["outs"] for r in results))]
        joined["backs"] = [max(times) for times in zip(*(r["backs"] for r in results))]
        joined["to_host"], joined["to_device"] = statistics.median(joined["outs"]), statistics.median(joined["backs"])
        joined["bytes"] = sum(r["bytes"] for r in results)
        return joined
    # The engine waits for every worker: a cycle's sleep and wake are the slowest worker's.
    joined["sleeps"] = [max(times) for times in zip(*(r["sleeps"] for r in results))]
    joined["wakes"] = [max(times) for times in zip(*(r["wakes"] for r in results))]
    joined["rss_after_wake"] = [sum(held) for held in zip(*(r["rss_after_wake"] for r in results))]
    joined["correct"] = all(r["correct"] for r in results)
    return joined


def result_of(row: str, returncode: int, stdout: str, stderr: str) -> dict:
    lines = [line for line in stdout.splitlines() if line.startswith("{")]
    if returncode != 0 or not lines:
        return {"row": row, "error": (stderr or stdout)[-2000:]}
    return json.loads(lines[-1])


def steady(values: list[float]) -> float:
    return statistics.median(values[1:]) if len(values) > 1 else values[0]


def table(results: dict, info: dict) -> list[str]:
    pinned = results.get("pinned", {})
    lines = [f"vLLM's sleep mode, {info['gpu_and_driver']}, torch {info['torch']} (CUDA {info['cuda']}), vLLM "
             f"{info['vllm']}, uvm {info['uvm-cuda']}"]
    first = next((r for r in results.values() if "sleeps" in r), None)
    if first:
        lines.append(f"{first['weights_bytes'] / (1 << 30):.2f} GiB of bf16 weights in {first['tensors']} tensors, "
                     f"{first['kv_bytes'] / (1 << 30):.2f} GiB of KV cache; {len(first['sleeps'])} cycles each")
    if info.get("gpus", 1) > 1:
        lines.append(f"tensor parallel {info['gpus']}: one worker per GPU, each with its 1/{info['gpus']} of that (the "
                     "sizes above are one worker's), sleeping and waking together; a cycle's time is the slowest "
                     "worker's, the host memory the workers' total; pinned memcpy: every worker's tensors at once, "
                     "one process per GPU (its GB/s: all of them together)")
    if pinned:
        lines.append(f"pinned memcpy of the weights: {pinned['to_host']:.3f} s to the host, {pinned['to_device']:.3f} s back "
                     f"({pinned['bytes'] / pinned['to_host'] / 1e9:.1f} / {pinned['bytes'] / pinned['to_device'] / 1e9:.1f} GB/s)")
    if first and "full_gc_s" in first:
        lines.append(f"one full gc.collect() in such a process: {first['full_gc_s']:.3f} s (vLLM's sleep and wake each make one)")
    lines += ["", "| allocator | level | first sleep | steady sleep | first wake | steady wake | host RAM held while awake | weights intact |",
              "|---|---|---|---|---|---|---|---|"]
    for row, result in results.items():
        if row == "pinned":
            continue
        name, level = row.rsplit("-", 1)
        if "error" in result:
            lines.append(f"| {LABELS[name]} | {level} | failed: {result['error'].splitlines()[-1] if result['error'] else '?'} |")
            continue
        lines.append(f"| {LABELS[name]} | {level} | {result['sleeps'][0]:.3f} s | {steady(result['sleeps']):.3f} s | "
                     f"{result['wakes'][0]:.3f} s | {steady(result['wakes']):.3f} s | "
                     f"{max(result['rss_after_wake'][1:] or result['rss_after_wake']) / (1 << 30):.2f} GiB | "
                     f"{'yes' if result['correct'] else 'NO'} |")
    lines += ["", "Ratios (vLLM's time / uvm's: above 1 is uvm faster), against the goals:"]
    for level, goals in ((1, [("uvm", "first sleep", 20.0), ("uvm", "steady sleep", 1.6), ("uvm", "steady wake", 1.6),
                               ("uvm-compressed", "steady sleep", 2.3), ("uvm-compressed", "steady wake", 2.3),
                               ("uvm-given-back", "steady sleep", 1.0), ("uvm-given-back", "steady wake", 1.0)]),
                         (2, [("uvm", "steady sleep", 1.0), ("uvm", "steady wake", 1.0)])):
        base = results.get(f"vllm-{level}", {})
        for name, what, goal in goals:
            ours = results.get(f"{name}-{level}", {})
            if "sleeps" not in base or "sleeps" not in ours:
                continue
            pick = {"first sleep": lambda r: r["sleeps"][0], "steady sleep": lambda r: steady(r["sleeps"]),
                    "steady wake": lambda r: steady(r["wakes"])}[what]
            ratio = pick(base) / pick(ours)
            lines.append(f"- level {level}, {LABELS[name]}, {what}: {ratio:.2f}× (goal ≥ {goal}×: "
                         f"{'met' if ratio >= goal else 'NOT met'})")
    kept = results.get("uvm-1", {})
    if pinned and "sleeps" in kept:
        lines.append(f"- uvm (default), steady sleep / pinned memcpy to the host: {steady(kept['sleeps']) / pinned['to_host']:.2f}×; "
                     f"steady wake / pinned memcpy back: {steady(kept['wakes']) / pinned['to_device']:.2f}× (goal ≤ 1.10×)")
    return lines


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--cycles", type=int, default=4)
    parser.add_argument("--layers", type=int, default=32, help="decoder layers (32: an 8B model)")
    parser.add_argument("--kv-gib", type=float, default=4.0)
    parser.add_argument("--awake", type=float, default=1.0, help="seconds awake between a wake and the next sleep")
    parser.add_argument("--gpus", type=int, default=1, help="workers per row, one per GPU, sleeping together")
    parser.add_argument("--rows", default=",".join(ROWS), help=f"a comma-separated choice of {', '.join(ROWS)}")
    parser.add_argument("--out", default=os.environ.get("OUT", "bench-out") + "/vllm")
    parser.add_argument("--child", help=argparse.SUPPRESS)
    parser.add_argument("--barrier", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        if args.child == "pinned":
            print(json.dumps(pinned_memcpy(args.layers, args.cycles, args.barrier, args.gpus)))
        else:
            print(json.dumps(child(args.child, args.cycles, args.layers, args.kv_gib, args.awake, args.barrier, args.gpus)))
        return 0
    if args.gpus < 1:
        parser.error(f"--gpus {args.gpus}: at least 1")
    rows = [row.strip() for row in args.rows.split(",") if row.strip()]
    unknown = [row for row in rows if row not in ROWS]
    if unknown:
        parser.error(f"--rows names {unknown}: choose from {', '.join(ROWS)}")
    os.makedirs(args.out, exist_ok=True)
    info = versions()
    info["gpus"] = args.gpus
    results = {}
    for row in rows:
        results[row] = run_child(row, args)
        print(f"{row}: {json.dumps(results[row])[:300]}", flush=True)
    results["pinned"] = pinned_memcpy(args.layers, args.cycles) if args.gpus == 1 else run_child("pinned", args)
    lines = table(results, info)
    print("\n".join(lines))
    with open(os.path.join(args.out, "results.json"), "w") as out:
        json.dump({"versions": info, "arguments": vars(args), "results": results}, out, indent=1)
    with open(os.path.join(args.out, "results.md"), "w") as out:
        out.write("\n".join(lines) + "\n")
    failed = [row for row, result in results.items() if "error" in result or result.get("correct") is False]
    if failed:
        print(f"FAIL: {failed}")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
