"""A node's sleep and wake: every GPU of the node pausing and resuming its weights at once, as an RL
run with one engine per GPU (or one engine across them) does, against one GPU alone and against the
node's ceiling.

Each rank (torchrun, one per GPU) holds --gib GiB of bf16 weights in 64 tensors and a plain copy of
them to check against, and --kv-gib GiB of KV cache, as an engine does. It loads the weights as a
checkpoint is loaded: copied in from pageable host memory (the load is timed), then the engine's
warm-up (--warmup seconds, idle) comes before the first pause. One cycle: every rank waits at a
barrier, pauses its weights (the CPU backup retained), waits at a barrier, resumes them; the bytes
must be identical after every resume. The KV cache sleeps with them with no backup (its memory given
back, its contents not kept, as SGLang's kv_cache tag); the GB/s count the weights' bytes, which are
what crosses the link. Each rank times its own call from the barrier; the node's time is the slowest
rank's, so the aggregate GB/s is the ranks' bytes over it. The first cycle is reported apart from
the steady ones: its host memory is pinned fresh, by the pause itself or, for uvm, ahead of it while
the model loads (uvm_prepare_pause, which uvm.memory_saver starts at a region's end; the
"(no prepare)" row turns it off).

Methods, each in a torchrun of its own, with every GPU, then with GPU 0 alone (--counts picks):
  pinned memcpy              the ceiling: each rank copies its weights to pinned host memory and
                             back (cudaMemcpyAsync); all ranks at once is what the host allows.
                             Its KV cache is plain memory and stays
  uvm memory_saver           uvm.memory_saver, hook mode "torch", retain_cpu_backup=True
  uvm memory_saver           the same with UVM_PREPARE_PAUSE=0: the first pause pins its own memory
  (no prepare)
  uvm memory_saver           the same with UVM_ONLOAD_COPY=engine: the resume copies with the copy
  (engine)                   engines only, never uvm's SM copy kernel
  uvm memory_saver           the same with UVM_COMPRESS_BACKUPS=1: the backups are compressed on the
  (compressed)               GPU (the GB/s still count the weights' bytes; the stored bytes are recorded)
  torch_memory_saver         the original 0.0.10 (when installed), the same settings
  uvm memory_saver (preload) the same in hook mode "preload": torchrun and its ranks are started
  torch_memory_saver         inside the library's configure_subprocess()
  (preload)

    python bench/node_bench.py [--counts 4,2,1] [--gib 8] [--kv-gib 4] [--cycles 4] [--methods ...] [--out DIR]

Writes results.json and results.md to --out. No managed memory: the weights are releasable (the
savers) or plain (pinned memcpy).
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time

METHODS = ["pinned memcpy", "uvm memory_saver", "uvm memory_saver (no prepare)", "uvm memory_saver (engine)",
           "uvm memory_saver (compressed)", "torch_memory_saver",
           "uvm memory_saver (preload)", "torch_memory_saver (preload)"]
TENSORS = 64


# The environment a row's ranks run with, beyond the machine's.
ROW_ENVIRONMENT = {"(no prepare)": {"UVM_PREPARE_PAUSE": "0"}, "(engine)": {"UVM_ONLOAD_COPY": "engine"},
                   "(compressed)": {"UVM_COMPRESS_BACKUPS": "1"}}
# The weights' scales, tensor by tensor, as a Llama-style model's (projections, norms, embeddings).
SCALES = [0.02, 0.02, 0.02, 1.0, 0.02, 0.05, 0.002, 0.02]


def worker(method: str, gib: float, kv_gib: float, cycles: int, result_path: str, warmup_s: float) -> None:
    """One rank: build, then `cycles` pause/resume cycles timed between barriers."""
    import torch
    import torch.distributed as dist

    from rl_bench import saver_of  # hook mode and retain_cpu_backup set as the RL bench's rows

    rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    torch.cuda.set_device(int(os.environ["LOCAL_RANK"]))
    dist.init_process_group("gloo")  # barriers and the gather only: no GPU memory of NCCL's
    saver = saver_of(method)
    numel = int(gib * (1 << 30)) // 2 // TENSORS
    kv_numel = int(kv_gib * (1 << 30)) // 2

    # The checkpoint, in pageable host memory (as read from a file in the page cache): each
    # tensor's values differ, so that a resume that mixed them up would show.
    checkpoint = torch.empty(TENSORS, numel, dtype=torch.bfloat16)
    for i in range(TENSORS):
        checkpoint[i].fill_(float((i * 7 + rank * 13) % 61 + 1) / 64)

    def make():
        start = time.perf_counter()
        made = [torch.empty(numel, dtype=torch.bfloat16, device="cuda") for _ in range(TENSORS)]
        for i, w in enumerate(made):
            w.copy_(checkpoint[i])
        torch.cuda.synchronize()
        load_s = time.perf_counter() - start
        # Then values as trained weights hold them (the compressed row's stored size depends on them),
        # drawn on the GPU: random at each tensor's scale, different on every rank.
        generator = torch.Generator(device="cuda").manual_seed(rank)
        for i, w in enumerate(made):
            w.normal_(0.0, SCALES[i % len(SCALES)], generator=generator)
        torch.cuda.synchronize()
        return made, load_s

    if saver is None:
        weights, load_s = make()
        kv_cache = torch.ones(kv_numel, dtype=torch.bfloat16, device="cuda")
        host = [torch.empty_like(w, device="cpu", pin_memory=True) for w in weights]

        def pause():
            for h, w in zip(host, weights):
                h.copy_(w, non_blocking=True)

        def resume():
            for h, w in zip(host, weights):
                w.copy_(h, non_blocking=True)
    else:
        with saver.region(tag="weights", enable_cpu_backup=True):
            weights, load_s = make()
        with saver.region(tag="kv_cache", enable_cpu_backup=False):
            kv_cache = torch.ones(kv_numel, dtype=torch.bfloat16, device="cuda")

        def pause():
            saver.pause("weights")
            saver.pause("kv_cache")

        def resume():
            saver.resume("weights")
            saver.resume("kv_cache")
    del checkpoint
    reference = [w.clone() for w in weights]  # plain memory, outside any region
    nbytes = sum(w.numel() * w.element_size() for w in weights)
    torch.cuda.synchronize()
    time.sleep(warmup_s)  # the engine's warm-up before its first sleep, the same for every method

    def timed(call) -> float:
        dist.barrier()
        start = time.perf_counter()
        call()
        torch.cuda.synchronize()
        return time.perf_counter() - start

    rows = []
    for cycle in range(cycles):
        pause_s = timed(pause)
        resume_s = timed(resume)
        identical = all(torch.equal(w, r) for w, r in zip(weights, reference))
        rows.append({"cycle": cycle, "pause_s": pause_s, "resume_s": resume_s, "identical": identical})
    gathered = [None] * world
    stored = compressed_bytes() if method.startswith("uvm") else None  # the retained backups, after the cycles
    dist.all_gather_object(gathered, {"rank": rank, "device": torch.cuda.get_device_name(), "bytes": nbytes, "cycles": rows,
                                      "load_s": load_s, "kv_cache_bytes": kv_cache.numel() * kv_cache.element_size(),
                                      "compressed": stored})
    if rank == 0:
        with open(result_path, "w") as f:
            json.dump({"method": method, "ranks": gathered}, f)
    dist.barrier()
    dist.destroy_process_group()
    # torch_memory_saver's torch mode aborts when its pools are destroyed at exit, which says
    # nothing about the cycles (as in rl_bench.py).
    os._exit(0)


def compressed_bytes() -> dict:
    """The raw and stored bytes of this process's compressed backups (uvm_get_compressed_copies)."""
    import ctypes

    from uvm import _lib
    raw, stored = ctypes.c_size_t(), ctypes.c_size_t()
    _lib.check(_lib.library().uvm_get_compressed_copies(_lib.UVM_ANY_DEVICE, b"weights", ctypes.byref(raw),
                                                        ctypes.byref(stored)))
    return {"raw": raw.value, "stored": stored.value}


def summarize(result: dict) -> dict:
    """Aggregate and per-rank GB/s, first cycle and steady (medians of the rest)."""
    ranks = result["ranks"]
    total = sum(r["bytes"] for r in ranks)
    cycles = len(ranks[0]["cycles"])

    def node_s(cycle: int, phase: str) -> float:
        return max(r["cycles"][cycle][f"{phase}_s"] for r in ranks)

    def gbps(nbytes: int, seconds: float) -> float:
        return nbytes / seconds / 1e9

    out = {"method": result["method"], "ranks": len(ranks), "bytes_per_rank": ranks[0]["bytes"], "device": ranks[0]["device"],
           "kv_cache_bytes_per_rank": ranks[0].get("kv_cache_bytes", 0),
           "identical": all(c["identical"] for r in ranks for c in r["cycles"]),
           "load_s": max(r.get("load_s", 0.0) for r in ranks)}
    coded = [r["compressed"] for r in ranks if r.get("compressed") and r["compressed"]["raw"]]
    if coded:  # the host memory a rank's backup takes, over its weights
        out["stored_fraction"] = sum(c["stored"] for c in coded) / sum(c["raw"] for c in coded)
    for phase in ("pause", "resume"):
        steady = [node_s(c, phase) for c in range(1, cycles)] or [node_s(0, phase)]
        out[f"first_{phase}_s"] = node_s(0, phase)
        out[f"steady_{phase}_s"] = statistics.median(steady)
        out[f"first_{phase}_gbps"] = gbps(total, out[f"first_{phase}_s"])
        out[f"steady_{phase}_gbps"] = gbps(total, out[f"steady_{phase}_s"])
        per_rank = [statistics.median(c[f"{phase}_s"] for c in r["cycles"][1:] or r["cycles"]) for r in ranks]
        out[f"steady_{phase}_gbps_per_rank"] = [gbps(r["bytes"], s) for r, s in zip(ranks, per_rank)]
    return out


def stored_note(summary: dict) -> str:
    """What a compressed row's backups take, over the weights."""
    return f" (stored {summary['stored_fraction']:.3f})" if "stored_fraction" in summary else ""


def markdown(summaries: list[dict], env: dict, gib: float, kv_gib: float) -> str:
    """One row per method and rank count, each beside the pinned memcpy ceiling of the same count."""
    ceiling = {s["ranks"]: s for s in summaries if s["method"] == "pinned memcpy"}
    lines = [f"{gib:g} GiB of bf16 weights per rank, retained CPU backups, and {kv_gib:g} GiB of KV cache with none; "
             f"{env.get('device', '?')}, driver "
             f"{env.get('driver', '?')}, torch {env.get('torch', '?')}, torch_memory_saver "
             f"{env.get('torch_memory_saver') or 'not installed'}", "",
             "| method | GPUs | steady pause GB/s | steady resume GB/s | pause / ceiling | resume / ceiling | "
             "first pause GB/s | first pause / steady | load s | bytes identical |",
             "|---|---|---|---|---|---|---|---|---|---|"]
    for s in sorted(summaries, key=lambda s: (-s["ranks"], METHODS.index(s["method"]))):
        top = ceiling.get(s["ranks"])
        lines.append(
            f"| {s['method']}{stored_note(s)} | {s['ranks']} | {s['steady_pause_gbps']:.1f} | {s['steady_resume_gbps']:.1f} | "
            + (f"{s['steady_pause_gbps'] / top['steady_pause_gbps']:.0%} | {s['steady_resume_gbps'] / top['steady_resume_gbps']:.0%} | "
               if top else "| | ")
            + f"{s['first_pause_gbps']:.1f} | {s['first_pause_s'] / s['steady_pause_s']:.2f}× | {s['load_s']:.2f} | "
            + ("yes" if s["identical"] else "NO") + " |")
    return "\n".join(lines)


def launch(method: str, gpus: int, gib: float, kv_gib: float, cycles: int, result_path: str,
           warmup_s: float) -> subprocess.CompletedProcess:
    """torchrun with `gpus` ranks of this script's worker, inside the method's configure_subprocess()
    for a preload row."""
    from rl_bench import child_environment
    with child_environment(method):  # the environment is read inside it: a preload row's LD_PRELOAD is set there
        env = dict(os.environ)
        for marker, settings in ROW_ENVIRONMENT.items():
            if marker in method:
                env.update(settings)
        return subprocess.run([sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc-per-node={gpus}",
                               os.path.abspath(__file__), "--worker", method, "--gib", str(gib), "--kv-gib", str(kv_gib),
                               "--cycles", str(cycles),
                               "--result", result_path, "--warmup", str(warmup_s)],
                              capture_output=True, text=True, timeout=600, env=env)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--counts", default="", help="how many GPUs each run pauses at once, e.g. 4,2,1 (default: all the node has, then 1)")
    parser.add_argument("--gib", type=float, default=8.0, help="GiB of weights per rank")
    parser.add_argument("--kv-gib", type=float, default=4.0, help="GiB of KV cache per rank (paused with no backup)")
    parser.add_argument("--cycles", type=int, default=4, help="cycles per run (the first is reported apart)")
    parser.add_argument("--warmup", type=float, default=3.0, help="idle seconds between the load and the first pause")
    parser.add_argument("--methods", default=",".join(METHODS))
    parser.add_argument("--out", default="bench-out/node")
    parser.add_argument("--worker", help=argparse.SUPPRESS)
    parser.add_argument("--result", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.worker:
        worker(args.worker, args.gib, args.kv_gib, args.cycles, args.result, args.warmup)
        return 0
    if args.cycles < 2:
        parser.error("--cycles must be at least 2: the first cycle is reported apart from the steady ones")
    from rl_bench import environment, selected_methods  # one record of the machine and versions
    methods = selected_methods(parser, args.methods, METHODS)

    import torch
    present = torch.cuda.device_count()
    if present < 1:
        print("node bench: no CUDA device is present", file=sys.stderr)
        return 1
    counts = sorted({int(c) for c in args.counts.split(",") if c.strip()} or {present, 1}, reverse=True)
    if counts[0] > present:
        parser.error(f"--counts asks for {counts[0]} GPUs; this node has {present}")
    env = environment()
    os.makedirs(args.out, exist_ok=True)
    results, failures = [], []

    def write(summaries: list[dict]) -> None:  # after every run, so that a run cut short keeps the rest
        with open(os.path.join(args.out, "results.json"), "w") as f:
            json.dump({"environment": env, "gib_per_rank": args.gib, "kv_cache_gib_per_rank": args.kv_gib, "cycles": args.cycles, "warmup_s": args.warmup, "results": results,
                       "summaries": summaries, "failures": failures}, f, indent=1)

    for count in counts:
        for method in methods:
            path = os.path.join(args.out, f"run-{count}.json")
            proc = launch(method, count, args.gib, args.kv_gib, args.cycles, path, args.warmup)
            if proc.returncode != 0 or not os.path.exists(path):
                failures.append(f"{method} / {count} GPUs: exit {proc.returncode}\n{proc.stderr[-3000:]}")
                print(f"FAILED {method} / {count} GPUs:\n{proc.stderr[-3000:]}", flush=True)
                continue
            with open(path) as f:
                result = json.load(f)
            os.remove(path)
            results.append(result)
            s = summarize(result)
            print(f"{method:30} {count} GPUs: pause {s['steady_pause_gbps']:6.1f} GB/s, resume {s['steady_resume_gbps']:6.1f} "
                  f"GB/s (first pause {s['first_pause_gbps']:.1f}), identical {s['identical']}", flush=True)
            write([summarize(r) for r in results])
    summaries = [summarize(r) for r in results]
    write(summaries)
    table = markdown(summaries, env, args.gib, args.kv_gib)
    with open(os.path.join(args.out, "results.md"), "w") as f:
        f.write(table + "\n")
    print(table)
    differ = [f"{s['method']} / {s['ranks']} GPUs" for s in summaries if not s["identical"]]
    if differ:
        print(f"BYTES DIFFER after a resume: {differ}")
    return 1 if failures or differ else 0


if __name__ == "__main__":
    sys.exit(main())
