"""NCCL registrations of pausable memory kept true across a pause (docs/distributed.md, "NCCL and
pausable memory").

A buffer registered with NCCL (ProcessGroupNCCL.register_mem_pool, ncclCommRegister) is mapped, at
its first zero-copy collective, into the processes of the other ranks on the node: they map its
physical memory. A pause gives that memory back and a resume maps new memory at the same address;
the other ranks would still map the old memory, and read or write it instead. So a registered
pool's registration goes before a pause and comes back after the resume:

    registration = uvm.nccl.register(pool)         # instead of backend.register_mem_pool(pool)
    uvm.offload(pool)                              # deregisters first
    uvm.onload(pool)                               # registers again after

On one node NCCL cannot map uvm's memory at all: it maps a peer's buffer only if it can export the
buffer's memory, and uvm's memory is exportable only while it is sent through uvm.sharing. There a
registration gives no zero-copy, and NCCL 2.28 keeps a reference to each buffer whose export failed,
so a pause could not give its memory back: `register` registers nothing when every rank of the job
is on this node (torchrun's LOCAL_WORLD_SIZE equal to WORLD_SIZE), and warns. Across nodes the
network's registration holds the memory (GPUDirect RDMA), and the registration is lifted and
restored as said.

`register` also takes a uvm.memory_saver tag (its region pools in this process, in hook mode
torch): pause(tag) deregisters them first and resume(tag) registers them again. Only a move of the
registered pool or tag itself does this (not of its tensors one by one, nor of a whole device). Buffers NCCL
registers at a CUDA graph's capture (NCCL_GRAPH_REGISTER) stay registered for the graph's life:
such a graph is captured again after a resume, or its zero-copy buffers are kept out of what
pauses.
"""
from __future__ import annotations

import os
import sys
import threading
import warnings

_lock = threading.Lock()
_registrations: list["Registration"] = []


class Registration:
    """One pool's registration with one process group's NCCL backend, which uvm lifts before the
    pool's memory moves off the GPU and restores once it is back."""

    def __init__(self, pool, backend, owner):
        self.pool, self.backend, self.owner = pool, backend, owner  # owner: the pool, or the tag
        self.registered = False

    def register(self) -> None:
        if not self.registered:
            self.backend.register_mem_pool(self.pool)
            self.registered = True

    def deregister(self) -> None:
        if self.registered:
            self.backend.deregister_mem_pool(self.pool)
            self.registered = False


def _backend_of(group):
    import torch
    import torch.distributed as dist
    group = group or dist.distributed_c10d._get_default_group()
    return group._get_backend(torch.device("cuda", torch.cuda.current_device()))


def _pools_of(tag: str) -> list:
    # Regions exist only once uvm.memory_saver is imported (which imports this module: no import back).
    saver = sys.modules.get(__package__ + ".memory_saver")
    pools = [pool for key, pool in list(saver._state.region_pools.items()) if key[0] == tag] if saver else []
    if not pools:
        raise ValueError(f"uvm.nccl.register: no region pool of tag {tag!r} in this process yet (hook mode torch "
                         "makes one at the tag's first region): register after the region's tensors are made")
    return pools


def _one_node() -> bool:
    """Whether torchrun says every rank of the job runs on this node."""
    local, world = os.environ.get("LOCAL_WORLD_SIZE"), os.environ.get("WORLD_SIZE")
    return local is not None and local == world


def register(pool_or_tag, group=None, *, backend=None) -> list[Registration]:
    """Registers a uvm pool (or the region pools of a uvm.memory_saver tag) with the NCCL backend of
    `group` (default: the default process group), as ProcessGroupNCCL.register_mem_pool does, and
    has uvm deregister it before every pause or offload of it and register it again after the
    resume or onload. `backend`: the backend object itself, instead of `group`. Returns the
    registrations: none, with a warning, when every rank is on this node (see above)."""
    if _one_node():
        warnings.warn("uvm.nccl.register: every rank is on this node (LOCAL_WORLD_SIZE == WORLD_SIZE), where NCCL "
                      "cannot map uvm's memory into other processes: registering would give no zero-copy, and NCCL "
                      "would keep memory a pause must give back (docs/distributed.md); nothing registered",
                      RuntimeWarning, stacklevel=2)
        return []
    backend = backend or _backend_of(group)
    pools = _pools_of(pool_or_tag) if isinstance(pool_or_tag, str) else [pool_or_tag]
    made = [Registration(pool, backend, pool_or_tag) for pool in pools]
    for registration in made:
        registration.register()
    with _lock:
        _registrations.extend(made)
    return made


def deregister(pool_or_tag) -> None:
    """Deregisters what `register` registered for this pool or tag, and forgets it."""
    with _lock:
        gone = [r for r in _registrations if r.owner is pool_or_tag or r.owner == pool_or_tag]
        _registrations[:] = [r for r in _registrations if r not in gone]
    for registration in gone:
        registration.deregister()


def _matching(obj) -> list[Registration]:
    if not _registrations:  # the common case: nothing registered, nothing to look through
        return []
    objects = obj if isinstance(obj, (list, tuple, set)) else [obj]
    with _lock:
        return [r for r in _registrations for o in objects
                if r.owner is o or r.pool is o or (isinstance(o, str) and r.owner == o)]


def before_pause(obj) -> None:
    """Lifts the registrations of what `obj` names (a pool, a tag, or a list of them) before its
    memory leaves the GPU. A failure raises before anything moved."""
    for registration in _matching(obj):
        registration.deregister()


def after_resume(obj) -> None:
    """Restores the registrations of what `obj` names once its memory is back."""
    for registration in _matching(obj):
        registration.register()
