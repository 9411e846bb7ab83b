"""GPU: staged bytes belong to a tensor's lifetime, not to an address. PyTorch's caching allocator
hands a freed tensor's block to the next tensor inside a live segment without calling uvm_free; the
hook the shim attaches (_torch_blocks.cpp) reports every block, so an onload never writes a freed
tensor's bytes over the tensor that took its block, a block of released memory is mapped before the
new tensor's kernels run, and a freed tensor's staged copy is dropped. Needs torch with CUDA and GPU
0 (skipped with the reason otherwise); managed memory stays under 200 MiB."""
import sys

import pytest
from conftest import UVM_PATH

sys.path.insert(0, str(UVM_PATH))
import uvm  # noqa: E402
from uvm.memory_saver import torch_memory_saver  # noqa: E402

torch = pytest.importorskip("torch", reason="torch is not installed here")
if not torch.cuda.is_available():
    pytest.skip("no CUDA device visible to torch", allow_module_level=True)

N = 4 << 20  # float32 elements: 16 MiB a tensor


def make_pool(kind):
    return uvm.create_unified_mempool() if kind == "managed" else uvm.create_releasable_mempool()


@pytest.mark.parametrize("kind", ["managed", "releasable"])
def test_a_tensor_that_takes_a_freed_tensors_block_keeps_its_values_through_onload(kind):
    # The sequence, as a new user wrote it.
    pool = make_pool(kind)
    with torch.cuda.use_mem_pool(pool):
        keep = torch.randn(N, device="cuda")
        old = torch.randn(N, device="cuda")
    keep_values = keep.cpu()
    old_block = old.data_ptr()
    uvm.offload([keep, old])
    torch.cuda.synchronize()
    del old  # old weights replaced, a KV cache rebuilt
    with torch.cuda.use_mem_pool(pool):
        new = torch.full((N,), 7.0, device="cuda")  # a released block is mapped first: no fault
    assert new.data_ptr() == old_block, "PyTorch did not hand out the freed block: the test tests nothing"
    uvm.onload([keep, new])
    uvm.onload(pool)
    torch.cuda.synchronize()
    assert bool((new == 7).all())
    assert torch.equal(keep.cpu(), keep_values)
    del keep, new
    torch.cuda.synchronize()


@pytest.mark.parametrize("kind", ["managed", "releasable"])
def test_a_kv_cache_rebuilt_at_another_size_after_a_pool_offload_keeps_what_it_writes(kind):
    pool = make_pool(kind)
    with torch.cuda.use_mem_pool(pool):
        weights = torch.randn(N, device="cuda")
        cache = torch.randn(3 * N // 2, device="cuda")
    expected = weights.cpu()
    uvm.offload(pool)
    torch.cuda.synchronize()
    del cache
    with torch.cuda.use_mem_pool(pool):
        cache = torch.arange(N // 3, device="cuda", dtype=torch.float32)  # inside the freed block
        scratch = torch.full((4096,), 3.0, device="cuda")
    uvm.onload(pool)
    torch.cuda.synchronize()
    assert torch.equal(cache.cpu(), torch.arange(N // 3, dtype=torch.float32))
    assert bool((scratch == 3).all())
    assert torch.equal(weights.cpu(), expected)


def test_a_freed_tensors_staged_copy_is_dropped_at_once():
    pool = make_pool("managed")
    with torch.cuda.use_mem_pool(pool):
        keep = torch.ones(N, device="cuda")
        gone = torch.ones(N, device="cuda")
    uvm.offload([keep, gone], strategy="staged")
    torch.cuda.synchronize()
    assert uvm.staging()["staged_bytes"] == 2 * N * 4
    del gone
    assert uvm.staging()["staged_bytes"] == N * 4
    uvm.onload(keep)
    torch.cuda.synchronize()
    assert bool((keep == 1).all())
    assert uvm.staging()["staged_bytes"] == 0


@pytest.mark.parametrize("backup", [True, False])
def test_a_tensor_made_in_a_paused_memory_saver_region_gets_memory_and_keeps_it_through_resume(backup):
    tag = f"lifetime-{backup}"
    with torch_memory_saver.region(tag, enable_cpu_backup=backup):
        kept = torch.randn(N, device="cuda")
        dropped = torch.randn(N, device="cuda")
    kept_values = kept.cpu()
    torch_memory_saver.pause(tag)
    del dropped
    with torch_memory_saver.region(tag, enable_cpu_backup=backup):
        made = torch.full((N,), 5.0, device="cuda")  # in the paused region: memory, not a fault
    torch.cuda.synchronize()
    torch_memory_saver.resume(tag)
    torch.cuda.synchronize()
    assert bool((made == 5).all())
    if backup:
        assert torch.equal(kept.cpu(), kept_values)
    del kept, made
