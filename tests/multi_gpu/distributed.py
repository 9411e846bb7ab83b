"""Under torchrun (2 ranks, one GPU each): ranks share one compile cache (one build of each library;
the other rank waits on the lock), each rank offloads and onloads a model in its uvm pool, NCCL all_reduce runs on
pool tensors, and both ranks moving at once is timed against one alone (a bench row). With
--fail-rank R, rank R cannot build, and with sync_ranks=True every rank must raise the same error."""
import argparse
import json
import os
import sys
import time
from pathlib import Path

import torch
import torch.distributed as dist

import uvm

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "bench"))
from offload_bench import environment  # noqa: E402  (device, driver, torch and CUDA versions)

GiB = 1 << 30
parser = argparse.ArgumentParser()
parser.add_argument("--fail-rank", type=int, default=None)
parser.add_argument("--model-gib", type=float, default=4.0)
args = parser.parse_args()

rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
torch.cuda.set_device(int(os.environ["LOCAL_RANK"]))
dist.init_process_group("nccl")

if args.fail_rank is not None:
    if rank == args.fail_rank:
        os.environ["UVM_CXX"] = "/nonexistent/c++"  # this rank's build fails
    try:
        uvm.create_unified_mempool(sync_ranks=True)
        message = "no error"
    except uvm.UnifiedMemoryUnsupportedError as error:
        message = str(error)
    messages = [None] * world
    dist.all_gather_object(messages, message)
    assert len(set(messages)) == 1, messages
    assert f"rank {args.fail_rank}:" in messages[0] and "/nonexistent/c++" in messages[0], messages[0]
    if rank == 0:
        print(f"ok: every rank raised: {messages[0]}")
    dist.destroy_process_group()
    raise SystemExit(0)

pool = uvm.create_unified_mempool(sync_ranks=True)
dist.barrier()
# One line per real build, naming the library's cache key: each library (libuvm.so, and the torch
# block hooks a pool loads) built once, whichever rank got the lock first.
log = os.path.join(os.environ["UVM_CACHE_DIR"], "builds.log")
keys = [line.split()[0] for line in open(log).read().splitlines()] if os.path.exists(log) else []
assert keys and len(keys) == len(set(keys)), \
    f"{len(keys)} builds of {len(set(keys))} libraries for {world} ranks sharing one cache: {keys}"

total = torch.cuda.get_device_properties(0).total_memory
assert args.model_gib * GiB <= 0.25 * total, "model above 25% of the card"
with torch.cuda.use_mem_pool(pool):
    # 256 tensors of mixed sizes, like a model's parameters.
    sizes = [int(args.model_gib * GiB / 256 * f) // 2 for f in (0.5, 1.5) * 128]
    weights = [torch.full((n,), float(rank + i % 7), device="cuda", dtype=torch.bfloat16) for i, n in enumerate(sizes)]
    shared = torch.full((1 << 20,), float(rank + 1), device="cuda")
nbytes = sum(w.numel() * 2 for w in weights)


def cycle() -> tuple[float, float]:
    torch.cuda.synchronize()
    start = time.perf_counter()
    uvm.offload(weights)
    torch.cuda.synchronize()
    middle = time.perf_counter()
    uvm.onload(weights)
    torch.cuda.synchronize()
    return middle - start, time.perf_counter() - middle


cycle()  # warm-up: pinned staging is allocated here
rows = {}
for mode in ("rank 0 alone", "both ranks at once"):
    times = []
    for _ in range(3):
        dist.barrier()
        if mode == "both ranks at once" or rank == 0:
            times.append(cycle())
        dist.barrier()
    if times:
        off = min(t[0] for t in times)
        on = min(t[1] for t in times)
        rows[mode] = (off, on)
    for i, w in enumerate(weights):
        assert torch.equal(w, torch.full_like(w, float(rank + i % 7))), f"rank {rank}: tensor {i} changed"

# NCCL all_reduce on tensors that live in the uvm pool, before and after an offload cycle.
dist.all_reduce(shared)
assert torch.equal(shared, torch.full_like(shared, float(sum(r + 1 for r in range(world)))))
uvm.offload(shared)
uvm.onload(shared)
dist.all_reduce(shared)
assert torch.equal(shared, torch.full_like(shared, float(world * sum(r + 1 for r in range(world)))))

both = [None] * world
dist.all_gather_object(both, rows.get("both ranks at once"))
if rank == 0:
    alone_off, alone_on = rows["rank 0 alone"]
    slowest_off = max(b[0] for b in both)
    slowest_on = max(b[1] for b in both)
    result = {
        **environment(), "bytes_per_rank": nbytes, "tensors_per_rank": len(weights), "ranks": world,
        "one_gpu_offload_gbps": round(nbytes / alone_off / 1e9, 1), "one_gpu_onload_gbps": round(nbytes / alone_on / 1e9, 1),
        "aggregate_offload_gbps": round(world * nbytes / slowest_off / 1e9, 1),
        "aggregate_onload_gbps": round(world * nbytes / slowest_on / 1e9, 1)}
    print(json.dumps(result))
    print(f"| {world} ranks at once | offload {result['aggregate_offload_gbps']} GB/s aggregate "
          f"(one GPU alone {result['one_gpu_offload_gbps']}) | onload {result['aggregate_onload_gbps']} GB/s aggregate "
          f"(one GPU alone {result['one_gpu_onload_gbps']}) |")
    out = os.environ.get("UVM_BENCH_OUT")
    if out:
        with open(os.path.join(out, "multi_gpu.json"), "w") as f:
            json.dump(result, f, indent=1)
    print(f"ok: {world} ranks, {len(keys)} libraries built once each, offload/onload exact, NCCL all_reduce on pool tensors")
dist.destroy_process_group()
