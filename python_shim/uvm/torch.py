"""PyTorch side: the managed-memory pool, and hints on tensors and modules. torch is imported only
inside these functions, so `import uvm` works without it. Python validates and gathers byte ranges;
the C library decides and calls the driver."""
from __future__ import annotations

import array
import ctypes
import itertools
import operator
import sys

from . import _errors, _lib, _pools, _state, nccl


def create_unified_mempool(device=None, *, sync_ranks: bool = False):
    """A torch.cuda.MemPool whose memory is CUDA managed memory from uvm (cudaMallocManaged, with
    preferred location and accessed-by set to the device). Allocate into it with
    `torch.cuda.use_mem_pool(pool)`. `device` (default: the current device) is where the pool's
    allocations are made. With `sync_ranks=True` and torch.distributed initialized, every rank raises
    if any rank failed to build. Raises UnifiedMemoryUnsupportedError with the recorded reason."""
    return _create_pool(device, sync_ranks, releasable=False)


def create_releasable_mempool(device=None, *, sync_ranks: bool = False):
    """A torch.cuda.MemPool of releasable device memory from uvm (uvm_malloc_releasable: CUDA virtual
    memory management). Offload, onload and discard work on it as on a managed pool — offload always
    stages — and once all of an allocation is off the device its physical memory goes back to the
    driver: torch.cuda.mem_get_info() shows it free at once, and the next allocation does not wait
    for the driver to reclaim pages. Not managed memory: prefetch and advise refuse it, and a kernel
    touching offloaded memory faults instead of reading indeterminate bytes. Same arguments as
    create_unified_mempool. Refused (UnifiedMemoryUnsupportedError) where PyTorch's block hook is
    unavailable: a block of released memory handed to a new tensor unreported would fault."""
    return _create_pool(device, sync_ranks, releasable=True)


def _create_pool(device, sync_ranks: bool, releasable: bool):
    _state.compile_allocator()
    reason = None
    if _state._compilation_state is not _state.CompilationState.SUCCESS:
        reason = _state._compilation_error or "unknown reason"
    if sync_ranks:
        reason = _first_failure_across_ranks(reason)
    if reason is not None:
        raise _errors.UnifiedMemoryUnsupportedError(f"unified memory is unavailable: {reason}")
    if releasable:  # released memory that torch hands out unreported would fault
        _state.require_block_hook("a releasable pool")
    import torch
    from . import sharing
    sharing.install()  # its tensors go to other processes through torch.multiprocessing (managed ones fail naming why)
    index = _lib.device_ordinal(device)
    _pools.release_dropped_pools()  # a safe point
    with torch.cuda.device(index):
        pool = _pools.make(_state.allocator(releasable).allocator(), index)
    if _expandable_segments():
        _check_pool_is_uvm(pool, index)
    return pool


def release_pool(pool=None) -> int:
    """A safe point for dropped pools; not needed to free a pool any more. A pool from
    create_unified_mempool / create_releasable_mempool gives its memory back once its last reference
    is dropped, as any torch.cuda.MemPool does (the blocks of tensors that outlive it once they are
    freed, at torch.cuda.empty_cache()). A pool dropped while a uvm pool is being allocated into or
    captured into waits for a safe point (uvm._pools says why): the next pool made or dropped, or
    this call, made where no thread allocates into a pool. Returns how many dropped pools still wait.
    `pool`, if given, must be a pool uvm made (ValueError otherwise); it is not released by this call."""
    if pool is not None and not _pools.is_uvm_pool(pool):
        raise ValueError(f"release_pool takes a pool made by uvm.create_unified_mempool or "
                         f"create_releasable_mempool, not a {type(pool).__name__}")
    return _pools.release_dropped_pools()


def _expandable_segments() -> bool:
    import os
    import re
    conf = os.environ.get("PYTORCH_CUDA_ALLOC_CONF", "") + "," + os.environ.get("PYTORCH_ALLOC_CONF", "")
    return re.search(r"expandable_segments\s*:\s*true", conf, re.IGNORECASE) is not None


def _check_pool_is_uvm(pool, index: int) -> None:
    """With expandable_segments:True, whether a pool uses its pluggable allocator depends on the torch
    version (torch 2.11 does). Decided by behaviour: one small tensor is made in
    the pool and must be uvm's memory."""
    import torch
    reason = None
    try:
        with torch.cuda.device(index), torch.cuda.use_mem_pool(pool):
            probe = torch.empty(512, dtype=torch.uint8, device=f"cuda:{index}")
        if _lib.library().uvm_allocation_info(probe.data_ptr(), None, None, None) != _lib.UVM_OK:
            _lib.library().uvm_clear_last_error()
            reason = "tensors made in the pool are not uvm's memory"
        del probe
    except RuntimeError as error:
        reason = f"torch refused the pool: {error}"
    if reason is not None:
        raise _errors.UnifiedMemoryUnsupportedError(
            f"unified memory is unavailable: PYTORCH_CUDA_ALLOC_CONF has expandable_segments:True and with "
            f"torch {torch.__version__} {reason}; remove expandable_segments:True for processes that use uvm")


def _first_failure_across_ranks(reason: str | None) -> str | None:
    """With torch.distributed initialized, every rank learns the first failing rank's reason, so
    all of them raise the same error; otherwise the local reason."""
    import torch.distributed as dist
    if not (dist.is_available() and dist.is_initialized()):
        return reason
    reasons: list = [None] * dist.get_world_size()
    dist.all_gather_object(reasons, reason)
    failed = [(rank, text) for rank, text in enumerate(reasons) if text is not None]
    return f"rank {failed[0][0]}: {failed[0][1]}" if failed else None


def _span(tensor) -> tuple[int, int]:
    """(first byte, byte count) of the memory a tensor or view spans, whatever its strides."""
    if tensor.is_contiguous():
        return tensor.data_ptr(), tensor.numel() * tensor.element_size()
    low = high = 0
    for size, stride in zip(tensor.shape, tensor.stride()):
        extent = (size - 1) * stride
        if extent < 0:
            low += extent
        else:
            high += extent
    item = tensor.element_size()
    return tensor.data_ptr() + low * item, (high - low + 1) * item


def _stream_handle(stream, device_index: int | None = None) -> int:
    """A stream argument as a cudaStream_t: a torch stream, a raw handle, or None for the current
    torch stream (the legacy default stream when torch is not installed)."""
    if stream is None:
        try:
            import torch
        except ImportError:
            return 0
        stream = torch.cuda.current_stream(device_index)
    return stream.cuda_stream if hasattr(stream, "cuda_stream") else int(stream)


def _torch(what: str):
    """torch, or a clear error naming what needed it."""
    try:
        import torch
        return torch
    except ImportError:
        raise TypeError(f"{what} needs torch, which is not installed (tags and device ordinals work "
                        "without it)") from None


_NO_STREAM = object()


def _tensor_call(entry, tensor, *args, stream=_NO_STREAM) -> None:
    """Calls `entry(ptr, size, *args)` for the bytes `tensor` spans, with the stream handle last when
    `stream` is given (None: the tensor's current stream). None and empty tensors are no-ops; a
    failure names the tensor. The library validates the pointer: Python does not ask first."""
    found = _cuda_span(tensor, "tensor")
    if found is None:
        return
    ptr, size = found[1]
    if stream is not _NO_STREAM:
        args += (_stream_handle(stream, tensor.device.index),)
        _lib.note_moved(None)  # a move (prefetch, discard): one C call
    status = entry(ptr, size, *args)
    if status != _lib.UVM_OK:
        about = f"tensor of shape {tuple(tensor.shape)} and dtype {tensor.dtype} at 0x{ptr:x}"
        if status == _lib.UVM_ERROR_NOT_MANAGED:
            about += f" is {_NOT_UVM}"
        _lib.check(status, about)


# What a NOT_MANAGED failure means for a tensor, and what to do about it.
_NOT_UVM = "not managed memory from uvm (allocate it under torch.cuda.use_mem_pool(uvm.create_unified_mempool()))"


def prefetch_managed_tensor(tensor, *, device, stream=None) -> None:
    """cudaMemPrefetchAsync of the bytes `tensor` spans to `device` (a CUDA device or 'cpu'/-1), on
    `stream` (default: the current stream). None and empty tensors are no-ops."""
    _tensor_call(_lib.library().uvm_prefetch, tensor, _lib.device_ordinal(device, cpu=True), stream=stream)


def advise_managed_tensor_preferred_location(tensor, *, device) -> None:
    """cudaMemAdviseSetPreferredLocation on the bytes `tensor` spans (device or 'cpu'/-1)."""
    _tensor_call(_lib.library().uvm_advise_preferred_location, tensor, _lib.device_ordinal(device, cpu=True))


def advise_managed_tensor_accessed_by(tensor, *, device) -> None:
    """cudaMemAdviseSetAccessedBy: `device` keeps a mapping to the tensor's bytes wherever they live."""
    _tensor_call(_lib.library().uvm_advise_accessed_by, tensor, _lib.device_ordinal(device, cpu=True))


def discard_managed_tensor(tensor, *, stream=None) -> None:
    """cudaMemDiscardBatchAsync of the tensor's bytes: their contents become indeterminate and the
    pages can be reclaimed without a copy. CUDA 13 runtime and driver only."""
    _tensor_call(_lib.library().uvm_discard, tensor, stream=stream)


def _describe(what) -> str:
    """What a tensor is, for messages: a string, a (kind, name) pair, or a module's member as
    (kind, module, tensor), named only when a message needs it (a move of thousands of tensors
    should not pay for their names)."""
    if isinstance(what, str):
        return what
    if len(what) == 2:
        return f"{what[0]} {what[1]!r}"
    kind, module, tensor = what
    members = module.named_parameters() if kind == "parameter" else module.named_buffers()
    return f"{kind} {next((name for name, t in members if t is tensor), '?')!r}"


def _cuda_span(tensor, what) -> tuple[int, tuple[int, int]] | None:
    """(device, span) of a CUDA tensor without asking the library, None for nothing to do: the C
    calls validate every range themselves, and a batched one says which it refused."""
    if tensor is None:
        return None
    torch = _torch(f"a {type(tensor).__name__} as a {_describe(what)}")
    if not isinstance(tensor, torch.Tensor):
        raise TypeError(f"{_describe(what)} must be a torch.Tensor, not {type(tensor).__name__}")
    if tensor.numel() == 0:
        return None
    if not tensor.is_cuda:
        raise ValueError(f"{_describe(what)} is a {tensor.device} tensor; only CUDA tensors from a uvm pool are "
                         "managed memory")
    return tensor.device.index, _span(tensor)


# PyTorch's caching allocator rounds every block up to a multiple of this many bytes, and every block
# starts at a multiple of it from its segment (a uvm allocation, page-aligned).
BLOCK_BYTES = 512


def _block_span(tensor, span: tuple[int, int]) -> tuple[int, int]:
    """The bytes an offload of `tensor` may move: its span, and for a tensor that is its whole storage
    (a block of the caching allocator) the padding up to the block's rounded end too, where no other
    tensor can lie. Tensors then touch and move as one driver call: exact spans left a partial page
    at every padding gap undiscarded, and the benchmark model's onload lost a third of its speed
    (docs/measurements.md, "Neighbours of offloaded tensors"). A view of part of a storage moves exactly its own bytes."""
    ptr, size = span
    storage = tensor.untyped_storage()
    if ptr != storage.data_ptr() or size != storage.nbytes() or ptr % BLOCK_BYTES:
        return span
    return ptr, -(-size // BLOCK_BYTES) * BLOCK_BYTES


def _add_move_spans(tensors, whats, into: dict) -> None:
    """Adds to `into` ({device: {bytes to move: (what, the tensor's own bytes)}}) each tensor's bytes as
    _block_span gives them, `whats[i]` saying what tensors[i] is; a tensor already there (shared)
    counts once, an empty one not at all. A contiguous CUDA tensor takes a short path: a few
    attribute reads (bench/probes/gather_probe.py). Everything else goes the long
    way, which also says what is wrong. Moves give the library their tensors in slices, so only the
    first slice's reads come before the copies start (_SlicedMove)."""
    last_device, named = None, None
    for tensor, what in zip(tensors, whats):
        try:
            device = tensor.get_device()  # -1 off CUDA
            short = device >= 0 and tensor.is_contiguous()
        except AttributeError:  # not a tensor: the long path says what is wrong
            short = False
        if short:
            span = (tensor.data_ptr(), tensor.nbytes)
            if not span[1]:
                continue
        else:
            found = _cuda_span(tensor, what)
            if found is None:
                continue
            device, span = found
        block = _block_span(tensor, span)
        if device != last_device:
            last_device, named = device, into.setdefault(device, {})
        if block not in named:
            named[block] = (what, span[1])


def _members(obj, include_buffers: bool) -> tuple[list, list]:
    """The tensors of a tensor or module, and what each is (as _describe reads it): the tensors that
    named_parameters() and named_buffers() give. Making their names costs twenty times reading the
    tensors (bench/probes/gather_probe.py), so when those methods are torch's own the tensors are read from
    each submodule's dicts instead, and a message names them by searching."""
    import torch
    if isinstance(obj, torch.Tensor):
        return [obj], ["tensor"]
    kinds = [("parameter", "named_parameters", "_parameters")]
    if include_buffers:
        kinds.append(("buffer", "named_buffers", "_buffers"))
    tensors, whats = [], []
    for kind, method, own in kinds:
        if getattr(type(obj), method) is getattr(torch.nn.Module, method):
            # Each submodule once, as named_* walk them; a tensor in two submodules counts once
            # in the caller, which keys on its bytes.
            found = [t for module in obj.modules() for t in getattr(module, own).values() if t is not None]
        else:
            found = [t for _, t in getattr(obj, method)()]
        tensors += found
        whats += [(kind, obj, t) for t in found]
    return tensors, whats


def _module_spans(module, include_buffers: bool) -> dict:
    """The spans of a module's tensors, each with what it is; shared tensors count once."""
    spans: dict = {}  # span -> what (as _describe reads it)
    for tensor, what in zip(*_members(module, include_buffers)):
        found = _cuda_span(tensor, what)
        if found is not None:
            spans.setdefault(found[1], what)
    return spans


def prefetch_managed_module_parameters(module, *, device, include_buffers: bool = False, stream=None) -> int:
    """Prefetches every parameter (and buffer, if asked) of `module` to `device` with the fewest
    driver calls: adjacent tensors of one allocation become one cudaMemPrefetchAsync. Returns the
    bytes initiated, shared tensors counted once."""
    import torch
    named = _module_spans(module, include_buffers)
    if not named:
        return 0
    spans = list(named)
    ranges = _range_array(spans)
    lib = _lib.library()
    _lib.note_moved(None)
    status = lib.uvm_prefetch_ranges(ranges, len(spans), _lib.device_ordinal(device, cpu=True),
                                     _stream_handle(stream, torch.cuda.current_device()))
    _check_batch(status, spans, list(named.values()))
    return sum(size for _, size in spans)


def advise_managed_module_parameters_preferred_location(module, *, device, include_buffers: bool = False) -> None:
    """cudaMemAdviseSetPreferredLocation on every parameter (and buffer, if asked) of `module`."""
    lib = _lib.library()
    location = _lib.device_ordinal(device, cpu=True)
    for span, what in _module_spans(module, include_buffers).items():
        _check_batch(lib.uvm_advise_preferred_location(*span, location), [span], [what], index=0)


def _check_batch(status: int, spans: list, whats: list, index: int | None = None) -> None:
    """Raises for a failed batched call, naming the range the library says it refused (`whats[i]`
    says what `spans[i]` is)."""
    if status == _lib.UVM_OK:
        return
    index = _lib.library().uvm_last_error_index() if index is None else index
    if not 0 <= index < len(spans):
        _lib.check(status)
    ptr, size = spans[index]
    about = f"{_describe(whats[index])} at 0x{ptr:x} ({size} bytes)"
    if status == _lib.UVM_ERROR_NOT_MANAGED:
        about += f" is {_NOT_UVM}"
    _lib.check(status, about)


# Tensors or pool segments read between two looks at whether a slice is ready to move (_SlicedMove).
_GATHER_STEP = 64


def _list(obj, include_buffers: bool, into: list) -> None:
    """Lists what `obj` holds without reading it yet: a tensor or module as [tensors, whats] (as
    _members gives them; tensors given one by one join the list before them), a MemPool as
    ["segments", its snapshot's segments], an iterable item by item."""
    if obj is None:
        raise TypeError("nothing to move: pass tensors, a module, a MemPool, a tag or a device, not None")
    torch = _torch(f"finding managed memory in a {type(obj).__name__}")
    if isinstance(obj, torch.Tensor) and into and into[-1][0] != "segments":
        into[-1][0].append(obj)
        into[-1][1].append("tensor")
    elif isinstance(obj, (torch.Tensor, torch.nn.Module)):
        into.append(list(_members(obj, include_buffers)))
    elif isinstance(obj, torch.cuda.MemPool):
        into.append(["segments", obj.snapshot()])
    elif hasattr(obj, "__iter__"):
        for item in obj:
            _list(item, include_buffers, into)
    else:
        raise TypeError(f"cannot find managed memory in a {type(obj).__name__}: pass tensors, a module, "
                        "a MemPool, a tag or a device")


def _gather(listed: list, into: dict):
    """Adds to `into` ({device: {bytes to move: (what, bytes asked)}}) the byte ranges of what _list
    listed. A generator: it yields after every _GATHER_STEP tensors or segments, so that the caller
    can move what was found so far."""
    for first, second in listed:
        if first == "segments":
            for start in range(0, len(second), _GATHER_STEP):
                for segment in second[start:start + _GATHER_STEP]:
                    span = (segment["address"], segment["total_size"])
                    into.setdefault(segment["device"], {})[span] = ("pool segment", span[1])
                yield
        else:
            for start in range(0, len(first), _GATHER_STEP):
                _add_move_spans(first[start:start + _GATHER_STEP], second[start:start + _GATHER_STEP], into)
                yield


def _split(obj, tags: list, devices: list, rest: list) -> None:
    """Sorts what a move names into what uvm moves whole, tags (on every device) and devices (an int
    or torch.device), and the rest, whose ranges the shim finds."""
    torch = sys.modules.get("torch")  # a tensor, module or torch.device means torch is imported
    if isinstance(obj, str):
        tags.append(obj)
    elif isinstance(obj, int) and not isinstance(obj, bool):
        if obj < 0:
            raise ValueError("offload and onload act on CUDA devices, not the CPU")
        devices.append(obj)
    elif torch is not None and isinstance(obj, torch.device):
        devices.append(_lib.device_ordinal(obj))
    elif torch is not None and isinstance(obj, (torch.Tensor, torch.nn.Module, torch.cuda.MemPool)):
        rest.append(obj)
    elif obj is not None and hasattr(obj, "__iter__"):
        for item in obj:
            _split(item, tags, devices, rest)
    else:
        rest.append(obj)  # _list says what is wrong with it


def _move_selection(entry, device: int, tags: list[str], stream, extra: tuple, moved_on: set,
                    done: list | None = None) -> int:
    """The C `entry` for the allocations of `device` (UVM_ANY_DEVICE: every device) with any of
    `tags` ([]: any tag), once per device on that device's stream, each device's in one move: uvm
    chooses the allocations where the move begins, so one freed by another thread meanwhile, and
    its address given to another allocation, is never moved for it. Returns the bytes moved; adds
    the devices that moved (or failed) to `moved_on`, and each (device, tags) moved to `done`."""
    lib = _lib.library()
    devices = range(lib.uvm_device_count()) if device == _lib.UVM_ANY_DEVICE else [device]
    encoded = (ctypes.c_char_p * len(tags))(*(tag.encode() for tag in tags)) if tags else None
    moved = 0
    for index in devices:
        nbytes = ctypes.c_size_t()
        status = entry(index, encoded, len(tags), *extra, _stream_handle(stream, index), ctypes.byref(nbytes))
        if status != _lib.UVM_OK or nbytes.value:
            moved_on.add(index)
        _lib.check(status)
        if done is not None:
            done.append((index, tags))
        moved += nbytes.value
    return moved


def _staging_bytes(listed: list) -> int:
    """At most what an offload of what _list listed stages, for uvm_begin_moves: so that a first
    offload given in slices pins its staging as one block, copying while it pins. Each tensor's
    bytes and its block's padding (up to 512 bytes), shared tensors each time; a pool's segments
    whole, free space too: staging pinned ahead and left unused goes back at the group's end."""
    total = 0
    for first, second in listed:
        if first == "segments":
            total += sum(segment["total_size"] for segment in second)
        else:
            total += sum(map(operator.attrgetter("nbytes"), first)) + BLOCK_BYTES * len(first)
    return total


class _SlicedMove:
    """A move of the ranges the shim finds, given to the library a slice at a time as they are
    found (the copies of one slice run while the shim finds the next), each device's slice in one
    call of `entry` on that device's stream. A slice goes once 64 ranges wait (so the copies begin
    early), the next once 128 do, doubling up to 1,024 (fewer calls). The slices' calls are one
    group of moves (uvm_begin_moves): one move in uvm.last_move(), and staging freed once, at the
    end."""

    def __init__(self, entry, stream, extra: tuple, moved_on: set):
        self.entry, self.stream, self.extra, self.moved_on = entry, stream, extra, moved_on
        self.found: dict = {}  # {device: {bytes to move: (what, bytes asked)}}, in the order found
        self.moved: dict = {}  # {device: how many of found[device] the library has moved}
        self.slice = 64        # ranges found and not moved that make the next slice

    def move_found(self, last: bool = False) -> int:
        """Moves what was found since the last slice once it makes a slice (`last`: whatever was
        found); returns the bytes asked for."""
        waiting = sum(len(named) - self.moved.get(device, 0) for device, named in self.found.items())
        if not waiting or (waiting < self.slice and not last):
            return 0
        self.slice = min(self.slice * 2, 1024)
        asked_bytes = 0
        for device, named in self.found.items():
            start = self.moved.get(device, 0)
            if start == len(named):
                continue
            fresh = list(itertools.islice(named.items(), start, None))
            spans = [span for span, _ in fresh]
            self.moved_on.add(device)
            status = self.entry(_range_array(spans), len(spans), *self.extra, _stream_handle(self.stream, device))
            if status != _lib.UVM_OK:
                _check_batch(status, spans, [what for _, (what, _) in fresh])
            self.moved[device] = len(named)
            asked_bytes += sum(asked for _, (_, asked) in fresh)
        return asked_bytes

    def undo(self, entry, error: BaseException) -> None:
        """Moves back, with `entry` and no extra arguments, what the slices before a failure moved;
        a failure to do so is added to `error`'s notes."""
        for device, count in self.moved.items():
            spans = list(itertools.islice(self.found[device], count))
            status = entry(_range_array(spans), len(spans), _stream_handle(self.stream, device))
            if status != _lib.UVM_OK:
                error.add_note(f"uvm: moving back what was moved before the failure failed too, on device "
                               f"{device}: {_lib.library().uvm_last_error().decode(errors='replace')}")


def _move(entries, obj, stream, include_buffers: bool, *extra, undo=None, sliced: bool = True,
          stages: bool = False) -> int:
    """Moves what `obj` names: its tags and devices through the C selection entry (entries[1]), the
    ranges of the rest through the batched entry (entries[0]), as _SlicedMove gives them (with
    sliced=False, all found first: for moves that wait for their copies, which nothing overlaps).
    When any part fails, `undo` (the opposite entries: batched, selection) moves back what the parts
    before it moved — the slices, and the tags and devices — so a failed offload leaves everything it
    named on the device. `stages`: an offload that may stage, which tells the group what it expects
    to stage. Returns the bytes asked for."""
    by_ranges, by_selection = entries
    tags, devices, rest = [], [], []
    _split(obj, tags, devices, rest)
    listed: list = []
    for item in rest:
        _list(item, include_buffers, listed)
    moved, moved_on = 0, set()
    lib = _lib.library()
    _lib.check(lib.uvm_begin_moves(_staging_bytes(listed) if stages and sliced else 0))
    ranges = _SlicedMove(by_ranges, stream, extra, moved_on)
    selected: list = []  # (device, tags) moved whole, to move back should a later part fail
    try:
        try:
            if tags:  # every tag in one call per device
                moved += _move_selection(by_selection, _lib.UVM_ANY_DEVICE, list(dict.fromkeys(tags)), stream,
                                         extra, moved_on, selected)
            for device in dict.fromkeys(devices):
                moved += _move_selection(by_selection, device, [], stream, extra, moved_on, selected)
            for _ in _gather(listed, ranges.found):
                if sliced:
                    moved += ranges.move_found()
            moved += ranges.move_found(last=True)
        except BaseException as error:
            if undo is not None:
                undo_ranges, undo_selection = undo
                ranges.undo(undo_ranges, error)
                _undo_selections(undo_selection, selected, stream, error)
            raise
    finally:
        ended = lib.uvm_end_moves()
        _lib.note_moved(sorted(moved_on))  # for last_move(): the devices moved on, a failed one too
    _lib.check(ended)
    return moved


def _undo_selections(entry, selected: list, stream, error: BaseException) -> None:
    """Moves back, with the opposite selection `entry`, each (device, tags) a failed move had moved;
    a failure to do so is added to `error`'s notes."""
    for device, tags in selected:
        encoded = (ctypes.c_char_p * len(tags))(*(tag.encode() for tag in tags)) if tags else None
        nbytes = ctypes.c_size_t()
        if entry(device, encoded, len(tags), _stream_handle(stream, device), ctypes.byref(nbytes)) != _lib.UVM_OK:
            error.add_note(f"uvm: moving back {', '.join(tags) or 'everything'} on device {device} after the failure "
                           f"failed too: {_lib.library().uvm_last_error().decode(errors='replace')}")


def _range_array(spans: list):
    """A uvm_range array of (ptr, size) pairs, built as one array of 64-bit integers that the ctypes
    array shares (and keeps alive): a tenth of the cost of a ctypes object each
    (bench/probes/gather_probe.py)."""
    flat = array.array("Q", itertools.chain.from_iterable(spans))
    return (_lib.Range * len(spans)).from_buffer(flat)


def offload(obj, *, stream=None, strategy: str = "auto", include_buffers: bool = True) -> int:
    """Moves `obj` off its GPU(s) so others can use the memory; pointers stay valid and
    `onload(obj)` brings it back. `obj`: a tensor, module (parameters, and buffers unless
    include_buffers=False), MemPool, tag, device, or an iterable of these. `strategy`: "auto" (the
    measured best: "staged" on CUDA 13, else "migrate"), "migrate" (cudaMemPrefetchAsync to the CPU;
    no extra host memory), "staged" (copy into pinned memory uvm keeps, then discard), "mmap" (a copy
    in pageable memory mapped for it, given back at onload: for hosts short on pinned memory) or
    "disk" (a file per allocation in uvm.set_disk_backup_dir's directory, removed at onload).
    Asynchronous on `stream` (default: each device's current stream): synchronize before counting on
    the freed memory; "mmap" and "disk" wait for the stream and return once the copy is made. Only the bytes of what is passed move (with a whole-storage tensor's block padding,
    where no other tensor can lie); neighbours are never touched. Returns the bytes asked for,
    shared tensors counted once. Where PyTorch's block hook is unavailable (uvm warned so), "auto"
    migrates and the strategies that keep a copy raise UnifiedMemoryUnsupportedError (docs/faq.md)."""
    if strategy not in _lib.STRATEGIES:
        raise ValueError(f"strategy must be one of {sorted(_lib.STRATEGIES)}, not {strategy!r}")
    if _state.moves_must_migrate():  # no block hook: a kept copy could outlive its block
        if strategy != "auto":
            _state.require_block_hook(f"offload strategy {strategy!r}")
        strategy = "migrate"
    lib = _lib.library()
    code = _lib.STRATEGIES[strategy]
    nccl.before_pause(obj)  # a pool registered through uvm.nccl leaves NCCL first
    try:
        return _move((lib.uvm_offload_ranges, lib.uvm_offload_selection), obj, stream, include_buffers, code,
                     undo=(lib.uvm_onload_ranges, lib.uvm_onload_selection),
                     stages=code != _lib.STRATEGIES["migrate"],
                     sliced=code not in (_lib.STRATEGIES["mmap"], _lib.STRATEGIES["disk"]))
    except BaseException:
        nccl.after_resume(obj)  # a failed offload leaves its ranges on the device: registered again
        raise


def onload(obj, *, stream=None, include_buffers: bool = True) -> int:
    """Brings what `offload` moved back to its GPU: staged bytes are copied back, migrated ones
    prefetched. Same `obj` forms as offload; asynchronous on `stream`. Returns the bytes asked for."""
    lib = _lib.library()
    moved = _move((lib.uvm_onload_ranges, lib.uvm_onload_selection), obj, stream, include_buffers)
    nccl.after_resume(obj)
    return moved


def discard(obj, *, stream=None, include_buffers: bool = True) -> int:
    """cudaMemDiscardBatchAsync over everything `obj` covers (e.g. a "kv_cache" tag): the contents
    become indeterminate and the pages are reclaimable without a copy. CUDA 13 only."""
    lib = _lib.library()
    return _move((lib.uvm_discard_ranges, lib.uvm_discard_selection), obj, stream, include_buffers)


def where(tensor) -> dict:
    """{'preferred': loc, 'last_prefetch': loc} for the tensor's bytes: a device ordinal, -1 for the
    CPU, -2 when unset or mixed."""
    if tensor is None:
        raise TypeError("where() takes a tensor, not None")
    if _cuda_span(tensor, "tensor") is None:
        raise ValueError("an empty tensor has no location")
    preferred, last = ctypes.c_int(), ctypes.c_int()
    _tensor_call(_lib.library().uvm_query_location, tensor, ctypes.byref(preferred), ctypes.byref(last))
    return {"preferred": preferred.value, "last_prefetch": last.value}
