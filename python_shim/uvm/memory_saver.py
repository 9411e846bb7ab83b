"""torch_memory_saver's API on uvm. Switching is one import line:

    from uvm.memory_saver import torch_memory_saver

Tensors made inside `region(tag)` go to a uvm pool of that tag on the current device. `pause(tag)`
moves them off the GPU — kept in uvm's pinned staging memory with `enable_cpu_backup=True` (uvm
offload), dropped otherwise (uvm discard) — and gives the physical memory back to the driver, so
`torch.cuda.mem_get_info()` shows it free at once. `cpu_backup_backend="mmap"` keeps the CPU backup
in pageable memory mapped for it, given back at resume; `enable_disk_backup=True` keeps it in a file
per allocation of `set_disk_backup_dir`'s directory (env TMS_DISK_BACKUP_DIR), removed at resume
unless retain_cpu_backup keeps it for the next pause. `resume(tag)` maps memory again at the same
virtual addresses and copies the kept bytes back; tensors and captured CUDA graphs stay valid.

The pools are releasable device memory (CUDA virtual memory management) by default. Set
`torch_memory_saver.backing = "managed"` before the first region for uvm's managed memory instead:
then touching a paused tensor reads indeterminate bytes rather than faulting, but the driver takes
the memory back only when someone allocates, and mem_get_info shows nothing freed (docs/faq.md).

Two hook modes, as the original's. "torch": a region's tensors reach uvm through a torch MemPool of
uvm's allocator. "preload": the process was started with uvm's cudaMalloc interposer in LD_PRELOAD
(`with configure_subprocess(): start the process`; include/uvm_preload.h), and every cudaMalloc a
thread makes inside a region becomes a uvm allocation, whoever calls it; each region still gets a
torch MemPool of its own (torch's allocator) so that cached blocks never cross regions (a tensor
on another device than the region's is refused: it would land in that device's default pool). The mode is
"preload" in a process that preloads the interposer and "torch" in any other, unless set. In preload
mode, TMS_INIT_ENABLE=1 (and TMS_INIT_ENABLE_CPU_BACKUP, TMS_INIT_CPU_BACKUP_BACKEND) start every
thread inside a region with tag "default", as the original. `import uvm.memory_saver` needs no
torch; the methods import it.
"""
from __future__ import annotations

import contextlib
import ctypes
import os
import threading

from . import _lib, _pools, _preload, _prepare, nccl

_DEFAULT_TAG = "default"
_MAX_TAG_LENGTH = 63  # UVM_TAG_MAX_LENGTH
BACKINGS = ("releasable", "managed")
HOOK_MODES = ("preload", "torch")
CPU_BACKUP_BACKENDS = ("pinned", "mmap")


@contextlib.contextmanager
def _backup(kind: str):
    """Allocations this thread makes inside carry the backup uvm_pause keeps: "none", "host"
    (pinned), "mmap" or "disk" (_lib.BACKUPS)."""
    with _lib.thread_setting("backup", _lib.BACKUPS[kind]):
        yield


@contextlib.contextmanager
def _compression(on: bool):
    """Allocations this thread makes inside are paused into compressed backups (on) or plain ones."""
    with _lib.thread_setting("compression", 1 if on else 0):
        yield


def _shareable_from_env(text: str):
    """UVM_SHAREABLE: "1" or "all" for every tag, "" or "0" for none, else tags separated by commas."""
    text = text.strip()
    if text.lower() in ("1", "all", "true", "yes"):
        return "all"
    if text.lower() in ("", "0", "false", "no"):
        return frozenset()
    return frozenset(tag.strip() for tag in text.split(",") if tag.strip())


@contextlib.contextmanager
def _region_config(tag: str, kind: str):
    """Allocations this thread makes inside carry `tag` and backup `kind` (the pool is the caller's),
    compressed as compress_backups says, exportable as shareable_tags says."""
    from . import tag as uvm_tag
    from .sharing import exportable
    with uvm_tag(tag), _backup(kind), _compression(_state.compress and kind != "none"), \
            exportable(_state.is_shareable(tag)):
        yield


@contextlib.contextmanager
def _options_region_config(tag: str, enable_cpu_backup: bool, cpu_backup_backend=None, enable_disk_backup: bool = False):
    """The same from a region's options (the original's _with_region_config): in preload mode, a
    region for the interposer too."""
    with _inside_region(True), _region_config(_check_tag(tag), _backup_kind(enable_cpu_backup, enable_disk_backup, cpu_backup_backend)):
        yield


@contextlib.contextmanager
def _inside_region(inside: bool, device: int | None = None):
    """This thread's cudaMalloc calls go to uvm (True) or to the runtime (False) inside, in preload
    mode; nothing in torch mode, where the pool decides. `device`: the region's pool's device, the
    only one its cudaMalloc may allocate on (torch would put another device's memory in that
    device's default pool, outside the region: the interposer refuses it, naming both)."""
    process = _preload.in_process() if _state.mode() == "preload" else None
    if process is None:
        yield
        return
    previous = process.uvm_preload_get_region()  # first: the thread's TMS_INIT_* state is applied then
    previous_device = process.uvm_preload_get_region_device()
    process.uvm_preload_set_region(1 if inside else 0)
    if device is not None:
        _lib.check(process.uvm_preload_set_region_device(device))
    try:
        yield
    finally:
        process.uvm_preload_set_region(previous)
        process.uvm_preload_set_region_device(previous_device)


def _check_preload_settings(backing: str) -> None:
    """What preload mode cannot catch, refused by name: torch allocating without cudaMalloc, and
    managed backing (the interposer makes releasable memory), and an interposer that could not open
    libuvm (it lets the process run, failing only inside a region)."""
    process = _preload.in_process()
    reason = process.uvm_preload_load_error() if process is not None else None
    if reason:
        raise RuntimeError(f"hook_mode 'preload': uvm's cudaMalloc interposer is preloaded but {reason.decode()}. Start "
                           "the process inside uvm.memory_saver.configure_subprocess(), or set UVM_PRELOAD_LIBUVM to "
                           "the libuvm.so uvm uses")
    conf = os.environ.get("PYTORCH_CUDA_ALLOC_CONF", "") + "," + os.environ.get("PYTORCH_ALLOC_CONF", "")
    settings = {item.strip().replace(" ", "") for item in conf.replace(",", " ").split()}
    for setting, why in (("expandable_segments:True", "torch maps expandable segments with the driver API"),
                         ("backend:cudaMallocAsync", "torch allocates with cudaMallocAsync")):
        if setting in settings:
            raise RuntimeError(f"hook_mode 'preload' cannot see this process's allocations: PYTORCH_CUDA_ALLOC_CONF "
                               f"has {setting} ({why}, not cudaMalloc). Drop it, or use hook_mode 'torch'")
    if backing != "releasable":
        raise RuntimeError(f"hook_mode 'preload' makes releasable memory; backing {backing!r} needs hook_mode 'torch'")


def _check_tag(tag) -> str:
    if not isinstance(tag, str) or not tag:
        raise TypeError(f"a tag is a non-empty str, not {tag!r}")
    if len(tag.encode()) > _MAX_TAG_LENGTH:
        raise ValueError(f"tag {tag!r} is longer than {_MAX_TAG_LENGTH} bytes")
    return tag


def _backup_kind(enable_cpu_backup: bool, enable_disk_backup: bool, cpu_backup_backend) -> str:
    """The uvm backup a region's options ask for, refused by name as the original refuses them."""
    if enable_cpu_backup and enable_disk_backup:
        raise ValueError("enable_cpu_backup and enable_disk_backup are mutually exclusive")
    if cpu_backup_backend is not None:
        if not enable_cpu_backup:
            raise ValueError("cpu_backup_backend requires enable_cpu_backup=True")
        if cpu_backup_backend not in CPU_BACKUP_BACKENDS:
            raise ValueError(f"cpu_backup_backend must be one of {CPU_BACKUP_BACKENDS} or None, "
                             f"not {cpu_backup_backend!r}")
    if enable_disk_backup:
        _ensure_disk_backup_dir()
        return "disk"
    if enable_cpu_backup:
        return "mmap" if (cpu_backup_backend or _default_cpu_backup_backend()) == "mmap" else "host"
    return "none"


def _ensure_disk_backup_dir() -> None:
    """The original's default directory when none was set: env TMS_DISK_BACKUP_DIR, else a directory
    of this user's under /tmp (uvm refuses a directory another user owns, such as /tmp itself for
    anyone but root)."""
    from . import disk_backup_dir
    if disk_backup_dir() is None:
        path = os.environ.get("TMS_DISK_BACKUP_DIR") or f"/tmp/uvm-disk-backup-{os.getuid()}"
        TorchMemorySaver.set_disk_backup_dir(path)


def _env_flag(name: str) -> bool:
    """The original's reading of a boolean environment variable; anything else is refused by name."""
    value = os.environ.get(name)
    if value is None or value in ("0", "false", "FALSE", "no", "NO"):
        return False
    if value in ("1", "true", "TRUE", "yes", "YES"):
        return True
    raise ValueError(f"environment variable {name}={value!r} is not a boolean (1/true/yes or 0/false/no)")


def _default_cpu_backup_backend() -> str:
    """What a CPU backup with cpu_backup_backend=None uses: env TMS_INIT_CPU_BACKUP_BACKEND, as in the
    original, else "pinned"."""
    backend = os.environ.get("TMS_INIT_CPU_BACKUP_BACKEND") or "pinned"
    if backend not in CPU_BACKUP_BACKENDS:
        raise ValueError(f"environment variable TMS_INIT_CPU_BACKUP_BACKEND={backend!r} is not one of "
                         f"{CPU_BACKUP_BACKENDS}")
    return backend


class _State:
    """What every TorchMemorySaver of the process shares (pause acts on all regions, as the
    original's does): the pools and the tags they serve. What is paused, and what each allocation
    keeps, uvm records with the allocation itself (uvm_pause, uvm_resume)."""

    def __init__(self):
        from ._tms_internals import PoolsByRegion
        self.lock = threading.RLock()
        # -> torch.cuda.MemPool, keyed as the original keys its pools: (tag, enable_cpu_backup,
        # enable_disk_backup, cpu backup backend or "", device); cuda_graph's by (tag, backup, device).
        self.region_pools = PoolsByRegion(self.lock)
        self.graph_pools: dict[tuple, object] = {}
        self.tags: set[str] = set()
        self.backing = "releasable"
        self.compress = os.environ.get("UVM_COMPRESS_BACKUPS", "0").lower() in ("1", "true", "yes")
        self.shareable = _shareable_from_env(os.environ.get("UVM_SHAREABLE", ""))
        self.hook_mode: str | None = None  # chosen at the first use unless set (TorchMemorySaver.hook_mode)
        self.retain_read = False  # env TMS_RETAIN_CPU_BACKUP applied (at the first use of the library)
        self.memory_margin_bytes = 0

    def is_shareable(self, tag: str) -> bool:
        return self.shareable == "all" or tag in self.shareable

    def pool(self, pools: dict, key: tuple):
        """The pool of `key` in `pools` (region_pools or graph_pools; key: ..., tag-first, device-last),
        made on first use: of uvm's allocator in hook mode "torch", of torch's own in "preload"
        (the interposer catches its cudaMalloc)."""
        import torch
        from . import torch as uvm_torch
        with self.lock:
            if key not in pools:
                if self.mode() == "preload":
                    with torch.cuda.device(key[-1]):
                        pools[key] = torch.cuda.MemPool()
                else:
                    create = (uvm_torch.create_releasable_mempool if self.backing == "releasable"
                              else uvm_torch.create_unified_mempool)
                    pools[key] = create(key[-1])
                self.tags.add(key[0])
            return pools[key]

    def mode(self) -> str:
        """The hook mode, fixed at its first use: as set, else "preload" where the interposer is
        preloaded."""
        with self.lock:
            if self.hook_mode is None:
                chosen = "preload" if _preload.in_process() is not None else "torch"
                if chosen == "preload":  # before it is recorded: a refused mode is refused at every look
                    _check_preload_settings(self.backing)
                self.hook_mode = chosen
            return self.hook_mode

    def library(self):
        """libuvm, with the original's env TMS_RETAIN_CPU_BACKUP applied before its first use here."""
        lib = _lib.library()
        with self.lock:
            if not self.retain_read:
                self.retain_read = True
                if _env_flag("TMS_RETAIN_CPU_BACKUP"):
                    _lib.check(lib.uvm_set_retain_backups(1))
        return lib

    @staticmethod
    def open_region():
        """A region, capture or disable() under way: torch aborts the process if any MemPool dies while
        any thread allocates into a pool, so none dies meanwhile (uvm._pools.busy; the pools dropped
        meanwhile die at the last one's end). Entered before, so left after, the pool it guards."""
        return _pools.busy()

    def selected(self, tag: str | None) -> list[str]:
        """The tags pause(tag)/resume(tag) act on: those of regions, and in preload mode those the
        interposer allocated under (TMS_INIT_ENABLE's "default" has no region)."""
        with self.lock:
            known = set(self.tags)
            if self.mode() == "preload":
                known.update(_preload.tags(_preload.in_process()))
            return sorted(known) if tag is None else [tag] if tag in known else []

    def require_block_hook(self) -> None:
        """Hook mode "torch" pauses memory torch cuts into blocks: without uvm's block hook a block of a
        paused pool handed to a new tensor would lose its bytes or fault, so it is refused, naming why.
        "preload" pauses whole segments of pools only its regions allocate into, as the original."""
        if self.mode() == "torch":
            from . import _state as built
            built.compile_allocator()
            built.require_block_hook("uvm.memory_saver in hook_mode 'torch'")

    def devices(self) -> list[int]:
        with self.lock:
            return sorted({key[-1] for pools in (self.region_pools, self.graph_pools) for key in pools})


_state = _State()


class TorchMemorySaver:
    """torch_memory_saver.TorchMemorySaver's public surface on uvm (see the module's doc)."""

    @contextlib.contextmanager
    def region(self, tag: str = _DEFAULT_TAG, enable_cpu_backup: bool = False, enable_disk_backup: bool = False,
               cpu_backup_backend=None):
        """Tensors made inside go to a uvm pool of `tag` on the current device; pause(tag) drops them,
        or keeps them: in pinned host memory (enable_cpu_backup=True), in pageable memory given back
        at resume (cpu_backup_backend="mmap"), or in files on disk (enable_disk_backup=True; not with
        enable_cpu_backup). Regions nest."""
        _state.require_block_hook()
        import torch
        from . import sharing
        sharing.install()  # in either hook mode, its tensors can be sent to other processes
        _check_tag(tag)
        kind = _backup_kind(enable_cpu_backup, enable_disk_backup, cpu_backup_backend)
        backend = (cpu_backup_backend or _default_cpu_backup_backend()) if enable_cpu_backup else ""
        key = (tag, bool(enable_cpu_backup), bool(enable_disk_backup), backend, torch.cuda.current_device())
        pool = _state.pool(_state.region_pools, key)
        with _state.open_region(), torch.cuda.use_mem_pool(pool), _inside_region(True, key[-1]), _region_config(tag, kind):
            yield
        if kind == "host" and _prepare.enabled():  # its first pause's pinned memory, pinned meanwhile
            _prepare.preparer.ask(tag)

    @contextlib.contextmanager
    def cuda_graph(self, cuda_graph, pool=None, stream=None, capture_error_mode="global", tag: str = _DEFAULT_TAG,
                   enable_cpu_backup: bool = False, cpu_backup_backend=None):
        """torch.cuda.graph whose memory (the graph's intermediate tensors) is pausable under `tag`.
        In hook mode "torch", graphs captured with the same tag and backup setting share one uvm
        pool, as graphs sharing a graph_pool_handle do (a `pool` given is not used); in "preload",
        the graph uses `pool` (torch's graph pool, as the original) and the interposer catches its
        cudaMalloc. A replay after resume is bit-identical."""
        _state.require_block_hook()
        import torch
        from . import tag as uvm_tag
        _check_tag(tag)
        kind = _backup_kind(enable_cpu_backup, False, cpu_backup_backend)
        if _state.mode() == "preload":  # the interposer records the tags it allocates under
            with _state.open_region(), torch.cuda.graph(cuda_graph, pool=pool, stream=stream,
                                                        capture_error_mode=capture_error_mode):
                with _inside_region(True, torch.cuda.current_device()), _region_config(tag, kind):
                    yield
            return
        # The graph captures into the uvm pool of its tag, whatever `pool` says: graphs of one tag
        # share it, which is the sharing a caller's pool asks for (SGLang passes one pool to all).
        ours = _state.pool(_state.graph_pools, (tag, kind, torch.cuda.current_device()))
        with _state.open_region(), _region_config(tag, kind):
            with torch.cuda.graph(cuda_graph, pool=ours.id, stream=stream, capture_error_mode=capture_error_mode):
                yield
            # The graph holds its pool for its life: a hold, not an allocation under way.
            _pools.hold_for_graph(ours, cuda_graph)

    @contextlib.contextmanager
    def disable(self):
        """Tensors made inside use torch's own allocator, even within a region. Their pool's cached
        memory is freed on exit, or once the last open region, capture or disable() in any thread
        ends (torch aborts the process if a pool dies while another is being allocated into)."""
        import torch
        from . import tag as uvm_tag
        pools = [torch.cuda.MemPool()]
        try:
            with _state.open_region(), uvm_tag(None), _inside_region(False), torch.cuda.use_mem_pool(pools[0]):
                yield
        finally:
            _pools.retire(pools.pop())  # its last reference: it dies at a safe point

    def pause(self, tag: str | None = None) -> None:
        """Moves the memory of `tag` (None: every tag of a region) off the GPU and gives it back to
        the driver; returns when it is free. Pausing a paused tag does nothing. uvm_pause waits for
        each device in C: a daemon thread pausing when the interpreter exits is ended cleanly
        there, where inside torch's bindings the process aborted."""
        lib = _state.library()
        with _state.lock:
            for name in _state.selected(tag):
                nccl.before_pause(name)  # NCCL's registrations of its pools go first (uvm.nccl)
                try:
                    _lib.check(lib.uvm_pause(_lib.UVM_ANY_DEVICE, name.encode()))
                except BaseException:
                    nccl.after_resume(name)  # what stays on the GPU stays registered
                    raise

    def resume(self, tag: str | None = None) -> None:
        """Maps memory for `tag` (None: every tag of a region) at the same addresses and copies the
        CPU backups back (one onload per device: mapping one allocation overlaps the copies into
        the others); returns when the tensors hold their data again. Resuming a resumed tag does
        nothing. Raises MemoryError (nothing resumed) when the memory would leave less than
        memory_margin_bytes free."""
        lib = _state.library()
        with _state.lock:
            names = [name for name in _state.selected(tag) if _lib.paused_count(name)]
            if not names:
                return
            for device in _state.devices():
                self._check_margin(names, device)
            for name in names:
                _lib.check(lib.uvm_resume(_lib.UVM_ANY_DEVICE, name.encode()))  # keeps the copies if retaining
                nccl.after_resume(name)
            if not lib.uvm_get_retain_backups():
                # The original frees its backups after a resume unless told to keep them, before
                # it returns: pinned host memory holds GPU page tables (device memory), which its
                # callers see go at resume (the peer's training_engine test), not some time after.
                _lib.check(lib.uvm_release_staging())

    @staticmethod
    def _check_margin(names: list[str], device: int) -> None:
        import torch
        from . import residency
        margin = _state.memory_margin_bytes
        if not margin:
            return
        needed = sum(residency(device, tag=name)["released_bytes"] for name in names)
        free = torch.cuda.mem_get_info(device)[0]
        if needed and free < needed + margin:
            raise MemoryError(f"resume of {names} needs {needed} bytes on cuda:{device} and memory_margin_bytes="
                              f"{margin} left over, but only {free} bytes are free")

    @staticmethod
    def set_disk_backup_dir(path: str) -> None:
        """The directory disk backups go to (created if needed, mode 0700; process-wide, as the
        original's). It must be on a disk, not a tmpfs, and belong to this user: ValueError
        otherwise, naming the path and the reason."""
        from . import set_disk_backup_dir
        os.makedirs(path, mode=0o700, exist_ok=True)
        set_disk_backup_dir(path)

    def get_cpu_backup(self, x, zero_copy: bool = False):
        """The CPU copy of a paused tensor's bytes, as a CPU tensor of its dtype and shape (a clone
        unless zero_copy=True, which views uvm's host memory: valid until resume, or while retained).
        After a resume with retain_cpu_backup, the retained copy: the bytes as they were paused, at
        the same address. None when the tensor has no CPU backup (a disk backup is not in host
        memory). A zero-copy view across two pinning steps cannot be copied to a GPU in one call
        (docs/python-api.md)."""
        import torch
        if not isinstance(x, torch.Tensor) or not x.is_cuda:
            raise ValueError(f"get_cpu_backup takes a CUDA tensor, not {type(x).__name__}"
                             f"{'' if not isinstance(x, torch.Tensor) else ' on ' + str(x.device)}")
        if not x.is_contiguous():
            raise ValueError(f"get_cpu_backup takes a contiguous tensor (shape {tuple(x.shape)}, "
                             f"strides {x.stride()})")
        if x.numel() == 0:
            return torch.empty_like(x, device="cpu")
        lib = _state.library()
        host = ctypes.c_void_p()
        _lib.check(lib.uvm_get_staged_copy(x.data_ptr(), x.nbytes, ctypes.byref(host)))
        if not host.value:
            return None
        raw = torch.frombuffer((ctypes.c_uint8 * x.nbytes).from_address(host.value), dtype=torch.uint8)
        backup = raw.view(x.dtype).view(x.shape)
        return backup if zero_copy else backup.clone()

    @property
    def _impl(self):
        """The original's private names its own example programs reach into (_tms_internals.py)."""
        from ._tms_internals import Internals
        return Internals(_state, _options_region_config)

    @property
    def enabled(self) -> bool:
        return True

    @property
    def hook_mode(self) -> str:
        """"preload" (the process preloads uvm's cudaMalloc interposer: configure_subprocess) or
        "torch" (a torch MemPool of uvm's allocator per region); by default "preload" where the
        interposer is preloaded. Fixed at the first region."""
        return _state.mode()

    @hook_mode.setter
    def hook_mode(self, mode: str) -> None:
        if mode not in HOOK_MODES:
            raise ValueError(f"hook_mode must be one of {HOOK_MODES}, not {mode!r}")
        if mode == "preload" and _preload.in_process() is None:
            raise RuntimeError(
                "hook_mode 'preload' needs uvm's cudaMalloc interposer preloaded in this process, and it is not "
                f"(LD_PRELOAD={os.environ.get('LD_PRELOAD', '')!r}): start the process inside "
                "uvm.memory_saver.configure_subprocess(), as for torch_memory_saver, or use hook_mode 'torch'")
        with _state.lock:
            if (_state.region_pools or _state.graph_pools) and mode != _state.hook_mode:
                raise RuntimeError(f"set hook_mode before the first region: pools already exist in hook_mode "
                                   f"{_state.hook_mode!r}")
            if mode == "preload":
                _check_preload_settings(_state.backing)
            _state.hook_mode = mode

    def _ensure_initialized(self) -> None:
        """The original's: fixes the hook mode (checking its settings) before the first region."""
        _state.mode()

    @property
    def backing(self) -> str:
        """"releasable" (default: CUDA VMM device memory, returned to the driver on pause) or
        "managed" (uvm's managed memory). Set before the first region."""
        return _state.backing

    @backing.setter
    def backing(self, value: str) -> None:
        if value not in BACKINGS:
            raise ValueError(f"backing must be one of {BACKINGS}, not {value!r}")
        with _state.lock:
            if (_state.region_pools or _state.graph_pools) and value != _state.backing:
                raise RuntimeError("set backing before the first region: pools already exist with "
                                   f"backing {_state.backing!r}")
            if _state.hook_mode == "preload":
                _check_preload_settings(value)
            _state.backing = value

    @property
    def compress_backups(self) -> bool:
        """Whether pause keeps the backups of the regions made from now on compressed (default False,
        or env UVM_COMPRESS_BACKUPS=1): bf16 weights then take about 0.72 of their bytes on
        the link and in host memory or on disk, coded and decoded on the GPU; bytes that do not
        compress are kept as they are; every bit comes back (uvm_set_thread_compression in uvm.h).
        Set before the first region, as backing."""
        return _state.compress

    @compress_backups.setter
    def compress_backups(self, value: bool) -> None:
        if not isinstance(value, bool):
            raise TypeError(f"compress_backups is a bool, not {value!r}")
        with _state.lock:
            if (_state.region_pools or _state.graph_pools) and value != _state.compress:
                raise RuntimeError("set compress_backups before the first region: pools already exist with "
                                   f"compress_backups {_state.compress!r}")
            _state.compress = value

    @property
    def shareable_tags(self):
        """The tags whose regions (and graphs) get memory other processes can map, so that their
        tensors can be sent through torch.multiprocessing (uvm.sharing): "all", or a frozenset of tags
        (default: env UVM_SHAREABLE, "1" or "all" for every tag, or tags separated by commas; else
        none). Memory is never swapped for exportable memory when a tensor is sent: under work other
        threads launch that could lose the GPU context. NCCL can map such memory into its peers:
        register the tag through uvm.nccl, which lifts that before a pause. Set before the first
        region of those tags."""
        return _state.shareable

    @shareable_tags.setter
    def shareable_tags(self, value) -> None:
        chosen = "all" if value == "all" else frozenset(value)
        if not all(isinstance(tag, str) for tag in (chosen if chosen != "all" else ())):
            raise TypeError(f"shareable_tags is \"all\" or tags (strs), not {value!r}")
        with _state.lock:
            _state.shareable = chosen

    @property
    def retain_cpu_backup(self) -> bool:
        """Whether a resume keeps the CPU backups it brings back (default False, or env
        TMS_RETAIN_CPU_BACKUP: freed, as the original does). Kept, each stays until the next pause
        writes it again in place (pinned, readable through get_cpu_backup at the same address; a
        disk backup keeps its file; an mmap backup is replaced), its tensor is freed, or a resume
        without retaining."""
        return bool(_state.library().uvm_get_retain_backups())

    @retain_cpu_backup.setter
    def retain_cpu_backup(self, value: bool) -> None:
        _lib.check(_state.library().uvm_set_retain_backups(1 if value else 0))

    @property
    def memory_margin_bytes(self) -> int:
        """Free bytes a resume must leave on the device, else it raises MemoryError (default 0)."""
        return _state.memory_margin_bytes

    @memory_margin_bytes.setter
    def memory_margin_bytes(self, value: int) -> None:
        if isinstance(value, bool) or not isinstance(value, int) or value < 0:
            raise ValueError(f"memory_margin_bytes must be an int >= 0, not {value!r}")
        _state.memory_margin_bytes = value


@contextlib.contextmanager
def configure_subprocess():
    """Processes started inside preload uvm's cudaMalloc interposer (hook_mode "preload"), as the
    original's: LD_PRELOAD names it, and it opens the libuvm.so and the CUDA runtime this process
    uses. The interposer is built first if needed; os.environ is put back on exit."""
    with _preload.child_environment():
        yield


torch_memory_saver = TorchMemorySaver()

__all__ = ["TorchMemorySaver", "torch_memory_saver", "configure_subprocess"]
