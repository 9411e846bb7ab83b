"""When a dropped uvm pool dies (uvm._pools), without torch: a stand-in torch.cuda.MemPool whose real
death is seen through a weakref, and whose use count and capture state the test sets. A pool dies
as soon as it is dropped when that is safe, and waits for a safe point when a uvm pool is in use or
this thread captures. (The same with torch on a GPU: test_pools_gpu.py.)"""
import gc
import sys
import threading
import types
import weakref

import pytest
from conftest import UVM_PATH

sys.path.insert(0, str(UVM_PATH))


class FakeMemPool:
    """torch.cuda.MemPool as uvm._pools uses it: a use count (1 for the pool itself)."""

    def __init__(self, allocator):
        self.allocator = allocator
        self.users = 1

    def use_count(self):
        return self.users


@pytest.fixture
def pools(monkeypatch):
    capturing = {"now": False}
    fake = types.ModuleType("torch")
    fake.cuda = types.SimpleNamespace(MemPool=FakeMemPool, is_current_stream_capturing=lambda: capturing["now"])
    monkeypatch.setitem(sys.modules, "torch", fake)
    import uvm._pools as module
    monkeypatch.setattr(module, "_pool_class", None)
    monkeypatch.setattr(module, "_deferred", [])
    monkeypatch.setattr(module, "_live", weakref.WeakSet())
    module.capturing = capturing
    return module


def dead_when_dropped(pool) -> dict:
    state = {"dead": False}
    weakref.finalize(pool, state.__setitem__, "dead", True)
    return state


def test_a_pool_dropped_when_nothing_is_in_use_dies_at_once(pools):
    pool = pools.make("allocator", 0)
    assert pools.is_uvm_pool(pool) and isinstance(pool, FakeMemPool) and pool.uvm_device == 0
    seen = dead_when_dropped(pool)
    del pool
    assert seen["dead"] and pools.waiting() == 0


@pytest.mark.parametrize("unsafe", ["another uvm pool is allocated into", "this thread captures a graph"])
def test_a_pool_dropped_at_an_unsafe_moment_waits_for_the_next_safe_point(pools, unsafe):
    other = pools.make("allocator", 0)
    dropped = pools.make("allocator", 0)
    seen = dead_when_dropped(dropped)
    if unsafe.startswith("another"):
        other.users += 1  # as torch.cuda.use_mem_pool(other) does, in any thread
    else:
        pools.capturing["now"] = True
    del dropped
    assert not seen["dead"] and pools.waiting() == 1
    assert pools.release_dropped_pools() == 1  # still unsafe: it keeps waiting
    assert not seen["dead"]
    other.users, pools.capturing["now"] = 1, False
    assert pools.release_dropped_pools() == 0
    assert seen["dead"] and pools.waiting() == 0


def test_a_pool_in_a_cycle_collected_inside_another_pools_use_waits_then_dies_with_the_next_drop(pools):
    other = pools.make("allocator", 0)

    class Holder:
        pass

    holder = Holder()
    holder.me, holder.pool = holder, pools.make("allocator", 0)
    pool_id = id(holder.pool)
    del holder
    other.users += 1
    gc.collect()  # the collector finds the cycle while `other` is in use
    # Kept, not dealloc'ed (the collector cleared its weak references before the finalizer kept it,
    # so a weakref cannot tell here: the waiting pool is checked by identity).
    assert pools.waiting() == 1 and id(pools._deferred[0]) == pool_id
    seen = dead_when_dropped(pools._deferred[0])
    other.users -= 1
    third = pools.make("allocator", 0)
    del third  # a safe drop is a safe point for those that wait
    assert seen["dead"] and pools.waiting() == 0


def test_a_dropped_pool_dies_exactly_once_with_threads_dropping_at_once(pools):
    deaths = []
    made = [pools.make("allocator", 0) for _ in range(200)]
    for i, pool in enumerate(made):
        weakref.finalize(pool, deaths.append, i)
    del pool
    blocker = pools.make("allocator", 0)
    blocker.users += 1
    start = threading.Barrier(4)

    def drop(part):
        start.wait()
        part.clear()

    parts = [made[i::4] for i in range(4)]
    del made
    threads = [threading.Thread(target=drop, args=(part,)) for part in parts]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert deaths == [] and pools.waiting() == 200
    blocker.users -= 1
    assert pools.release_dropped_pools() == 0
    assert sorted(deaths) == list(range(200))


def test_release_pool_refuses_a_pool_uvm_did_not_make(pools):
    import uvm
    with pytest.raises(ValueError, match="made by uvm.create_unified_mempool .* not a FakeMemPool"):
        uvm.release_pool(FakeMemPool("other"))
    assert uvm.release_pool() == 0


def test_a_pool_whose_safety_cannot_be_checked_waits_instead_of_dying(pools):
    """At interpreter exit torch may be half torn down: a check that raises means "not now"."""
    def torn_down():
        raise RuntimeError("torch is being torn down")

    import torch  # the stand-in
    checks = torch.cuda.is_current_stream_capturing
    torch.cuda.is_current_stream_capturing = torn_down
    try:
        dropped = pools.make("allocator", 0)
        seen = dead_when_dropped(dropped)
        del dropped
        assert not seen["dead"] and pools.waiting() == 1
    finally:
        torch.cuda.is_current_stream_capturing = checks
    assert pools.release_dropped_pools() == 0 and seen["dead"]


def test_a_pools_death_is_decided_and_done_under_the_lock_busy_takes(pools):
    """No uvm entry of a pool (busy()) can start between the check that a pool may die and its death:
    while one thread checks, the lock is held, and busy() counts its entry under that lock."""
    other = pools.make("allocator", 0)
    checking, go_on = threading.Event(), threading.Event()

    def slow_use_count():
        checking.set()
        assert go_on.wait(60)
        return 1

    other.use_count = slow_use_count
    holder = [pools.make("allocator", 0)]
    seen = dead_when_dropped(holder[0])
    dropping = threading.Thread(target=holder.clear)  # the pool's last reference goes in that thread
    dropping.start()
    assert checking.wait(60)
    got_the_lock = pools._lock.acquire(blocking=False)  # tried, not waited for: the answer is now
    if got_the_lock:
        pools._lock.release()
    go_on.set()
    dropping.join()
    assert not got_the_lock, "a pool's check ran without the lock"
    assert seen["dead"]

    class Recording:
        """The lock, noting the entries' count of uvm allocations under way as it is taken and let go."""

        def __init__(self, real):
            self.real, self.seen = real, []

        def __enter__(self):
            self.real.acquire()
            self.seen.append(("taken", pools._busy))

        def __exit__(self, *exc):
            self.seen.append(("let go", pools._busy))
            self.real.release()

    recording = Recording(pools._lock)
    real_lock = pools._lock
    pools._lock = recording
    try:
        with pools.busy():
            assert recording.seen[:2] == [("taken", 0), ("let go", 1)], "busy() counted its entry outside the lock"
    finally:
        pools._lock = real_lock


class SlowToSubclass(FakeMemPool):
    """A MemPool whose subclassing waits for a second thread to subclass it too (up to 0.5 s): two
    threads making their first pool at once meet inside the class's creation unless it is locked."""
    meeting = threading.Barrier(2)

    def __init_subclass__(cls, **kwargs):
        super().__init_subclass__(**kwargs)
        try:
            SlowToSubclass.meeting.wait(timeout=0.5)
        except threading.BrokenBarrierError:
            pass


def test_two_threads_making_their_first_pools_at_once_make_one_pool_class(pools, monkeypatch):
    monkeypatch.setattr(sys.modules["torch"].cuda, "MemPool", SlowToSubclass)
    SlowToSubclass.meeting = threading.Barrier(2)
    made = []
    threads = [threading.Thread(target=lambda: made.append(pools.make("allocator", 0))) for _ in range(2)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert len(made) == 2
    assert type(made[0]) is type(made[1])
    assert all(pools.is_uvm_pool(pool) for pool in made)
