"""uvm.nccl without torch or a GPU: a stand-in NCCL backend records what is registered when, and a
stand-in libuvm records pauses, so that the order is checked: a pool's NCCL registration goes before
its memory leaves the GPU and comes back after, once each, and a pause that fails leaves it
registered. (Across a real pause on two GPUs: tests/multi_gpu/run_nccl_pause.sh.)"""
import sys

import pytest
from conftest import UVM_PATH

sys.path.insert(0, str(UVM_PATH))


class Backend:
    """ProcessGroupNCCL as uvm.nccl uses it."""

    def __init__(self, log, fail_deregister=False):
        self.log, self.fail_deregister = log, fail_deregister

    def register_mem_pool(self, pool):
        self.log.append(("register", pool))

    def deregister_mem_pool(self, pool):
        if self.fail_deregister:
            raise RuntimeError("ncclCommDeregister failed")
        self.log.append(("deregister", pool))


@pytest.fixture
def nccl(monkeypatch):
    import uvm.nccl as module
    monkeypatch.setattr(module, "_registrations", [])
    monkeypatch.setenv("WORLD_SIZE", "16")  # a job across nodes: registering pays there
    monkeypatch.setenv("LOCAL_WORLD_SIZE", "8")
    return module


def test_every_rank_on_this_node_registers_nothing_and_says_why(nccl, monkeypatch):
    # There NCCL cannot map uvm's memory (not exportable), and keeps a reference to each buffer it
    # failed to export, which a pause then cannot give back (two H100s, NCCL 2.28.9).
    monkeypatch.setenv("WORLD_SIZE", "8")
    log = []
    pool = object()
    with pytest.warns(RuntimeWarning, match="every rank is on this node .*nothing registered"):
        assert nccl.register(pool, backend=Backend(log)) == []
    assert log == [] and nccl._registrations == []
    nccl.before_pause(pool)
    nccl.after_resume(pool)
    assert log == []
    monkeypatch.delenv("LOCAL_WORLD_SIZE")  # not started by torchrun: registered
    assert len(nccl.register(pool, backend=Backend(log))) == 1
    assert log == [("register", pool)]


def test_a_registered_pool_leaves_nccl_before_its_pause_and_comes_back_after_its_resume_once_each(nccl):
    log, pool, other = [], object(), object()
    nccl.register(pool, backend=Backend(log))
    assert log == [("register", pool)]
    nccl.before_pause(other)  # another pool: untouched
    nccl.before_pause([pool])
    nccl.before_pause(pool)  # paused already: nothing to lift
    assert log == [("register", pool), ("deregister", pool)]
    nccl.after_resume(pool)
    nccl.after_resume(pool)
    assert log == [("register", pool), ("deregister", pool), ("register", pool)]
    nccl.deregister(pool)
    nccl.before_pause(pool)
    nccl.after_resume(pool)
    assert log[-1] == ("deregister", pool) and len(log) == 4  # forgotten: no more hooks


def test_a_tag_registers_the_region_pools_of_that_tag_only(nccl, monkeypatch):
    from uvm import memory_saver
    weights, kv, log = object(), object(), []
    monkeypatch.setattr(memory_saver._state, "region_pools",
                        {("weights", True, False, "", 0): weights, ("kv_cache", False, False, "", 0): kv})
    nccl.register("weights", backend=Backend(log))
    nccl.before_pause("kv_cache")
    nccl.before_pause("weights")
    assert log == [("register", weights), ("deregister", weights)]
    with pytest.raises(ValueError, match="no region pool of tag 'graphs'"):
        nccl.register("graphs", backend=Backend(log))


def test_a_pause_deregisters_first_and_one_that_fails_leaves_the_pool_registered(nccl, monkeypatch):
    from uvm import _lib, memory_saver
    log, pool = [], object()
    monkeypatch.setattr(memory_saver._state, "region_pools", {("weights", True, False, "", 0): pool})
    monkeypatch.setattr(memory_saver._state, "selected", lambda tag: [tag])
    outcome = {"status": _lib.UVM_OK}

    class Library:
        def uvm_pause(self, device, name):
            log.append(("pause", name.decode()))
            return outcome["status"]

        def uvm_last_error(self):
            return b"uvm_pause: the allocation is mapped by process 42"

        def uvm_clear_last_error(self):
            pass

    monkeypatch.setattr(memory_saver._state, "library", lambda: Library())
    monkeypatch.setattr(_lib, "_ctypes_lib", Library())  # where _lib.check reads the message
    nccl.register("weights", backend=Backend(log))
    outcome["status"] = _lib.UVM_ERROR_SHARED
    with pytest.raises(RuntimeError):
        memory_saver.torch_memory_saver.pause("weights")
    assert log == [("register", pool), ("deregister", pool), ("pause", "weights"), ("register", pool)]
    outcome["status"] = _lib.UVM_OK
    memory_saver.torch_memory_saver.pause("weights")
    assert log[-2:] == [("deregister", pool), ("pause", "weights")]


def test_a_deregistration_that_fails_stops_the_pause_before_anything_moves(nccl):
    log, pool = [], object()
    nccl.register(pool, backend=Backend(log, fail_deregister=True))
    with pytest.raises(RuntimeError, match="ncclCommDeregister failed"):
        nccl.before_pause(pool)
    assert nccl._registrations[0].registered  # still registered: the memory stays where NCCL maps it
