"""GPU: uvm.offload / uvm.onload / uvm.discard on torch objects. Needs torch with CUDA and GPU 0
(skipped with the reason otherwise). Managed memory stays far below 25 % of the card: the largest
model here is 1 GiB."""
import gc
import json
import sys

import pytest
from conftest import UVM_PATH, python

sys.path.insert(0, str(UVM_PATH))
import uvm  # noqa: E402

torch = pytest.importorskip("torch", reason="torch is not installed here")
if not torch.cuda.is_available():
    pytest.skip("no CUDA device visible to torch", allow_module_level=True)

MiB = 1 << 20
STRATEGIES = ["auto", "migrate", "staged"]


def small_model(hidden=512, layers=8):
    blocks = []
    for _ in range(layers):
        blocks += [torch.nn.Linear(hidden, 3 * hidden, device="cuda", dtype=torch.bfloat16),
                   torch.nn.Linear(3 * hidden, hidden, device="cuda", dtype=torch.bfloat16),
                   torch.nn.LayerNorm(hidden, device="cuda", dtype=torch.bfloat16)]
    model = torch.nn.Sequential(*blocks)
    model.register_buffer("steps", torch.arange(1000, device="cuda"))
    return model


def snapshot(model):
    return [t.detach().clone() for t in list(model.parameters()) + list(model.buffers())]


def same(model, reference) -> bool:
    return all(torch.equal(a, b) for a, b in zip(list(model.parameters()) + list(model.buffers()), reference))


@pytest.mark.parametrize("strategy", STRATEGIES)
def test_fifty_cycles_keep_every_bit_and_the_graph_replays(strategy):
    pool = uvm.create_unified_mempool()
    with torch.cuda.use_mem_pool(pool):
        model = small_model()
    reference = snapshot(model)
    pointers = [p.data_ptr() for p in model.parameters()]
    x = torch.randn(16, 512, device="cuda", dtype=torch.bfloat16)
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        model(x)  # warm-up before capture
    torch.cuda.current_stream().wait_stream(stream)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        y = model(x)
    graph.replay()
    expected = y.clone()
    for cycle in range(50):
        moved = uvm.offload(model, strategy=strategy)
        assert moved == sum(t.numel() * t.element_size() for t in list(model.parameters()) + list(model.buffers()))
        torch.cuda.synchronize()
        if cycle == 0:
            assert uvm.residency()["host_bytes"] >= moved
        uvm.onload(model)
        graph.replay()
        torch.cuda.synchronize()
        assert torch.equal(y, expected), f"graph replay differs after cycle {cycle}"
        assert same(model, reference), f"data differs after cycle {cycle}"
    assert [p.data_ptr() for p in model.parameters()] == pointers
    del model, graph, y, expected, reference
    gc.collect()
    torch.cuda.empty_cache()


def test_a_migrate_cycle_after_a_staged_one_keeps_the_data():
    """A staged onload must leave no page the driver still counts as discarded: a prefetch to the CPU
    drops such pages (they come back as zeros)."""
    pool = uvm.create_unified_mempool()
    with torch.cuda.use_mem_pool(pool):
        model = small_model(hidden=1024, layers=16)  # about 200 MiB: several onload chunks
    reference = snapshot(model)
    for cycle in range(3):
        for strategy in ("staged", "migrate", "staged", "auto"):
            uvm.offload(model, strategy=strategy)
            torch.cuda.synchronize()
            uvm.onload(model)
            torch.cuda.synchronize()
            assert same(model, reference), f"data differs after a {strategy} cycle (round {cycle})"
    del model, reference
    gc.collect()
    torch.cuda.empty_cache()


@pytest.mark.parametrize("strategy", ["migrate", "staged"])
def test_offloaded_memory_is_reclaimed_and_onload_restores_it_after(strategy):
    pool = uvm.create_unified_mempool()
    with torch.cuda.use_mem_pool(pool):
        weights = [torch.full((256 * MiB // 2,), float(i), device="cuda", dtype=torch.bfloat16) for i in range(4)]
    offloaded = uvm.offload(weights, strategy=strategy)
    torch.cuda.synchronize()
    free, _ = torch.cuda.mem_get_info()
    claim = torch.empty(free + int(0.95 * offloaded), dtype=torch.uint8, device="cuda")
    claim.fill_(7)
    torch.cuda.synchronize()
    del claim
    torch.cuda.empty_cache()
    uvm.onload(weights)
    torch.cuda.synchronize()
    for i, w in enumerate(weights):
        assert torch.equal(w, torch.full_like(w, float(i)))
    del weights
    gc.collect()
    torch.cuda.empty_cache()


def test_tags_offload_weights_and_discard_the_kv_cache():
    weights_pool, kv_pool = uvm.create_unified_mempool(), uvm.create_unified_mempool()
    with uvm.tag("weights"), torch.cuda.use_mem_pool(weights_pool):
        weights = torch.arange(32 * MiB // 4, device="cuda", dtype=torch.float32)
    with uvm.tag("kv_cache"), torch.cuda.use_mem_pool(kv_pool):
        kv = torch.ones(16 * MiB // 4, device="cuda")
    assert "weights" in uvm.tags() and "kv_cache" in uvm.tags()
    assert uvm.library().uvm_get_thread_tag() == b""  # restored after the blocks
    uvm.offload("weights")
    uvm.discard("kv_cache")
    torch.cuda.synchronize()
    w, k = uvm.residency(tag="weights"), uvm.residency(tag="kv_cache")
    assert w["device_bytes"] == 0 and w["host_bytes"] == w["live_bytes"] >= weights.numel() * 4
    assert k["discarded_bytes"] == k["live_bytes"] >= kv.numel() * 4
    uvm.onload("weights")
    torch.cuda.synchronize()
    assert uvm.residency(tag="weights")["device_bytes"] == uvm.residency(tag="weights")["live_bytes"]
    assert torch.equal(weights, torch.arange(32 * MiB // 4, device="cuda", dtype=torch.float32))
    kv.fill_(2)  # a discarded range is usable again once written
    assert kv.sum().item() == 2 * kv.numel()


def test_a_whole_pool_and_a_side_stream():
    pool = uvm.create_unified_mempool()
    with torch.cuda.use_mem_pool(pool):
        tensors = [torch.randn(n, device="cuda") for n in (1000, 5 * MiB, 123457)]
    reference = [t.clone() for t in tensors]
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    assert uvm.offload(pool, stream=side) >= sum(t.numel() * 4 for t in tensors)
    uvm.onload(pool, stream=side)
    side.synchronize()
    assert all(torch.equal(a, b) for a, b in zip(tensors, reference))


def test_module_prefetch_goes_through_the_coalescing_path():
    pool = uvm.create_unified_mempool()
    with torch.cuda.use_mem_pool(pool):
        model = small_model(hidden=256, layers=4)
    before = uvm.stats()["prefetch_calls"]
    moved = uvm.prefetch_managed_module_parameters(model, device="cpu")
    calls = uvm.stats()["prefetch_calls"] - before
    assert moved == sum(p.numel() * p.element_size() for p in model.parameters())
    assert 0 < calls < len(list(model.parameters()))  # neighbours merged into fewer calls
    uvm.prefetch_managed_module_parameters(model, device=0)
    torch.cuda.synchronize()


def test_offload_refuses_plain_tensors_with_a_clear_error():
    plain = torch.ones(10, device="cuda")
    with pytest.raises(RuntimeError, match="not managed memory from uvm"):
        uvm.offload(plain)
    with pytest.raises(ValueError, match="strategy must be one of"):
        uvm.offload([], strategy="fast")
    with pytest.raises(TypeError, match="cannot find managed memory"):
        uvm.offload(3.5)
    torch.cuda.synchronize()  # no stale CUDA error left for torch


def many_tensors(pool, count=300, numel=4096):
    """`count` pool tensors of distinct contents, more than one slice of a move by tensors holds
    (uvm.torch._SlicedMove: the first holds 64)."""
    with torch.cuda.use_mem_pool(pool):
        return torch.nn.ParameterList(torch.nn.Parameter(torch.full((numel,), float(i), device="cuda"))
                                      for i in range(count))


def test_a_move_by_tensors_in_slices_is_one_move_and_keeps_every_bit():
    """A module of 300 tensors, and a list of the same tensors, move in three slices (64, 128 and 108
    tensors: uvm.torch._SlicedMove), each a C call inside one group of moves: last_move() shows one
    move of all the bytes, every tensor comes back intact, and a first staged offload pins its
    staging as one block. An mmap offload, which waits for its copies, moves them in one call."""
    pool = uvm.create_unified_mempool()
    model = many_tensors(pool, numel=1 << 19)  # 2 MiB each: 600 MiB, more than a 256 MiB block
    reference = snapshot(model)
    total = sum(p.numel() * 4 for p in model.parameters())
    lib = uvm.library()
    uvm.release_staging()  # the staged offload below is a first one: it pins its staging as one block
    blocks_before = uvm.staging()["blocks"]  # those still holding another test's copies
    for strategy, moved in (("staged", model), ("migrate", list(model.parameters())), ("mmap", model)):
        calls = []
        entry = lib.uvm_offload_ranges
        lib.uvm_offload_ranges = lambda ranges, count, *rest: calls.append(count) or entry(ranges, count, *rest)
        try:
            assert uvm.offload(moved, strategy=strategy) == total
        finally:
            lib.uvm_offload_ranges = entry
        assert calls == ([300] if strategy == "mmap" else [64, 128, 108]), (strategy, calls)
        if strategy == "staged":  # the group said what it would stage: the first slice pinned it all
            assert uvm.staging()["blocks"] <= blocks_before + 1, uvm.staging()  # a block a slice: 3
        [out] = uvm.last_move()
        assert out["call"] == "uvm_offload_ranges" and out["status"] == "UVM_OK", out
        assert out["bytes"] >= total, out  # each tensor's block padding counts too
        assert uvm.onload(model) == total
        [back] = uvm.last_move()
        assert back["call"] == "uvm_onload_ranges" and back["bytes"] == out["bytes"], (out, back)
        torch.cuda.synchronize()
        assert same(model, reference), strategy
    uvm.release_pool(pool)


def test_a_pool_of_many_segments_moves_in_slices_too():
    """uvm.offload(pool) gives the pool's segments in slices as a module's tensors go (64 first), so
    its copies start early; every byte comes back."""
    pool = uvm.create_unified_mempool()
    model = many_tensors(pool, count=300, numel=1 << 18)  # 1 MiB each: two a 2 MiB segment
    reference = snapshot(model)
    segments = len(pool.snapshot())
    assert segments > 64
    lib = uvm.library()
    calls = []
    entry = lib.uvm_offload_ranges
    lib.uvm_offload_ranges = lambda ranges, count, *rest: calls.append(count) or entry(ranges, count, *rest)
    try:
        uvm.offload(pool)
    finally:
        lib.uvm_offload_ranges = entry
    assert calls[0] == 64 and len(calls) >= 2 and sum(calls) == segments, calls
    [out] = uvm.last_move()
    assert out["status"] == "UVM_OK" and out["bytes"] >= 300 << 20, out
    uvm.onload(pool)
    torch.cuda.synchronize()
    assert same(model, reference)
    uvm.release_pool(pool)


@pytest.mark.parametrize("late", ["plain CUDA tensor", "CPU tensor"])
def test_a_move_by_tensors_that_fails_in_a_later_slice_moves_the_earlier_slices_back(late):
    """The earlier slices were already offloaded when a later one is refused (a tensor of plain CUDA
    memory: refused by the library; a CPU tensor: refused by the shim). The offload raises naming it,
    and what it moved comes back first: nothing of the module is left offloaded, every byte as it
    was, and the next kernel sees no stale error."""
    pool = uvm.create_unified_mempool()
    model = many_tensors(pool)
    reference = snapshot(model)
    host_before = uvm.stats(0)["host_resident_bytes"]
    stranger = torch.ones(16, device="cuda" if late == "plain CUDA tensor" else "cpu")
    model.append(torch.nn.Parameter(stranger))
    message = "parameter '300'.*not managed memory from uvm" if late == "plain CUDA tensor" else \
        "parameter '300' is a cpu tensor"
    with pytest.raises((RuntimeError, ValueError), match=message):
        uvm.offload(model, strategy="staged")
    torch.cuda.synchronize()
    assert uvm.stats(0)["host_resident_bytes"] == host_before  # the first 300 were moved back
    assert same(torch.nn.ParameterList(list(model.parameters())[:300]), reference)
    assert (stranger * 2).sum().item() == 32.0
    uvm.release_pool(pool)


def test_last_move_and_the_trace_file_show_every_phase(tmp_path):
    """uvm.last_move() gives the phases of the last offload / onload, timed on the GPU; UVM_TRACE
    gets them as Chrome trace events, written at exit (a process of its own: the file is named
    once per process)."""
    code = """
import json, torch, uvm
pool = uvm.create_releasable_mempool()
with torch.cuda.use_mem_pool(pool):
    tensors = [torch.full((n,), 3.0, device="cuda") for n in (64 << 20, 1 << 20, 12345)]
uvm.offload(tensors)
print(json.dumps(uvm.last_move()))
uvm.onload(tensors)
print(json.dumps(uvm.last_move()))
assert all(bool((t == 3.0).all()) for t in tensors)
"""
    out = python(code, {"UVM_TRACE": str(tmp_path / "uvm-%p.json")}).stdout.strip().split("\n")
    offload, onload = json.loads(out[-2]), json.loads(out[-1])
    assert len(offload) == 1 and len(onload) == 1, out
    offload, onload = offload[0], onload[0]
    assert offload["call"] == "uvm_offload_ranges" and onload["call"] == "uvm_onload_ranges"
    assert offload["status"] == "UVM_OK" and offload["device"] == torch.cuda.current_device()
    for move, must in ((offload, {"copy", "release"}), (onload, {"map", "copy"})):
        assert must <= set(move["phases"]), move
        copy = move["phases"]["copy"]
        assert copy["bytes"] == move["bytes"] >= (65 << 20) * 4, move
        assert 0 < copy["gbps"] < 1000, move  # timed, and no faster than any link
        assert move["seconds"] >= move["host_seconds"] > 0, move
    [trace_file] = list(tmp_path.iterdir())
    events = json.loads(trace_file.read_text())
    calls = [e for e in events if e.get("cat") == "uvm" and e["name"].startswith("uvm_")]
    assert [e["name"] for e in calls] == ["uvm_offload_ranges", "uvm_onload_ranges"], calls
    copies = [e for e in events if e.get("name") == "copy"]
    assert copies and all(e["dur"] > 0 and e["args"]["bytes"] > 0 for e in copies), copies
    lanes = {e["args"]["name"] for e in events if e.get("ph") == "M"}
    assert any(lane.startswith("GPU") for lane in lanes) and any(lane.startswith("host") for lane in lanes), lanes
