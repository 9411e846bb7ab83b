"""vLLM's sleep mode on uvm: the contract of vLLM's CuMemAllocator (vllm/device_allocator/cumem.py)
on uvm's releasable memory, and the plugin that puts it in that class's place.

With UVM_SWITCH naming vllm (or 1/all), `vllm.device_allocator.cumem.CuMemAllocator` is this module's
CuMemAllocator in every process started with it: vLLM's `get_mem_allocator_instance()` imports that
name when it is called, so the API server, the engine core and each worker allocate their sleep-mode
memory through uvm, no vLLM source changed. Two hooks put it there: the switch's import hook
(uvm_switch, run by uvm_switch.pth at every start) replaces the name as vLLM's module is imported,
and vLLM's own plugin entry point (`vllm.general_plugins: uvm` -> uvm.vllm_plugin) does the same where .pth
files do not run (a uvm found through PYTHONPATH). Neither touches CUDA: vLLM forks its workers.
A vLLM whose version this module does not know keeps its own allocator, and uvm says so once.

What uvm does differently, behind the same methods and views:
- The backups are uvm's: a level-1 sleep copies at the link's speed from the first sleep on (uvm's
  pinned staging, pinned once), compressed where compress_backups is set, in pageable memory or files
  where backup is "mmap" or "disk".
- The backups are kept from one sleep to the next by default (retain_backups): the host memory vLLM's
  allocator keeps too (torch's pinned cache), written again in place by the next sleep. With
  retain_backups False a wake gives them back on a thread of uvm's, after it returns, and that thread
  then pins the next sleep's memory ahead within the node's bound (uvm._prepare: half of the host's
  available memory, shared by the node's processes; UVM_PREPARE_PAUSE=0: not at all, and the next
  sleep pins for itself).
- A sleep and a wake collect only the young generations of Python's garbage (gc.collect(1)), where
  vLLM's collect all of it: in a process that imported vLLM a full collection takes about as long as
  copying 15 GiB over the link, and the memory a sleep frees is uvm's own, released whatever Python
  still refers to. UVM_VLLM_FULL_GC=1 collects everything, as vLLM's.
- A sleep whose backups cannot fit in host memory is refused before anything sleeps (pinning past
  it would bring the kernel's OOM killer).
- A wake that cannot map the memory raises RuntimeError and leaves it asleep with its backups: a
  retry after memory is freed works.
"""
from __future__ import annotations

import contextlib
import ctypes
import gc
import os
import sys
import threading
import warnings

from . import _lib

# The vLLM releases (major.minor) whose CuMemAllocator contract this class follows: checked against
# vLLM's own allocator tests (tests/peers/run_vllm_tests.sh).
SUPPORTED_VERSIONS = ("0.33",)
CUMEM_MODULE = "vllm.device_allocator.cumem"
DEFERRABLE_TAGS = ("weights", "kv_cache")  # vllm.device_allocator.DEFERRABLE_TAGS: a wake may leave these asleep
BACKUP_KINDS = {"pinned": "host", "mmap": "mmap", "disk": "disk"}  # this class's backup -> uvm's (_lib.BACKUPS)
_PREFIX = "vllm."        # uvm's tag of vLLM's tag t is "vllm.t": other users of uvm in the process keep theirs
_ASIDE = "vllm~trimmed"  # segments of pools never allocated from again, given back and out of every sleep
_told: set[str] = set()  # what patch() said on stderr, once each per process


def _say_once(message: str) -> None:
    if message not in _told:
        _told.add(message)
        print(f"uvm: {message}", file=sys.stderr)


def _env_flag(name: str, default: bool) -> bool:
    value = os.environ.get(name, "").strip().lower()
    if value in ("1", "true", "yes", "on"):
        return True
    if value in ("0", "false", "no", "off"):
        return False
    return default


class AllocationData:
    """One allocation as vLLM's allocator describes it (vllm.device_allocator.AllocationData): a torch
    pool segment. handle is (device, size, address, 0); tag is vLLM's; is_asleep: slept or discarded
    and not woken; kept: asleep with a backup. cpu_backup_tensor: while asleep with a backup, the
    backup as a uint8 CPU tensor viewing uvm's copy (valid until the wake), or a placeholder holding
    nothing where the copy is not readable in place (compressed, on disk); None otherwise, as vLLM's
    None after a wake."""

    __slots__ = ("handle", "tag", "is_asleep", "kept")

    def __init__(self, handle: tuple, tag: str, is_asleep: bool, kept: bool):
        self.handle, self.tag, self.is_asleep, self.kept = handle, tag, is_asleep, kept

    @property
    def cpu_backup_tensor(self):
        if not (self.is_asleep and self.kept):
            return None
        import torch
        _, size, address, _ = self.handle
        host = ctypes.c_void_p()
        lib = _lib.library()
        if lib.uvm_get_staged_copy(address, size, ctypes.byref(host)) != _lib.UVM_OK or not host.value:
            lib.uvm_clear_last_error()
            return torch.empty(0, dtype=torch.uint8)
        return torch.frombuffer((ctypes.c_uint8 * size).from_address(host.value), dtype=torch.uint8)

    def __repr__(self) -> str:
        return f"AllocationData(handle={self.handle}, tag={self.tag!r}, is_asleep={self.is_asleep}, kept={self.kept})"


def sleep_backups(tags, offload_tags) -> dict[str, bool]:
    """{tag: whether a sleep keeps it} for a sleep(offload_tags) of the allocator's `tags`: vLLM's
    policy, chosen at the sleep (None means the default tag, a str one tag)."""
    if offload_tags is None:
        offload_tags = (CuMemAllocator.default_tag,)
    elif isinstance(offload_tags, str):
        offload_tags = (offload_tags,)
    offload_tags = tuple(offload_tags)
    return {tag: tag in offload_tags for tag in tags}


def wake_tags(asleep, tags) -> list[str]:
    """The tags a wake_up(tags) brings back of those `asleep`: all for None, else those named and
    every tag a wake may not defer (all but weights and kv_cache)."""
    return [tag for tag in asleep if tags is None or tag in tags or tag not in DEFERRABLE_TAGS]


class CuMemAllocator:
    """vLLM's sleep-mode allocator on uvm (vllm.device_allocator.cumem.CuMemAllocator's contract):
    a singleton; tensors made inside use_memory_pool(tag) are uvm's releasable memory carrying the
    tag; sleep(offload_tags) keeps the tags named and drops the rest, discard(tags) drops tags now,
    wake_up(tags) maps them back at the same addresses (captured CUDA graphs replay). Settings, each
    read when a sleep or wake uses it: backup ("pinned", "mmap" or "disk"; env UVM_VLLM_BACKUP),
    compress_backups (env UVM_COMPRESS_BACKUPS), retain_backups (env UVM_VLLM_RETAIN_BACKUPS, on),
    full_gc (env UVM_VLLM_FULL_GC, off)."""

    instance: CuMemAllocator | None = None
    default_tag: str = "default"
    _made = threading.Lock()

    @staticmethod
    def get_instance() -> CuMemAllocator:
        """The allocator of the process (made on first use; vLLM never calls the constructor)."""
        with CuMemAllocator._made:
            if CuMemAllocator.instance is None:
                import atexit
                CuMemAllocator.instance = CuMemAllocator()
                atexit.register(CuMemAllocator._shutdown_singleton)
            return CuMemAllocator.instance

    @staticmethod
    def _shutdown_singleton() -> None:
        if CuMemAllocator.instance is not None:
            CuMemAllocator.instance.release_pools()

    def __init__(self):
        self.current_tag: str = CuMemAllocator.default_tag
        # {vLLM tag: [(torch.cuda.MemPool, uvm's pluggable allocator)]}, one pool per use_memory_pool
        # entry, as vLLM's: a pool is never allocated from after its entry ends.
        self.allocator_and_pools: dict[str, list] = {}
        self.backup = os.environ.get("UVM_VLLM_BACKUP", "pinned").strip() or "pinned"
        if self.backup not in BACKUP_KINDS:
            raise ValueError(f"UVM_VLLM_BACKUP={self.backup!r}: use one of {', '.join(BACKUP_KINDS)}")
        self.compress_backups = _env_flag("UVM_COMPRESS_BACKUPS", False)
        self.retain_backups = _env_flag("UVM_VLLM_RETAIN_BACKUPS", True)
        self.full_gc = _env_flag("UVM_VLLM_FULL_GC", False)
        self._lock = threading.RLock()
        self._kept_pinned: list[str] = []  # the tags the last sleep kept in pinned memory
        self._giving_back: threading.Thread | None = None

    # -- what vLLM's tests and callers read --

    @property
    def pointer_to_data(self) -> dict[int, AllocationData]:
        """{address: AllocationData} of every segment of the allocator's pools, asked of uvm at each
        read (a snapshot: uvm's registry is the one record of what is asleep)."""
        lib = _lib.library()
        views = {}
        for tag in list(self.allocator_and_pools):
            for found in _allocations(lib, _PREFIX + tag):
                state = _state_of(lib, found.ptr)
                if state is None:
                    continue  # freed meanwhile
                views[found.ptr] = AllocationData((found.device, found.size, found.ptr, 0), tag, bool(state.paused),
                                                  bool(state.paused) and state.backup != _lib.BACKUPS["none"])
        return views

    def get_current_usage(self) -> int:
        """Bytes of the allocator's segments, asleep or awake."""
        return sum(data.handle[1] for data in self.pointer_to_data.values())

    # -- allocation --

    @contextlib.contextmanager
    def use_memory_pool(self, tag: str | None = None):
        """Tensors made inside go to a new uvm pool of `tag` (None: "default"); nested entries keep
        their own tags. Entering a tag again first gives back the free segments of its earlier pools,
        which are never allocated from again."""
        import torch
        from . import _pools
        from . import tag as uvm_tag
        if tag is None:
            tag = CuMemAllocator.default_tag
        if not isinstance(tag, str):
            raise TypeError(f"a tag is a str, not {type(tag).__name__}")
        old_tag = self.current_tag
        self.current_tag = tag
        try:
            if tag != old_tag:
                for pool, _ in self.allocator_and_pools.get(tag, []):
                    self._trim(pool)
            pool, allocator = self._new_pool()
            self.allocator_and_pools.setdefault(tag, []).append((pool, allocator))
            with _pools.busy(), uvm_tag(_PREFIX + tag), torch.cuda.use_mem_pool(pool):
                yield
            self._trim(pool)  # what was made and freed inside (an online quantization's first copy)
        finally:
            self.current_tag = old_tag

    @contextlib.contextmanager
    def cudagraph_pool(self):
        """Yields the id of the pool CUDA graphs capture into (one, made on first use), its
        allocations tagged "cudagraph"."""
        from . import tag as uvm_tag
        with self._lock:
            if "cudagraph" not in self.allocator_and_pools:
                self.allocator_and_pools["cudagraph"] = [self._new_pool()]
            pool = self.allocator_and_pools["cudagraph"][0][0]
        old_tag = self.current_tag
        self.current_tag = "cudagraph"
        try:
            with uvm_tag(_PREFIX + "cudagraph"):
                yield pool.id
        finally:
            self.current_tag = old_tag

    @staticmethod
    def _new_pool():
        import torch
        from . import _state
        from .torch import create_releasable_mempool
        pool = create_releasable_mempool(torch.cuda.current_device())
        return pool, _state.allocator(True)

    def _trim(self, pool) -> None:
        """Gives back the free segments of `pool` (never allocated from again) and sets them aside,
        out of every later sleep and wake: vLLM's allocator frees them."""
        import torch
        lib = _lib.library()
        with self._lock:
            for segment in pool.snapshot(include_traces=False):
                if segment["allocated_size"] != 0:
                    continue
                state = _state_of(lib, segment["address"])
                if state is None or state.paused or state.released:
                    continue
                torch.accelerator.synchronize(state.device)  # as vLLM's free: kernels may still run
                _lib.check(lib.uvm_discard(state.base, state.size, None), "trimming a segment of a vLLM pool")
                _lib.check(lib.uvm_set_allocation_tag(state.base, _ASIDE.encode()), "trimming a segment of a vLLM pool")

    # -- sleep and wake --

    def sleep(self, offload_tags: tuple[str, ...] | str | None = None) -> None:
        """Frees the allocator's GPU memory: the tags in `offload_tags` (None: "default") keep their
        bytes in backups, the rest are dropped. What is asleep already keeps its policy (a warning
        says so, as vLLM's)."""
        import torch
        self._put_to_sleep(sleep_backups(list(self.allocator_and_pools), offload_tags), "sleep")
        self._collect()
        torch.accelerator.empty_cache()

    def discard(self, tags: tuple[str, ...] | str) -> None:
        """Drops the memory of `tags` now, keeping nothing."""
        if isinstance(tags, str):
            tags = (tags,)
        self._put_to_sleep({tag: False for tag in tags if tag in self.allocator_and_pools}, "discard")

    def _put_to_sleep(self, keep: dict[str, bool], call: str) -> None:
        lib = _lib.library()
        none = _lib.BACKUPS["none"]
        with self._lock:
            conflict, to_copy = False, 0
            for tag, kept in keep.items():
                for found in _allocations(lib, _PREFIX + tag):
                    state = _state_of(lib, found.ptr)
                    if state is not None and state.paused and (state.backup != none) != kept:
                        conflict = True
                    elif state is not None and not state.paused:
                        _refuse_if_mapped_elsewhere(lib, found, call, tag)
                        to_copy += found.size if kept else 0
            self._check_host_memory(lib, to_copy, call)
            for tag, kept in keep.items():
                name = _PREFIX + tag
                backup = _lib.BACKUPS[BACKUP_KINDS[self.backup]] if kept else none
                if kept and self.backup == "pinned" and tag not in self._kept_pinned:
                    self._kept_pinned.append(tag)
                elif not (kept and self.backup == "pinned") and tag in self._kept_pinned and call == "sleep":
                    self._kept_pinned.remove(tag)
                compress = 1 if kept and self.compress_backups else 0
                _checked(lib.uvm_set_backup(_lib.UVM_ANY_DEVICE, name.encode(), backup, compress, None), call, tag)
                _checked(lib.uvm_pause(_lib.UVM_ANY_DEVICE, name.encode()), call, tag)
        if conflict:
            warnings.warn(f"uvm's vLLM allocator: {call} cannot change the policy of allocations already asleep; "
                          "they keep the one they were put to sleep with", stacklevel=3)

    def _check_host_memory(self, lib, to_copy: int, call: str) -> None:
        """Refuses, before anything is released, a sleep whose backups in host memory cannot fit: the
        bytes to keep (whole allocations, as vLLM's allocator copies them; compressed ones may take
        less, and are not checked) against the host's available memory and the pinned memory uvm holds
        already (retained copies are written again in place). Pinning past the host's memory would
        bring the kernel's OOM killer, not an error."""
        if not to_copy or self.backup == "disk" or self.compress_backups:
            return
        from . import _prepare
        available = _prepare._available()
        if available is None:
            return
        held = ctypes.c_size_t()
        if lib.uvm_get_staging(ctypes.byref(held), None) != _lib.UVM_OK:
            lib.uvm_clear_last_error()
            held.value = 0
        if to_copy > available + held.value:
            raise RuntimeError(f"uvm's vLLM allocator: {call} would keep {to_copy} bytes in host memory, but the host "
                               f"has {available} bytes available and uvm holds {held.value} pinned; nothing was put "
                               "to sleep. Keep them on disk (UVM_VLLM_BACKUP=disk), compressed (UVM_COMPRESS_BACKUPS=1, "
                               "bf16 weights), or sleep at level 2")

    def wake_up(self, tags: list[str] | None = None) -> None:
        """Maps asleep memory back at its addresses and copies its backups in: every tag for None,
        else the tags named and every tag a wake may not defer (all but weights and kv_cache). Raises
        RuntimeError when the GPU has no memory for it; what could not be mapped stays asleep with its
        backups, and a later wake brings it back."""
        import torch
        self._collect()
        torch.accelerator.empty_cache()
        lib = _lib.library()
        with self._lock:
            asleep = [tag for tag in self.allocator_and_pools if _lib.paused_count(_PREFIX + tag)]
            retain = 1 if self.retain_backups else 0
            before = lib.uvm_get_retain_backups()
            _checked(lib.uvm_set_retain_backups(retain), "wake_up", None)
            try:
                for tag in wake_tags(asleep, tags):
                    _checked(lib.uvm_resume(_lib.UVM_ANY_DEVICE, (_PREFIX + tag).encode()), "wake_up", tag)
            finally:
                lib.uvm_set_retain_backups(before)
            if not retain:
                self._give_back_after_wake(list(self._kept_pinned))

    def _give_back_after_wake(self, tags: list[str]) -> None:
        """Gives the pinned memory back, then pins the next sleep's ahead (uvm._prepare's preparer, within
        the node's bound), on a thread of its own: neither is on the wake's path, and the pin never
        races the release (uvm_release_staging stops a preparation under way)."""
        def give_back_then_prepare():
            from . import _prepare
            lib = _lib.library()
            if lib.uvm_release_staging() != _lib.UVM_OK:
                lib.uvm_clear_last_error()  # a block that could not go stays; the next release tries again
            if _prepare.enabled():
                for tag in tags:
                    _prepare.preparer.ask(_PREFIX + tag)
        self._giving_back = threading.Thread(target=give_back_then_prepare, name="uvm-vllm-give-back", daemon=True)
        self._giving_back.start()

    def _collect(self) -> None:
        """Python's garbage before torch's cache is emptied: the young generations (cheap), or all of
        it with full_gc (what vLLM's allocator does)."""
        gc.collect() if self.full_gc else gc.collect(1)

    def release_pools(self) -> None:
        """Drops the allocator's pools (their memory goes back once no tensor uses it); safe to call
        more than once, and before interpreter exit (vLLM's worker does)."""
        from . import _pools
        with self._lock:
            entries = [entry for entries in self.allocator_and_pools.values() for entry in entries]
            self.allocator_and_pools.clear()
        pools = [entry[0] for entry in entries]
        entries.clear()
        while pools:
            _pools.retire(pools.pop())

    def close(self) -> None:
        """vLLM's alias of release_pools."""
        self.release_pools()


def _allocations(lib, tag: str) -> list:
    count = ctypes.c_size_t()
    _lib.check(lib.uvm_list_allocations(_lib.UVM_ANY_DEVICE, tag.encode(), None, 0, ctypes.byref(count)))
    found = (_lib.Allocation * count.value)()
    _lib.check(lib.uvm_list_allocations(_lib.UVM_ANY_DEVICE, tag.encode(), found, count.value, ctypes.byref(count)))
    return list(found)[:count.value]


def _state_of(lib, address: int):
    state = _lib.AllocationState()
    if lib.uvm_get_allocation_state(address, ctypes.byref(state)) != _lib.UVM_OK:
        lib.uvm_clear_last_error()
        return None
    return state


def _refuse_if_mapped_elsewhere(lib, found, call: str, tag: str) -> None:
    """A tensor sent through torch.multiprocessing is mapped by its receiver until it drops it: uvm_pause
    refuses that allocation's tag, but only after the tags before it slept. Refused here, before any."""
    count = ctypes.c_size_t()
    pids = (ctypes.c_int * 4)()
    if lib.uvm_share_importers(found.ptr, pids, len(pids), ctypes.byref(count)) != _lib.UVM_OK:
        lib.uvm_clear_last_error()
        return  # uvm_pause checks again, and names what went wrong
    if count.value:
        more = f" and {count.value - 1} more" if count.value > 1 else ""
        raise RuntimeError(f"uvm's vLLM allocator: {call} of tag {tag!r} refused: the allocation at {found.ptr:#x} "
                           f"({found.size} bytes) is mapped by process {pids[0]}{more} (a tensor sent through "
                           "torch.multiprocessing); nothing was put to sleep. The receiver drops the tensor first")


def _checked(status: int, call: str, tag: str | None) -> None:
    """vLLM's callers catch RuntimeError (an OOM at a wake): every failure is one, naming the call."""
    try:
        _lib.check(status)
    except RuntimeError:
        raise
    except Exception as error:  # MemoryError, ValueError, OSError: uvm's own kinds
        where = f" of tag {tag!r}" if tag else ""
        raise RuntimeError(f"uvm's vLLM allocator: {call}{where} failed: {error}") from error


# -- the plugin --

def vllm_version() -> str | None:
    """The installed vLLM's version, None if it is not installed."""
    from importlib import metadata
    try:
        return metadata.version("vllm")
    except metadata.PackageNotFoundError:
        return None


def supported(version: str | None) -> bool:
    return version is not None and ".".join(version.split(".")[:2]) in SUPPORTED_VERSIONS


def patch(module) -> bool:
    """Puts CuMemAllocator in vLLM's cumem `module` (the original stays as
    module.vllm_CuMemAllocator). Refused, said once, for a vLLM version this module does not know,
    and where vLLM's own allocator was made already (its memory would be split between two)."""
    if getattr(module, "__uvm_switch__", False):
        return True
    version = vllm_version()
    if not supported(version):
        _say_once(f"vLLM {version or '(no version installed)'} is not a version uvm's sleep-mode allocator knows "
                  f"(it knows {', '.join(SUPPORTED_VERSIONS)}); vLLM keeps its own CuMemAllocator")
        return False
    original = getattr(module, "CuMemAllocator", None)
    if original is None:
        _say_once(f"{module.__name__} has no CuMemAllocator; vLLM keeps its own allocator")
        return False
    if getattr(original, "instance", None) is not None:
        _say_once("vLLM made its own CuMemAllocator before uvm's plugin ran; it stays (set UVM_SWITCH before the "
                  "process starts)")
        return False
    module.vllm_CuMemAllocator = original
    module.CuMemAllocator = CuMemAllocator
    module.__uvm_switch__ = True
    return True
