"""The life of uvm's torch pools: a dropped pool gives its memory back, as a torch.cuda.MemPool does,
but never at a moment when that would abort the process.

When a MemPool dies, torch releases it and empties its cache; emptying asserts (aborting the
process) if any allocation into a pool or graph capture is under way on the device. A pool's last
reference can go at any moment: the garbage collector collects a reference cycle inside whatever
allocation triggers it, in any thread, perhaps inside `torch.cuda.use_mem_pool(other)`. So each
uvm pool's `__del__` looks first: when nothing uvm can see is allocating into a pool or capturing,
the pool dies at once (torch's own behaviour); otherwise `__del__` keeps it (Python lets a
finalizer keep its object) and it dies at the next safe point: the next uvm pool made or dropped,
or `uvm.release_pool()`. Pools of torch's own are not seen (docs/python-api.md says so)."""
from __future__ import annotations

import sys
import threading
import weakref

_live = weakref.WeakSet()  # every uvm pool not yet dropped
_deferred: list = []       # dropped while unsafe; they die at the next safe point
_lock = threading.RLock()  # re-entered when the collector drops a pool inside this module
_pool_class = None


def make(allocator, device_index: int):
    """A torch.cuda.MemPool over `allocator` on `device_index` (the current device) whose memory goes
    back when it is dropped, at a safe point."""
    import torch
    global _pool_class
    if _pool_class is None:
        class UnifiedMemoryPool(torch.cuda.MemPool):
            """A torch.cuda.MemPool of uvm's; dropping it is safe at any moment (see uvm._pools)."""

            def __del__(self):
                if not _release_is_safe(self):
                    with _lock:
                        _deferred.append(self)  # kept: its finalizer will not run again
                    return
                release_dropped_pools()

        _pool_class = UnifiedMemoryPool
    pool = _pool_class(allocator)
    pool.uvm_device = device_index  # for a reader of a pool (torch's own attribute is C++-side only)
    _live.add(pool)
    return pool


def is_uvm_pool(pool) -> bool:
    return _pool_class is not None and isinstance(pool, _pool_class)


def _release_is_safe(dying=None) -> bool:
    """Whether a pool may die now: this thread captures no graph, and no uvm pool is being allocated
    into (torch.cuda.use_mem_pool adds one to its use count) or captured into, in any thread. A pool
    counts itself once; a CUDA graph captured into a pool holds one more until the graph is reset,
    which delays the release of every dropped pool until then (safe, and rare)."""
    torch = sys.modules.get("torch")  # imported, since a pool exists; not imported again at exit
    try:
        if torch.cuda.is_current_stream_capturing():
            return False
        return all(pool.use_count() <= 1 for pool in list(_live) if pool is not dying)
    except Exception:  # noqa: BLE001 - at interpreter exit torch may be half torn down: wait
        return False


def release_dropped_pools() -> int:
    """Lets every pool dropped at an unsafe moment die, if now is safe; returns how many still wait."""
    with _lock:
        if not _deferred or not _release_is_safe():
            return len(_deferred)
        dying = _deferred[:]
        _deferred.clear()
    del dying  # each dies here, outside the lock (its memory goes back to torch's cache, then uvm)
    with _lock:
        return len(_deferred)


def waiting() -> int:
    """How many dropped pools wait for a safe point."""
    with _lock:
        return len(_deferred)
