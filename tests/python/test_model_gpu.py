"""GPU: the stateful model with torch (Hypothesis' rule-based state machine). Tensors are made in uvm
pools of both kinds, where PyTorch's caching allocator reuses freed blocks inside live segments, and
in a uvm.memory_saver region; they are freed, written, offloaded, onloaded and discarded by tensor,
module, tag and pool, paused and resumed, with release_staging and set_limit between — and after
every step each tensor the model says is on the GPU must equal its CPU shadow. The CUDA-test-double
model (tests/offload/test_model.cpp) runs thousands of sequences in CI; this one is the bounded run on
a real GPU (UVM_GPU_MODEL_EXAMPLES, default 25 sequences of up to 30 steps). Needs torch with CUDA
and GPU 0 (skipped with the reason otherwise); managed memory stays under 300 MiB."""
import gc
import os
import sys

import pytest
from conftest import UVM_PATH

sys.path.insert(0, str(UVM_PATH))
import uvm  # noqa: E402
from uvm.memory_saver import torch_memory_saver  # noqa: E402

torch = pytest.importorskip("torch", reason="torch is not installed here")
if not torch.cuda.is_available():
    pytest.skip("no CUDA device visible to torch", allow_module_level=True)
hypothesis = pytest.importorskip("hypothesis", reason="hypothesis is not installed here")
from hypothesis import settings, strategies as st  # noqa: E402
from hypothesis.stateful import RuleBasedStateMachine, invariant, precondition, rule  # noqa: E402

DEVICE, AWAY, GARBAGE, AWAY_GARBAGE = "device", "away", "garbage", "away garbage"
SIZES = [1, 7, 128, 1000, 4096, 65_536, 262_144 + 3, 1 << 20, (3 << 20) + 5]  # float32 elements
SAVER_TAG = "model-saver"


class Tensor:
    def __init__(self, where: str, value, backup: bool = False):
        self.where, self.value, self.backup = where, value, backup  # backup: a saver tensor's CPU backup
        self.shadow = value.cpu()
        self.held = DEVICE


class Model(RuleBasedStateMachine):
    """What each live tensor must hold, and where uvm has it."""

    def __init__(self):
        super().__init__()
        self.pools = {"managed": uvm.create_unified_mempool(), "releasable": uvm.create_releasable_mempool()}
        self.tags = {"managed": "model-managed", "releasable": "model-releasable"}
        self.tensors: list[Tensor] = []
        self.saver_paused = False

    def teardown(self):
        uvm.set_limit(None)
        if self.saver_paused:
            torch_memory_saver.resume(SAVER_TAG)
        self.tensors.clear()
        torch.cuda.synchronize()
        for pool in self.pools.values():
            uvm.release_pool(pool)  # here, where no thread allocates into a pool
        # ...and the pools die here too: Hypothesis keeps the machine in reference cycles, and a pool
        # left to the garbage collector died inside a later test's use_mem_pool (an abort, H100).
        self.pools.clear()
        gc.collect()

    # --- tensors ---

    @rule(where=st.sampled_from(["managed", "releasable", "saver"]), size=st.sampled_from(SIZES),
          seed=st.integers(0, 1 << 30), backup=st.booleans())
    def allocate(self, where, size, seed, backup):
        generator = torch.Generator(device="cuda").manual_seed(seed)
        try:
            if where == "saver":  # also while paused: the new tensor gets memory, and keeps it through resume
                with torch_memory_saver.region(SAVER_TAG, enable_cpu_backup=backup):
                    value = torch.rand(size, device="cuda", generator=generator)
            else:
                with uvm.tag(self.tags[where]), torch.cuda.use_mem_pool(self.pools[where]):
                    value = torch.rand(size, device="cuda", generator=generator)
        except torch.OutOfMemoryError:
            return  # a small limit is in force (set_limit): the allocation is refused, nothing is made
        self.tensors.append(Tensor(where, value, backup and where == "saver"))

    @precondition(lambda self: self.tensors)
    @rule(data=st.data())
    def free(self, data):
        self.tensors.pop(data.draw(st.integers(0, len(self.tensors) - 1)))

    @precondition(lambda self: any(t.held in (DEVICE, GARBAGE) for t in self.tensors))
    @rule(data=st.data(), value=st.floats(-4, 4, allow_nan=False))
    def write(self, data, value):
        writable = [t for t in self.tensors if t.held in (DEVICE, GARBAGE)]
        tensor = data.draw(st.sampled_from(writable))
        if tensor.held == GARBAGE and tensor.where != "managed":
            uvm.onload(tensor.value)  # discarded releasable memory may be given back: bring it first
        tensor.value.fill_(value)
        tensor.shadow = tensor.value.cpu()
        tensor.held = DEVICE

    # --- moves ---

    @staticmethod
    def moved(tensor: Tensor, kind: str) -> None:
        if kind == "discard":
            tensor.held = GARBAGE
        elif kind == "offload":
            tensor.held = {DEVICE: AWAY, GARBAGE: AWAY_GARBAGE}.get(tensor.held, tensor.held)
        else:
            tensor.held = {AWAY: DEVICE, AWAY_GARBAGE: GARBAGE}.get(tensor.held, tensor.held)

    def move(self, kind: str, obj, strategy: str = "auto"):
        if kind == "offload":
            uvm.offload(obj, strategy=strategy)
        elif kind == "onload":
            uvm.onload(obj)
        else:
            uvm.discard(obj)

    @precondition(lambda self: self.tensors)
    @rule(data=st.data(), kind=st.sampled_from(["offload", "onload", "discard"]),
          strategy=st.sampled_from(["auto", "staged", "migrate"]), as_module=st.booleans())
    def move_tensors(self, data, kind, strategy, as_module):
        chosen = data.draw(st.lists(st.sampled_from(self.tensors), min_size=1, unique_by=id))
        if any(t.where == "saver" for t in chosen) and self.saver_paused:
            return  # pause/resume owns the region's tensors while paused
        if kind == "offload" and strategy == "migrate" and any(t.where != "managed" for t in chosen):
            strategy = "auto"  # releasable memory cannot migrate (refused: test_release_gpu.py)
        if as_module:  # uvm.offload(module): parameters and buffers
            module = torch.nn.Module()
            for i, t in enumerate(chosen):
                module.register_buffer(f"b{i}", t.value)
            self.move(kind, module, strategy)
        else:
            self.move(kind, [t.value for t in chosen], strategy)
        for t in chosen:
            self.moved(t, kind)

    @rule(where=st.sampled_from(["managed", "releasable"]), kind=st.sampled_from(["offload", "onload", "discard"]),
          by_tag=st.booleans())
    def move_pool(self, where, kind, by_tag):
        self.move(kind, self.tags[where] if by_tag else self.pools[where])
        for t in self.tensors:
            if t.where == where:
                self.moved(t, kind)

    @precondition(lambda self: not self.saver_paused)
    @rule()
    def pause(self):
        if any(t.where == "saver" and t.held not in (DEVICE, GARBAGE) for t in self.tensors):
            return  # moved by hand: brought back first
        torch_memory_saver.pause(SAVER_TAG)
        self.saver_paused = True
        for t in self.tensors:
            if t.where == "saver":
                t.held = AWAY if (t.backup and t.held == DEVICE) else GARBAGE

    @precondition(lambda self: self.saver_paused)
    @rule()
    def resume(self):
        torch_memory_saver.resume(SAVER_TAG)
        self.saver_paused = False
        for t in self.tensors:
            if t.where == "saver" and t.held == AWAY:
                t.held = DEVICE

    @rule()
    def release_staging(self):
        uvm.release_staging()

    @rule(small=st.booleans())
    def set_limit(self, small):
        live = uvm.stats()["live_bytes"]
        uvm.set_limit(live + (32 << 20) if small else None)

    @invariant()
    def every_tensor_on_the_gpu_holds_its_values(self):
        torch.cuda.synchronize()
        for t in self.tensors:
            if t.held == DEVICE:
                assert torch.equal(t.value.cpu(), t.shadow), f"a {t.where} tensor of {t.value.numel()} floats lost its values"


Model.TestCase.settings = settings(max_examples=int(os.environ.get("UVM_GPU_MODEL_EXAMPLES", "25")),
                                   stateful_step_count=30, deadline=None, database=None)
test_stateful_model_on_the_gpu = Model.TestCase
