"""GPU: needs torch with CUDA and GPU 0 (skipped with the reason otherwise). Managed memory stays
far below 25% of the card: the largest tensor here is 256 MiB."""
import ctypes
import gc
import sys
import threading

import pytest
from conftest import UVM_PATH

sys.path.insert(0, str(UVM_PATH))
import uvm  # noqa: E402

torch = pytest.importorskip("torch", reason="torch is not installed here")
if not torch.cuda.is_available():
    pytest.skip("no CUDA device visible to torch", allow_module_level=True)

MiB = 1 << 20
LAST_PREFETCH_LOCATION = 4  # cudaMemRangeAttributeLastPrefetchLocation


def last_prefetch(tensor) -> int:
    """Straight from the driver, not through uvm: cudaMemRangeGetAttribute(LastPrefetchLocation)."""
    cudart = ctypes.CDLL("libcudart.so.13")  # the one torch already loaded
    value = ctypes.c_int(-99)
    ptr, size = uvm.torch._span(tensor)
    status = cudart.cudaMemRangeGetAttribute(ctypes.byref(value), ctypes.c_size_t(4),
                                             ctypes.c_int(LAST_PREFETCH_LOCATION), ctypes.c_void_p(ptr),
                                             ctypes.c_size_t(size))
    assert status == 0
    return value.value


@pytest.fixture(scope="module")
def pool():
    return uvm.create_unified_mempool()


def test_pool_tensors_are_managed(pool):
    assert uvm._compilation_state is uvm.CompilationState.SUCCESS
    with torch.cuda.use_mem_pool(pool):
        t = torch.arange(16 * MiB, device="cuda", dtype=torch.float32)
    assert uvm.library().uvm_is_managed(t.data_ptr()) == 1
    assert uvm.where(t)["preferred"] == 0
    assert t[-1].item() == 16 * MiB - 1


def test_tensor_prefetch_both_ways(pool):
    with torch.cuda.use_mem_pool(pool):
        t = torch.full((64 * MiB // 4,), 3.0, device="cuda")
    uvm.prefetch_managed_tensor(t, device="cpu")
    torch.cuda.synchronize()
    assert last_prefetch(t) == -1
    assert uvm.where(t)["last_prefetch"] == -1
    uvm.prefetch_managed_tensor(t, device=0)
    torch.cuda.synchronize()
    assert last_prefetch(t) == 0
    assert t.sum().item() == 3.0 * t.numel()
    view = t[1000:2000]  # a view acts on the bytes it spans
    uvm.prefetch_managed_tensor(view, device="cpu")
    torch.cuda.synchronize()
    assert last_prefetch(view) == -1
    uvm.advise_managed_tensor_preferred_location(view, device="cpu")
    uvm.advise_managed_tensor_accessed_by(view, device=0)
    assert uvm.where(view)["preferred"] == -1


def make_model(pool, layers=24, width=512):
    with torch.cuda.use_mem_pool(pool):
        model = torch.nn.Sequential(*[torch.nn.Linear(width, width) for _ in range(layers)]).cuda()
        model.register_buffer("scale", torch.ones(width, device="cuda"))
    return model


def test_module_prefetch_and_advice(pool):
    model = make_model(pool)
    before = uvm.stats(0)
    moved = uvm.prefetch_managed_module_parameters(model, device="cpu", include_buffers=True)
    torch.cuda.synchronize()
    expected = sum(p.numel() * p.element_size() for p in model.parameters()) + model.scale.numel() * 4
    assert moved == expected
    after = uvm.stats(0)
    assert after["bytes_to_host"] - before["bytes_to_host"] == moved
    assert after["prefetch_calls"] - before["prefetch_calls"] < len(list(model.parameters()))
    assert all(last_prefetch(p) == -1 for p in model.parameters())
    assert uvm.prefetch_managed_module_parameters(model, device=0) == expected - model.scale.numel() * 4
    torch.cuda.synchronize()
    assert all(last_prefetch(p) == 0 for p in model.parameters())
    uvm.advise_managed_module_parameters_preferred_location(model, device="cpu")
    assert all(uvm.where(p)["preferred"] == -1 for p in model.parameters())


def test_graph_replays_bit_identically_after_offload_and_onload(pool):
    model = make_model(pool, layers=8)
    with torch.cuda.use_mem_pool(pool):
        static_in = torch.randn(64, 512, device="cuda")
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        for _ in range(2):
            model(static_in)  # warm up outside capture
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        static_out = model(static_in)
    graph.replay()
    torch.cuda.synchronize()
    reference = static_out.clone()
    for _ in range(3):
        uvm.prefetch_managed_module_parameters(model, device="cpu")
        uvm.prefetch_managed_tensor(static_in, device="cpu")
        torch.cuda.synchronize()
        uvm.prefetch_managed_module_parameters(model, device=0)
        uvm.prefetch_managed_tensor(static_in, device=0)
        graph.replay()
        torch.cuda.synchronize()
        assert torch.equal(static_out, reference)


def test_a_plain_tensor_gets_a_helpful_error_and_torch_goes_on(pool):
    plain = torch.ones(7, 3, device="cuda", dtype=torch.float16)
    with pytest.raises(RuntimeError, match=r"shape \(7, 3\) and dtype torch.float16 at 0x[0-9a-f]+ is not "
                                           r"managed memory from uvm"):
        uvm.prefetch_managed_tensor(plain, device="cpu")
    model = torch.nn.Linear(4, 4).cuda()
    with pytest.raises(RuntimeError, match="parameter 'weight'"):
        uvm.prefetch_managed_module_parameters(model, device="cpu")
    assert (plain * 2).sum().item() == 42.0  # no stale CUDA error surfaces at the next kernel


def test_a_module_is_walked_as_named_parameters_and_named_buffers_list_it(pool):
    """uvm.torch._members reads each submodule's own dicts when named_parameters and named_buffers
    are torch's, so it must find exactly their tensors: nested and shared submodules, a None
    parameter, non-persistent buffers, buffers left out on request; a module overriding those
    methods is asked through them. A failure still names the tensor."""
    with torch.cuda.use_mem_pool(pool):
        shared = torch.nn.Linear(8, 8, device="cuda")
        inner = torch.nn.Sequential(shared, torch.nn.Linear(8, 4, bias=False, device="cuda"))
        model = torch.nn.Sequential(shared, torch.nn.BatchNorm1d(8, device="cuda"), inner)
        model.register_buffer("scratch", torch.zeros(3, device="cuda"), persistent=False)
        model.register_parameter("nothing", None)
    for include_buffers in (True, False):
        expected = {id(t) for t in model.parameters()}
        if include_buffers:
            expected |= {id(t) for t in model.buffers()}
        tensors, whats = uvm.torch._members(model, include_buffers)
        assert {id(t) for t in tensors} == expected
        assert all(what[2] is tensor for tensor, what in zip(tensors, whats))
        assert {uvm.torch._describe(what) for what in whats} == (
            {f"parameter {name!r}" for name, _ in model.named_parameters()}
            | ({f"buffer {name!r}" for name, _ in model.named_buffers()} if include_buffers else set()))

    class OnlyFirst(torch.nn.Module):  # shows one parameter of two
        def __init__(self):
            super().__init__()
            self.first, self.second = inner[0].weight, inner[1].weight

        def named_parameters(self, *args, **kwargs):
            yield "first", self.first

    assert uvm.torch._members(OnlyFirst(), False)[0] == [inner[0].weight]
    mixed = torch.nn.Sequential(inner, torch.nn.Linear(4, 2, device="cuda"))  # the second: plain memory
    with pytest.raises(RuntimeError, match=r"parameter '1\.(weight|bias)' at 0x[0-9a-f]+ .* is not managed"):
        uvm.offload(mixed)
    torch.cuda.synchronize()


def test_live_bytes_return_to_baseline(pool):
    gc.collect()
    torch.cuda.synchronize()
    baseline = uvm.stats(0)["live_bytes"]
    second = uvm.create_unified_mempool()
    with torch.cuda.use_mem_pool(second):
        tensors = [torch.empty(8 * MiB, device="cuda") for _ in range(4)]
    assert uvm.stats(0)["live_bytes"] >= baseline + 4 * 8 * MiB
    del tensors
    uvm.release_pool(second)  # uvm keeps its pools until released (a pool dying mid-context aborts)
    del second
    gc.collect()
    torch.cuda.synchronize()
    torch.cuda.empty_cache()
    assert uvm.stats(0)["live_bytes"] == baseline


def test_pool_from_a_worker_thread():
    result = {}

    def worker():
        try:
            own = uvm.create_unified_mempool()
            with torch.cuda.use_mem_pool(own):
                t = torch.ones(MiB, device="cuda")
            result["managed"] = uvm.library().uvm_is_managed(t.data_ptr())
            result["sum"] = t.sum().item()
        except Exception as error:  # reported by the main thread
            result["error"] = repr(error)

    thread = threading.Thread(target=worker)
    thread.start()
    thread.join()
    assert result == {"managed": 1, "sum": float(MiB)}


def test_stats_and_limit_from_python(pool):
    uvm.set_limit(64 * MiB, device=0)
    try:
        assert uvm.stats(0)["limit_bytes"] == 64 * MiB
    finally:
        uvm.set_limit(None, device=0)
    assert uvm.stats(0)["limit_bytes"] == torch.cuda.get_device_properties(0).total_memory


def test_discard_a_tensor_on_the_default_stream(pool):
    caps = uvm._lib.DeviceCaps()
    uvm.library().uvm_device_capabilities(0, ctypes.byref(caps))
    with torch.cuda.use_mem_pool(pool):
        t = torch.full((32 * MiB // 4,), 1.0, device="cuda")
    if not caps.discard_supported:
        with pytest.raises(uvm.UnifiedMemoryUnsupportedError, match="CUDA 13"):
            uvm.discard_managed_tensor(t)
        return
    before = uvm.stats(0)["bytes_discarded"]
    uvm.discard_managed_tensor(t)  # torch's default stream is the legacy stream the driver rejects
    torch.cuda.synchronize()
    assert uvm.stats(0)["bytes_discarded"] - before == t.numel() * 4
    t.fill_(5.0)  # writing makes the range usable again
    assert t.sum().item() == 5.0 * t.numel()
    assert uvm.discard_managed_tensor(None) is None


def test_the_short_path_finds_the_same_bytes_as_the_long_one(pool):
    """uvm.torch._add_move_spans (a contiguous CUDA tensor's few attribute reads, written out in its
    loop) against _cuda_span + _block_span, for every shape of tensor a move meets: whole storages
    of odd sizes (padded to their 512-byte block), views inside a storage (exact), non-contiguous
    and expanded ones, empty ones, and tensors from a 2 MiB slab segment; then all of them in one
    call, where a shared tensor counts once, as the first that names it."""
    with torch.cuda.use_mem_pool(pool):
        base = torch.arange(10_000, dtype=torch.float32, device="cuda")
        odd = torch.empty(333, dtype=torch.uint8, device="cuda")
        small = [torch.empty(512 << 10, dtype=torch.uint8, device="cuda") for _ in range(4)]
        matrix = torch.empty(64, 48, dtype=torch.bfloat16, device="cuda")
    tensors = [base, odd, *small, matrix, base[100:300], base[:5000], matrix.t(), matrix[:, 3],
               base[:1].expand(50), base[:0], torch.empty(0, device="cuda")]

    def found(tensors):
        into = {}
        uvm.torch._add_move_spans(tensors, [f"x{i}" for i in range(len(tensors))], into)
        return into

    expected = {}
    for i, tensor in enumerate(tensors):
        long = uvm.torch._cuda_span(tensor, "x")
        one = {} if long is None else {long[0]: {uvm.torch._block_span(tensor, long[1]): ("x0", long[1][1])}}
        assert found([tensor]) == one, (tensor.shape, tensor.stride(), tensor.storage_offset())
        for block, (_, asked) in one.get(0, {}).items():
            expected.setdefault(block, (f"x{i}", asked))
    assert found(tensors + [odd]) == {0: expected}  # odd again: counted once, as the first
    assert found([odd])[0] == {(odd.data_ptr(), 512): ("x0", 333)}  # padded to its block
    with pytest.raises(ValueError, match="parameter 'w' is a cpu tensor"):
        uvm.torch._add_move_spans([torch.ones(3)], [("parameter", "w")], {})
    with pytest.raises(TypeError, match="tensor must be a torch.Tensor, not list"):
        uvm.torch._add_move_spans([[1]], ["tensor"], {})
