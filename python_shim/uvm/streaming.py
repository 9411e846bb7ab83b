"""uvm.stream: run a module whose weights do not fit the GPU. Each layer's weights live in one
releasable uvm allocation whose bytes stay staged in pinned host memory; a forward pre-hook fetches
the layers ahead on a side stream while the current one computes (uvm_fetch_ranges) and lets the
layers behind go with no copy out (uvm_drop_clean_ranges), so that at most `budget_bytes` are on
the GPU, counted by uvm's own books. Addresses never change: CUDA graphs of a layer stay valid."""
from __future__ import annotations

import ctypes
import itertools

from . import _lib
from .torch import BLOCK_BYTES, _torch

_GRANULE = 2 << 20   # releasable memory is mapped in 2 MiB granules: a layer's allocation is whole ones
_names = itertools.count()


class _DeviceBytes:
    """Raw device memory as torch.as_tensor takes it (the CUDA array interface), zero-copy."""

    def __init__(self, ptr: int, size: int):
        self.__cuda_array_interface__ = {"shape": (size,), "typestr": "|u1", "data": (ptr, False), "version": 2}


def _round_up(n: int, to: int) -> int:
    return (n + to - 1) // to * to


def _find_layers(module) -> list:
    """A Sequential's children, else the largest ModuleList of the module (a decoder's blocks)."""
    torch = _torch("uvm.stream")
    if isinstance(module, torch.nn.Sequential):
        return list(module)
    lists = [m for m in module.modules() if isinstance(m, torch.nn.ModuleList) and len(m) > 0]
    if not lists:
        raise ValueError("uvm.stream found no layers to stream: the module is not a torch.nn.Sequential and has "
                         "no torch.nn.ModuleList of blocks; pass layers=[...]")
    return list(max(lists, key=lambda m: sum(p.numel() * p.element_size() for p in m.parameters())))


class Streamed:
    """What uvm.stream returns: the streamed module's state. A context manager; undo() (also on
    leaving the with block) brings every weight back to ordinary GPU memory and removes the hooks."""

    def __init__(self, module, budget_bytes: int, layers, device, stream_tag: str | None, keep_layers: bool = True):
        torch = _torch("uvm.stream")
        self.module, self.lib = module, _lib.library()
        self.device = _lib.device_ordinal(device)
        self.tag = stream_tag or f"uvm.stream/{next(_names)}"
        self.layers = list(layers) if layers is not None else _find_layers(module)
        # A parameter registered more than once (tied embeddings, weights shared between layers)
        # stays where it is: it would have to be on the GPU for more than one layer.
        registered: dict = {}
        for _, p in module.named_parameters(remove_duplicate=False):
            registered[id(p)] = registered.get(id(p), 0) + 1
        self._params = [[p for p in layer.parameters() if registered.get(id(p)) == 1] for layer in self.layers]
        kept = {id(p) for ps in self._params for p in ps}
        self.rest_bytes = sum(p.numel() * p.element_size() for p in module.parameters()
                              if id(p) not in kept and p.device.type == "cuda")
        self.layer_bytes = [_round_up(sum(_round_up(p.numel() * p.element_size(), BLOCK_BYTES) for p in ps) or 1, _GRANULE)
                            for ps in self._params]
        self.budget_bytes = budget_bytes
        self.layer_budget = budget_bytes - self.rest_bytes
        if self.layer_budget < max(self.layer_bytes):
            raise ValueError(f"uvm.stream: budget_bytes={budget_bytes} cannot hold the module's resident parameters "
                             f"({self.rest_bytes} bytes) and its largest layer ({max(self.layer_bytes)} bytes)")
        self.kept_layers = self._layers_to_keep() if keep_layers else []
        self._kept = set(self.kept_layers)
        self.peak_resident_bytes = 0
        self._resident: set[int] = set()
        self._previous: int | None = None
        self._side = torch.cuda.Stream(self.device)
        self._arrived = [torch.cuda.Event() for _ in self.layers]
        self._bases: list[int] = []
        self._originals: list[list] = []
        self._hooks = []
        self._spare_limit_before = None
        # Whatever fails on the way (a copy half-way through a layer, the spare limit) is undone
        # whole: every weight back where it was, no hook left on the module, nothing of uvm's kept.
        with torch.cuda.device(self.device):
            try:
                for i in range(len(self.layers)):
                    self._adopt(i)
                # Each step drops one layer and fetches the next: the dropped layer's physical memory
                # is kept for it (uvm_set_spare_limit) rather than given back to the driver while the
                # fetch before it copies, which slows that copy by 11 %. Within the budget: it is
                # taken again before the next fetch could count it twice.
                limit = ctypes.c_size_t()
                _lib.check(self.lib.uvm_get_spare_limit(self.device, ctypes.byref(limit)))
                self._spare_limit_before = limit.value
                _lib.check(self.lib.uvm_set_spare_limit(self.device, max(limit.value, max(self.layer_bytes))))
                # Last: once the hooks are on, the module streams.
                self._hooks = [layer.register_forward_pre_hook(self._pre_hook(i)) for i, layer in enumerate(self.layers)]
            except BaseException:
                self.undo()
                raise

    # --- set-up and undo ---

    def _layers_to_keep(self) -> list:
        """The first layers, as many as the budget holds beside a window of four of the largest
        (the one running, the one before it, one arriving and one queued behind it): they are
        fetched once and stay. When every layer rotates through the budget, each is dropped before
        it comes round again (the one needed farthest ahead is the one just used), so a forward
        moves every byte; keeping what fits moves only the rest."""
        if sum(self.layer_bytes) <= self.layer_budget:
            return list(range(len(self.layers)))
        room = self.layer_budget - 4 * max(self.layer_bytes)
        kept = []
        for i, nbytes in enumerate(self.layer_bytes):
            if nbytes > room:
                break
            kept.append(i)
            room -= nbytes
        return kept

    def _ranges(self, indices) -> ctypes.Array:
        ranges = (_lib.Range * len(indices))()
        for k, i in enumerate(indices):
            ranges[k].ptr, ranges[k].size = self._bases[i], self.layer_bytes[i]
        return ranges

    def _adopt(self, i: int) -> None:
        """Moves layer i's weights into one releasable allocation, then stages it on the host."""
        from . import tag  # uvm's own package: loaded by the time a module is streamed
        torch = _torch("uvm.stream")
        stream = torch.cuda.current_stream(self.device)
        with tag(self.tag):
            base = self.lib.uvm_malloc_releasable(self.layer_bytes[i], self.device, stream.cuda_stream)
        if not base:
            _lib.check(self.lib.uvm_last_status(), f"uvm.stream: allocating layer {i} ({self.layer_bytes[i]} bytes)")
        self._bases.append(base)
        flat = torch.as_tensor(_DeviceBytes(base, self.layer_bytes[i]), device=f"cuda:{self.device}")
        # Recorded as each weight moves: a copy that fails half-way leaves undo() the ones moved
        # before it, which would otherwise point into memory undo() frees.
        offset, originals = 0, []
        self._originals.append(originals)
        for p in self._params[i]:
            nbytes = p.numel() * p.element_size()
            slot = flat[offset:offset + nbytes].view(p.dtype).view(p.shape)
            slot.copy_(p.data)
            originals.append(p.device)
            p.data = slot
            offset += _round_up(nbytes, BLOCK_BYTES)
        _lib.check(self.lib.uvm_offload_ranges(self._ranges([i]), 1, _lib.STRATEGIES["staged"], stream.cuda_stream),
                   f"uvm.stream: staging layer {i}")

    def undo(self) -> None:
        """Every weight back in ordinary memory on the device it came from; hooks removed; uvm's
        allocations freed. Safe to call twice."""
        torch = _torch("uvm.stream")
        for hook in self._hooks:
            hook.remove()
        self._hooks = []
        stream = torch.cuda.current_stream(self.device)
        for i, base in enumerate(self._bases):
            if i in self._resident:
                stream.wait_event(self._arrived[i])
            else:
                _lib.check(self.lib.uvm_fetch_ranges(self._ranges([i]), 1, stream.cuda_stream, None),
                           f"uvm.stream: bringing layer {i} back")
            for p, where in zip(self._params[i], self._originals[i] if i < len(self._originals) else []):
                p.data = p.data.to(where, copy=True)
            stream.synchronize()
            self.lib.uvm_free(base, self.layer_bytes[i], self.device, stream.cuda_stream)
            self._resident.discard(i)
        self._bases = []
        if self._spare_limit_before is not None:
            _lib.check(self.lib.uvm_set_spare_limit(self.device, self._spare_limit_before))
            self._spare_limit_before = None

    def __enter__(self):
        return self

    def __exit__(self, *exc) -> None:
        self.undo()

    # --- the forward ---

    def resident_bytes(self) -> int:
        """The streamed layers' bytes on the GPU, as uvm's books count them."""
        result = _lib.Residency()
        _lib.check(self.lib.uvm_get_residency(self.device, self.tag.encode(), ctypes.byref(result)))
        return result.device_bytes

    def _pre_hook(self, i: int):
        def hook(_module, _args):
            self._arrive(i)
        return hook

    def _distance(self, frm: int, to: int) -> int:
        """How many layers after `frm` layer `to` runs, going round (the next forward starts over)."""
        return (to - frm) % len(self.layers)

    def _fetch(self, j: int) -> None:
        # No wait for other streams: uvm orders a fetch after the drop of the same bytes, and the
        # drop after the kernels that read them (it was issued on their stream).
        _lib.check(self.lib.uvm_fetch_ranges(self._ranges([j]), 1, self._side.cuda_stream, None),
                   f"uvm.stream: fetching layer {j}")
        self._arrived[j].record(self._side)
        self._resident.add(j)

    def _drop(self, k: int, stream) -> None:
        _lib.check(self.lib.uvm_drop_clean_ranges(self._ranges([k]), 1, stream.cuda_stream),
                   f"uvm.stream: dropping layer {k}")
        self._resident.discard(k)

    def _make_room(self, i: int, j: int, protected: set) -> bool:
        """Drops resident layers needed later than j (seen from i), farthest first, until j fits the
        budget; False (nothing dropped) if it cannot."""
        torch = _torch("uvm.stream")
        need = self.resident_bytes() + self.layer_bytes[j] - self.layer_budget
        later = sorted((k for k in self._resident
                        if k not in protected and k not in self._kept and self._distance(i, k) > self._distance(i, j)),
                       key=lambda k: -self._distance(i, k))
        if need > sum(self.layer_bytes[k] for k in later):
            return False
        stream = torch.cuda.current_stream(self.device)
        for k in later:
            if need <= 0:
                break
            self._drop(k, stream)
            need -= self.layer_bytes[k]
        return True

    def _arrive(self, i: int) -> None:
        torch = _torch("uvm.stream")
        if torch.is_grad_enabled() and any(p.requires_grad for p in self._params[i]):
            # Autograd would keep views of the weights for a backward that runs after they are gone.
            raise RuntimeError("uvm.stream runs inference only: call the module under torch.no_grad() or "
                               "torch.inference_mode(), or undo() the streaming to train")
        # The layer that ran last is kept one step longer: dropping it would make the host wait for
        # its kernels, with nothing queued behind them.
        protected = {i} if self._previous is None else {i, self._previous}
        if i not in self._resident:
            if not self._make_room(i, i, {i}):
                raise RuntimeError(f"uvm.stream: layer {i} does not fit the budget")  # cannot happen: checked at set-up
            self._fetch(i)
        torch.cuda.current_stream(self.device).wait_event(self._arrived[i])
        for step in range(1, len(self.layers)):
            j = (i + step) % len(self.layers)
            if j in self._resident:
                continue
            if not self._make_room(i, j, protected):
                break
            self._fetch(j)
        self._previous = i
        self.peak_resident_bytes = max(self.peak_resident_bytes, self.resident_bytes())


def stream(module, *, budget_bytes: int, layers=None, device=None, tag: str | None = None,
           keep_layers: bool = True) -> Streamed:
    """Streams `module`'s layers through the GPU so that at most `budget_bytes` of its parameters are
    on it at once: the layers' weights move to uvm (host copies in pinned memory), and each layer's
    forward fetches the next ones on a side stream and lets the ones behind go without copying them
    out (weights must not change while streamed: undo() first to train). `layers`: the blocks, in
    the order the forward runs them (default: a Sequential's children, or the module's largest
    ModuleList); the other parameters stay where they are and count against the budget.
    `keep_layers`: the first layers that fit the budget beside a window of four stay on the GPU
    once fetched (`kept_layers` lists them), so a forward moves only the others; False: every layer
    rotates through the budget. Use as a context manager, or call undo(). Outputs are those of the
    resident module, bit for bit."""
    if not isinstance(budget_bytes, int) or budget_bytes <= 0:
        raise ValueError(f"uvm.stream: budget_bytes must be a positive int, not {budget_bytes!r}")
    return Streamed(module, budget_bytes, layers, device, tag, keep_layers)
