"""Under torchrun (2 ranks, one GPU each): NCCL collectives on pausable memory across pause, a
training-like claim of the freed memory, and resume (issue 60, item 3).

    torchrun --standalone --nproc-per-node 2 tests/multi_gpu/nccl_pause.py MEMORY OUT.json

MEMORY: uvm-region (uvm.memory_saver, hook mode torch, CPU backup), uvm-region-registered (the
same, its tag's pools registered with NCCL through uvm.nccl.register("nccl")), uvm-pool (a uvm releasable pool
registered with NCCL through uvm.nccl.register, which lifts the registration for each offload),
uvm-pool-forced (the same, registered although every rank is on this node, where uvm.nccl
registers nothing: what NCCL then keeps), uvm-pool-unhooked (the same pool registered with
ProcessGroupNCCL.register_mem_pool directly, which
uvm does not see: what a pause does to NCCL's mappings of it), tms-region (torch_memory_saver
itself, hook mode torch, CPU backup: the original, beside uvm in the same call) or plain (torch's
own memory, no pause: the reference). Buffers of 64 MiB per rank hold integers in float32, so every
sum is exact and results compare bit for bit. Each run: all_reduce, all_gather_into_tensor,
reduce_scatter_tensor and send/recv into the buffers, eager, and an all_reduce and an out-of-place
all_gather captured in a CUDA graph (NCCL registers captured buffers: NCCL_GRAPH_REGISTER); then twice: pause, a plain tensor
claims the freed memory and is written, resume, every operation again and the graph replayed. The
results are written as checksums (sum and a strided fingerprint) per step, for the runner to compare
with the plain run's; a hang ends at the process group's timeout."""
import datetime
import hashlib
import json
import os
import sys
import threading

import torch
import torch.distributed as dist

MiB = 1 << 20
ELEMENTS = 16 * MiB  # 64 MiB of float32 per buffer
memory, out = sys.argv[1], sys.argv[2]
rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
device = torch.device("cuda", int(os.environ["LOCAL_RANK"]))
torch.cuda.set_device(device)
dist.init_process_group("nccl", timeout=datetime.timedelta(seconds=90), device_id=device)


def saver_of(name: str):
    if name.startswith("uvm-region"):
        from uvm.memory_saver import torch_memory_saver as saver
    else:
        from torch_memory_saver import torch_memory_saver as saver
    saver.hook_mode = "torch"
    return saver


saver = saver_of(memory) if "-region" in memory else None
pool = None
if memory.startswith("uvm-pool"):
    import uvm
    import uvm.nccl
    pool = uvm.create_releasable_mempool()


def allocate() -> dict:
    return {"input": torch.empty(ELEMENTS, device=device), "reduced": torch.empty(ELEMENTS, device=device),
            "gathered": torch.empty(world * ELEMENTS, device=device),
            "scattered": torch.empty(ELEMENTS // world, device=device),
            "sent": torch.empty(ELEMENTS, device=device), "received": torch.empty(ELEMENTS, device=device),
            "graphed": torch.empty(ELEMENTS, device=device), "graph_gathered": torch.empty(world * ELEMENTS, device=device)}


if saver is not None:
    with saver.region("nccl", enable_cpu_backup=True):
        buffers = allocate()
elif pool is not None:
    with torch.cuda.use_mem_pool(pool):
        buffers = allocate()
else:
    buffers = allocate()
if memory == "uvm-pool":  # registered through uvm: lifted before each offload, restored after the onload
    uvm.nccl.register(pool)  # on one node: nothing registered (uvm.nccl says why)
elif memory == "uvm-pool-forced":  # as across nodes: registered, and lifted for each offload
    os.environ.pop("LOCAL_WORLD_SIZE")
    uvm.nccl.register(pool)
elif memory == "uvm-region-registered":  # the region's pools, by their tag: lifted for each pause
    import uvm.nccl
    uvm.nccl.register("nccl")
elif memory == "uvm-pool-unhooked":  # registered behind uvm's back: what a pause does to NCCL's mappings
    dist.distributed_c10d._get_default_group()._get_backend(device).register_mem_pool(pool)

index = torch.arange(ELEMENTS, device=device, dtype=torch.int64)
values = ((index * 7 + rank * 13) % 1021).to(torch.float32)  # exact in float32, and in their sums


def fill() -> None:
    buffers["input"].copy_(values)
    buffers["sent"].copy_(values + 1)
    for name in ("reduced", "gathered", "scattered", "received"):
        buffers[name].zero_()


def eager() -> None:
    buffers["reduced"].copy_(buffers["input"])
    dist.all_reduce(buffers["reduced"])
    dist.all_gather_into_tensor(buffers["gathered"], buffers["input"])
    dist.reduce_scatter_tensor(buffers["scattered"], buffers["gathered"][:ELEMENTS])
    peer = (rank + 1) % world
    if rank % 2 == 0:  # pairs: even ranks send first
        dist.send(buffers["sent"], peer)
        dist.recv(buffers["received"], (rank - 1) % world)
    else:
        dist.recv(buffers["received"], (rank - 1) % world)
        dist.send(buffers["sent"], peer)


def checksum(tensor: torch.Tensor) -> str:
    return hashlib.sha256(tensor.cpu().numpy().tobytes()).hexdigest()[:16]


def results() -> dict:
    torch.cuda.synchronize()
    return {name: checksum(buffers[name])
            for name in ("input", "reduced", "gathered", "scattered", "received", "graphed", "graph_gathered")}


fill()
eager()
# Capture, as a serving engine's graph runner does: warm up on a side stream, then capture.
stream = torch.cuda.Stream()
stream.wait_stream(torch.cuda.current_stream())
with torch.cuda.stream(stream):
    dist.all_reduce(buffers["graphed"])
    dist.all_gather_into_tensor(buffers["graph_gathered"], buffers["graphed"])
torch.cuda.current_stream().wait_stream(stream)
graph = torch.cuda.CUDAGraph()
# An in-place all_reduce, and an out-of-place all_gather: the zero-copy kind, whose buffers NCCL
# registers at capture (NCCL_GRAPH_REGISTER, on by default) and maps in the peer's process.
with torch.cuda.graph(graph, stream=stream):
    dist.all_reduce(buffers["graphed"])
    dist.all_gather_into_tensor(buffers["graph_gathered"], buffers["graphed"])


def replay() -> None:
    buffers["graphed"].copy_(values * 2)
    buffers["graph_gathered"].zero_()
    graph.replay()


replay()
steps = [results()]
for cycle in range(2):
    torch.cuda.synchronize()
    dist.barrier()
    free_before = torch.cuda.mem_get_info(device)[0]
    if saver is not None:
        saver.pause("nccl")
    elif pool is not None:
        uvm.offload(pool)
    freed = torch.cuda.mem_get_info(device)[0] - free_before
    # The training-like step: plain tensors in the freed memory, written, then gone.
    claim = torch.full((max(int(0.9 * freed), MiB) // 4,), 3.0, device=device)
    claim.mul_(2)
    del claim
    torch.cuda.empty_cache()
    if saver is not None:
        saver.resume("nccl")
    elif pool is not None:
        uvm.onload(pool)
    kept = checksum(buffers["input"]) == checksum(values)
    fill()
    eager()
    replay()
    step = results()
    step.update({"freed_bytes": freed, "input_kept": kept})
    steps.append(step)
    dist.barrier()

with open(f"{out}.rank{rank}", "w") as file:
    json.dump({"memory": memory, "rank": rank, "steps": steps, "nccl": ".".join(map(str, torch.cuda.nccl.version())),
               "torch": torch.__version__, "device": torch.cuda.get_device_name(device)}, file)
# The graph goes first: NCCL deregisters its buffers when it is destroyed. The process group's
# teardown after a captured collective hung for 240 s on torch's own memory too (2×H100, torch 2.11,
# NCCL 2.28.9; pytorch/pytorch#115388, open): it is given 30 s, said if it runs past them, and the
# process ends either way; the results are written above.
graph.reset()
torch.cuda.synchronize()
dist.barrier()
teardown = threading.Thread(target=dist.destroy_process_group, daemon=True)
teardown.start()
teardown.join(30)
if teardown.is_alive():
    print(f"rank {rank}: destroy_process_group still running after 30 s; exiting without it", flush=True)
sys.stdout.flush()
os._exit(0)
