"""The RL sleep/wake cycle, end to end: what the stacks that sleep and wake a model between rollouts
and training steps (SGLang, verl, slime, Megatron-LM's RL loop) pay for it, with every method in one
run on one GPU.

The model is a Llama-style decoder in plain torch with synthetic bf16 weights (32 layers: q/k/v
with biases, o, SwiGLU gate/up/down, two RMSNorms each, embedding and LM head: 387 tensors, 3.6 GiB)
and a KV cache (1 GiB) under its own tag. Decode steps (batch 8) are replayed from a CUDA graph that
writes the cache. One cycle:

  decode   zero the cache, replay 16 decode steps; the tokens and logits must be bit-identical to
           the first decode before any sleep
  sleep    weights kept (CPU backup / offload), KV cache dropped (discard / no backup)
  claim    a training-like step allocates the freed memory with plain torch (timed: it belongs to the
           cycle), touches it and frees it
  wake     weights and cache back on the GPU

Two patterns of claim:
  big   one plain allocation of (free memory before the sleep + 90 % of what the sleep freed): the
        driver must hand back everything, and the wake runs right after a giant free
  full  a plain "ballast" keeps the GPU otherwise full (256 MiB left), and the claim is 90 % of what
        the sleep freed: it can only come from released memory

Methods (each in a child process, one after another):
  uvm releasable          uvm.create_releasable_mempool pools; uvm.offload/discard, uvm.onload
  uvm managed             the same on uvm's managed pools (create_unified_mempool)
  uvm memory_saver        uvm.memory_saver (torch_memory_saver's API), retain_cpu_backup=True
  uvm memory_saver        the same with its default retain_cpu_backup=False
  (no retain)
  torch_memory_saver      the original (if installed), hook_mode "torch", retain_cpu_backup=True
  torch_memory_saver      the same with its default retain_cpu_backup=False
  (no retain)
  uvm memory_saver        uvm.memory_saver in hook mode "preload": the child is started inside its
  (preload)               configure_subprocess(), so uvm's cudaMalloc interposer is preloaded there
  torch_memory_saver      the original in hook mode "preload" (its configure_subprocess()), as SGLang
  (preload)               runs it; both with retain_cpu_backup=True
  per-tensor prefetch     Megatron-Core's unified-memory path: advise + one cudaMemPrefetchAsync per
                          parameter (uvm's Megatron-compatible functions), the cache prefetched too
  pinned memcpy           the limit: one copy of the weights' bytes to pinned memory and back; it
                          frees nothing, so it has no claim

    python -m uvm bench rl [--cycles 4] [--patterns big,full] [--methods ...] [--idle-before-sleep S] [--out DIR]

Writes results.json, results.md and rl_cycle.png (if matplotlib is there) to --out. The managed
pools stay far below 25 % of the card.
"""
from __future__ import annotations

import argparse
import contextlib
import json
import os
import statistics
import subprocess
import sys
import time

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from offload_bench import environment as machine_and_versions  # noqa: E402  (one record of the machine)
from offload_bench import timed  # noqa: E402  (seconds of an action, the GPU synchronized around it)

LAYERS, HIDDEN, INTER, HEADS, KV_HEADS, VOCAB = 32, 2048, 8192, 16, 4, 32000
BATCH, SEQ, STEPS = 8, 2048, 16
HEAD_DIM = HIDDEN // HEADS
GiB = 1 << 30
METHODS = ["uvm releasable", "uvm managed", "uvm memory_saver", "uvm memory_saver (no retain)",
           "torch_memory_saver", "torch_memory_saver (no retain)", "uvm memory_saver (preload)",
           "torch_memory_saver (preload)", "per-tensor prefetch", "pinned memcpy"]


class Decoder(torch.nn.Module):
    """Per layer: attention norm, q/k/v (with biases), o, MLP norm, gate/up/down: 12 tensors."""

    def __init__(self):
        super().__init__()
        kw = {"device": "cuda", "dtype": torch.bfloat16}
        self.embed = torch.nn.Parameter(torch.empty(VOCAB, HIDDEN, **kw))
        self.layers = torch.nn.ModuleList()
        for _ in range(LAYERS):
            layer = torch.nn.Module()
            layer.attn_norm = torch.nn.Parameter(torch.empty(HIDDEN, **kw))
            layer.q = torch.nn.Linear(HIDDEN, HIDDEN, bias=True, **kw)
            layer.k = torch.nn.Linear(HIDDEN, KV_HEADS * HEAD_DIM, bias=True, **kw)
            layer.v = torch.nn.Linear(HIDDEN, KV_HEADS * HEAD_DIM, bias=True, **kw)
            layer.o = torch.nn.Linear(HIDDEN, HIDDEN, bias=False, **kw)
            layer.mlp_norm = torch.nn.Parameter(torch.empty(HIDDEN, **kw))
            layer.gate = torch.nn.Linear(HIDDEN, INTER, bias=False, **kw)
            layer.up = torch.nn.Linear(HIDDEN, INTER, bias=False, **kw)
            layer.down = torch.nn.Linear(INTER, HIDDEN, bias=False, **kw)
            self.layers.append(layer)
        self.norm = torch.nn.Parameter(torch.empty(HIDDEN, **kw))
        self.lm_head = torch.nn.Parameter(torch.empty(VOCAB, HIDDEN, **kw))

    def init_weights(self):
        """Synthetic weights, the same for every method. Called outside the weights' pool, so that
        its temporaries do not stay cached there (and move with every sleep)."""
        generator = torch.Generator("cuda").manual_seed(0)
        with torch.no_grad():
            for name, p in self.named_parameters():
                if name.endswith("norm"):
                    p.fill_(1.0)
                else:
                    p.copy_(torch.randn(p.shape, device="cuda", generator=generator) * 0.02)


def rms_norm(x, weight):
    x32 = x.float()
    return (x32 * torch.rsqrt(x32.pow(2).mean(-1, keepdim=True) + 1e-6)).to(x.dtype) * weight


class DecodeState:
    """The static tensors one captured decode step reads and writes (plain memory)."""

    def __init__(self):
        self.tokens = torch.zeros(BATCH, dtype=torch.long, device="cuda")
        self.pos = torch.zeros(1, dtype=torch.long, device="cuda")
        self.history = torch.zeros(BATCH, STEPS, dtype=torch.long, device="cuda")
        self.logits = torch.zeros(BATCH, VOCAB, dtype=torch.float32, device="cuda")
        self.positions = torch.arange(SEQ, device="cuda")

    def reset(self, cache):
        cache.zero_()
        self.tokens.copy_(torch.arange(BATCH, device="cuda") * 7 + 1)
        self.pos.zero_()


def decode_step(model: Decoder, cache, s: DecodeState):
    x = model.embed[s.tokens]
    visible = (s.positions <= s.pos).view(1, 1, SEQ)
    for i, layer in enumerate(model.layers):
        h = rms_norm(x, layer.attn_norm)
        q = layer.q(h).view(BATCH, HEADS, HEAD_DIM)
        k = layer.k(h).view(BATCH, KV_HEADS, 1, HEAD_DIM)
        v = layer.v(h).view(BATCH, KV_HEADS, 1, HEAD_DIM)
        cache[i, 0].index_copy_(2, s.pos, k)
        cache[i, 1].index_copy_(2, s.pos, v)
        keys = cache[i, 0].repeat_interleave(HEADS // KV_HEADS, dim=1)      # B, H, S, D
        values = cache[i, 1].repeat_interleave(HEADS // KV_HEADS, dim=1)
        scores = torch.einsum("bhd,bhsd->bhs", q.float(), keys.float()) / HEAD_DIM ** 0.5
        weights = torch.softmax(scores.masked_fill(~visible, float("-inf")), dim=-1)
        attended = torch.einsum("bhs,bhsd->bhd", weights, values.float()).to(x.dtype).reshape(BATCH, HIDDEN)
        x = x + layer.o(attended)
        h = rms_norm(x, layer.mlp_norm)
        x = x + layer.down(torch.nn.functional.silu(layer.gate(h)) * layer.up(h))
    s.logits.copy_((rms_norm(x, model.norm) @ model.lm_head.T).float())
    s.tokens.copy_(s.logits.argmax(dim=-1))
    s.history.index_copy_(1, s.pos, s.tokens.view(BATCH, 1))
    s.pos.add_(1)


def capture(model, cache, state) -> torch.cuda.CUDAGraph:
    state.reset(cache)
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side), torch.no_grad():
        for _ in range(2):
            decode_step(model, cache, state)
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.no_grad(), torch.cuda.graph(graph):
        decode_step(model, cache, state)
    return graph


def decode(graph, cache, state):
    state.reset(cache)
    for _ in range(STEPS):
        graph.replay()
    torch.cuda.synchronize()
    return state.history.clone(), state.logits.clone()


def saver_of(method: str):
    """The torch_memory_saver object a method's row uses (uvm's or the original's), set to its hook
    mode and retain_cpu_backup; None for a row that is no saver."""
    if method.startswith("uvm memory_saver"):
        from uvm.memory_saver import torch_memory_saver as saver
    elif method.startswith("torch_memory_saver"):
        from torch_memory_saver import torch_memory_saver as saver
    else:
        return None
    saver.hook_mode = "preload" if "(preload)" in method else "torch"
    saver.retain_cpu_backup = "no retain" not in method
    return saver


def selected_methods(parser: argparse.ArgumentParser, text: str, known: list[str]) -> list[str]:
    """The methods --methods names, in order, refusing unknown ones; torch_memory_saver's rows left
    out (and said so) when it is not installed."""
    methods = [m.strip() for m in text.split(",") if m.strip()]
    unknown = set(methods) - set(known)
    if unknown:
        parser.error(f"unknown methods {sorted(unknown)}; choose from {known}")
    if peer_version() is None:
        methods = [m for m in methods if not m.startswith("torch_memory_saver")]
        print("torch_memory_saver is not installed: its rows are left out", flush=True)
    return methods


class Method:
    """Where the model and cache live, and how they sleep and wake."""

    def __init__(self, name: str):
        self.name = name
        self.saver = saver_of(name)

    def build(self):
        import uvm
        name = self.name
        if self.saver is not None:
            with self.saver.region(tag="weights", enable_cpu_backup=True):
                model = Decoder()
            with self.saver.region(tag="kv_cache"):
                cache = self.new_cache()
        elif name in ("uvm releasable", "uvm managed", "per-tensor prefetch"):
            create = uvm.create_releasable_mempool if name == "uvm releasable" else uvm.create_unified_mempool
            self.pools = [create(), create()]
            with uvm.tag("weights"), torch.cuda.use_mem_pool(self.pools[0]):
                model = Decoder()
            with uvm.tag("kv"), torch.cuda.use_mem_pool(self.pools[1]):
                cache = self.new_cache()
        else:  # pinned memcpy
            model, cache = Decoder(), self.new_cache()
            self.flat = torch.empty(sum(p.numel() for p in model.parameters()), dtype=torch.bfloat16, device="cuda")
            self.host = torch.empty(self.flat.numel(), dtype=torch.bfloat16, pin_memory=True)
        model.init_weights()
        self.model, self.cache = model, cache
        return model, cache

    @staticmethod
    def new_cache():
        return torch.zeros(LAYERS, 2, BATCH, KV_HEADS, SEQ, HEAD_DIM, dtype=torch.bfloat16, device="cuda")

    def sleep_steps(self) -> list:
        """The calls a sleep makes, in order: (label, call)."""
        import uvm
        if self.saver is not None:
            return [("pause kv_cache", lambda: self.saver.pause("kv_cache")),
                    ("pause weights", lambda: self.saver.pause("weights"))]
        if self.name in ("uvm releasable", "uvm managed"):
            # The cache first, as the drop-in's row and SGLang pause it: its release then runs on the
            # driver while the weights copy, not right before the claim (docs/measurements.md).
            return [("discard kv", lambda: uvm.discard("kv")), ("offload weights", lambda: uvm.offload("weights"))]
        if self.name == "per-tensor prefetch":
            def away():
                for p in self.model.parameters():
                    uvm.advise_managed_tensor_preferred_location(p, device=-1)
                    uvm.prefetch_managed_tensor(p, device=-1)
                uvm.prefetch_managed_tensor(self.cache, device=-1)
            return [("prefetch to cpu", away)]
        return [("copy to pinned", lambda: self.host.copy_(self.flat, non_blocking=True))]

    def wake_steps(self) -> list:
        """The calls a wake makes, in order: (label, call)."""
        import uvm
        if self.saver is not None:
            return [("resume weights", lambda: self.saver.resume("weights")),
                    ("resume kv_cache", lambda: self.saver.resume("kv_cache"))]
        if self.name in ("uvm releasable", "uvm managed"):
            return [("onload weights+kv", lambda: uvm.onload(["weights", "kv"]))]
        if self.name == "per-tensor prefetch":
            def back():
                device = torch.cuda.current_device()
                for p in self.model.parameters():
                    uvm.advise_managed_tensor_preferred_location(p, device=device)
                    uvm.prefetch_managed_tensor(p, device=device)
                uvm.prefetch_managed_tensor(self.cache, device=device)
            return [("prefetch to gpu", back)]
        return [("copy from pinned", lambda: self.flat.copy_(self.host, non_blocking=True))]


def run_steps(steps: list, returned: dict) -> None:
    """Makes the calls in order, noting in `returned` the seconds each took to return (no
    synchronization between them, so that asynchronous calls overlap as they would in use)."""
    for label, call in steps:
        start = time.perf_counter()
        call()
        returned[label] = time.perf_counter() - start


def child_environment(method_name: str):
    """What the child of a preload row is started inside: its library's configure_subprocess()."""
    if "(preload)" not in method_name:
        return contextlib.nullcontext()
    if method_name.startswith("uvm"):
        from uvm.memory_saver import configure_subprocess
    else:
        from torch_memory_saver import configure_subprocess
    return configure_subprocess()


def wake_report(method_name: str) -> dict:
    """uvm's own account of the wake just timed (uvm.last_move): seconds, bytes and GB/s per phase.
    Only for the native methods, whose wake is one onload (memory_saver's is one resume a tag)."""
    if method_name not in ("uvm releasable", "uvm managed"):
        return {}
    import uvm
    return {name: {"seconds": p["seconds"], "start": p["start"], "bytes": p["bytes"], "gbps": p["gbps"]}
            for move in uvm.last_move() for name, p in move["phases"].items()}


def child(method_name: str, pattern: str, cycles: int, idle_s: float = 0.0) -> dict:
    """One method, one pattern: build, first decode, then `cycles` sleep/claim/wake/decode cycles
    (with `idle_s` seconds of an idle GPU before each sleep)."""
    torch.cuda.set_device(0)
    method = Method(method_name)
    model, cache = method.build()
    state = DecodeState()
    graph = capture(model, cache, state)
    reference = decode(graph, cache, state)
    weight_bytes = sum(p.numel() * p.element_size() for p in model.parameters())
    sleep_bytes = weight_bytes + cache.numel() * cache.element_size()
    ballast = None
    if pattern == "full":
        torch.cuda.synchronize()
        ballast = torch.empty(torch.cuda.mem_get_info()[0] - 256 * (1 << 20), dtype=torch.uint8, device="cuda")
    claims = method_name != "pinned memcpy"
    rows = []
    for cycle in range(cycles):
        if idle_s:
            torch.cuda.synchronize()
            time.sleep(idle_s)
        free_before = torch.cuda.mem_get_info()[0]
        returned: dict = {}
        sleep_s = timed(lambda: run_steps(method.sleep_steps(), returned))
        free_after = torch.cuda.mem_get_info()[0]
        claim_s = 0.0
        if claims:
            size = int(0.9 * sleep_bytes) + (free_before - 512 * (1 << 20) if pattern == "big" else 0)
            # In a pool of its own, freed with it: torch.cuda.empty_cache() would also empty the
            # methods' own pools, which torch_memory_saver's torch mode refuses (it aborts).
            pool, holder = torch.cuda.MemPool(), []
            with torch.cuda.use_mem_pool(pool):
                claim_s = timed(lambda: holder.append(torch.empty(size, dtype=torch.uint8, device="cuda")))
            holder[0].fill_(1)  # the training step uses it
            del holder, pool
        wake_s = timed(lambda: run_steps(method.wake_steps(), returned))
        wake_phases = wake_report(method_name)
        history, logits = decode(graph, cache, state)
        rows.append({"cycle": cycle, "sleep_s": sleep_s, "claim_s": claim_s, "wake_s": wake_s,
                     "cycle_s": sleep_s + claim_s + wake_s, "freed_visible_bytes": max(0, free_after - free_before),
                     "identical": bool(torch.equal(history, reference[0]) and torch.equal(logits, reference[1])),
                     "wake_phases": wake_phases, "returned_s": returned})
    del ballast
    return {"method": method_name, "pattern": pattern, "pid": os.getpid(), "weight_bytes": weight_bytes, "sleep_bytes": sleep_bytes,
            "tensors": len(list(model.parameters())), "cycles": rows}


def peer_version() -> str | None:
    """torch_memory_saver's installed version, or None."""
    import importlib.metadata
    try:
        return importlib.metadata.version("torch_memory_saver")
    except importlib.metadata.PackageNotFoundError:
        return None


def environment() -> dict:
    """offload_bench's record of the machine and versions, plus torch_memory_saver's version."""
    return {**machine_and_versions(), "torch_memory_saver": peer_version()}


def summarize(result: dict) -> dict:
    rows = result["cycles"]
    steady = rows[1:] or rows
    gb = result["weight_bytes"] / 1e9
    med = {k: statistics.median(r[k] for r in steady) for k in ("sleep_s", "claim_s", "wake_s", "cycle_s")}
    calls: dict = {}  # each call's seconds until it returned, steady cycle by cycle, in call order
    for r in steady:
        for label, seconds in r.get("returned_s", {}).items():
            calls.setdefault(label, []).append(seconds)
    return {"method": result["method"], "pattern": result["pattern"], "first": rows[0], "steady": med,
            "sleep_gbps": gb / med["sleep_s"], "wake_gbps": gb / med["wake_s"],
            "first_sleep_gbps": gb / rows[0]["sleep_s"], "first_wake_gbps": gb / rows[0]["wake_s"],
            "freed_visible_gib": statistics.median(r["freed_visible_bytes"] for r in rows) / GiB,
            "identical": all(r["identical"] for r in rows), "wake_phases": median_phases(steady),
            "returned_s": {label: statistics.median(seconds) for label, seconds in calls.items()},
            "returned_range_s": {label: (min(seconds), max(seconds)) for label, seconds in calls.items()}}


def median_phases(rows: list[dict]) -> dict:
    """Per wake phase, the median over `rows` of its seconds and GB/s (phases some cycle lacked too)."""
    names = {name for r in rows for name in r.get("wake_phases", {})}
    return {name: {key: statistics.median(r["wake_phases"][name][key] for r in rows if name in r["wake_phases"])
                   for key in ("seconds", "start", "gbps")} for name in sorted(names)}


def returned_range(summary: dict, label: str) -> str:
    """The fastest and slowest steady cycle's seconds until `label` returned ("0.0005-0.0412"): a
    median of few cycles hides a call that slows down from some cycle on."""
    low, high = summary.get("returned_range_s", {}).get(label, (None, None))
    return "–" if low is None else f"{low:.4f}-{high:.4f}"


def markdown(summaries: list[dict], env: dict, info: dict) -> str:
    lines = [f"{env['device']}, driver {env['driver']}, torch {env['torch']} (CUDA {env['torch_cuda']}), "
             f"torch_memory_saver {env['torch_memory_saver'] or 'not installed'}; weights "
             f"{info['weight_bytes'] / GiB:.2f} GiB in {info['tensors']} tensors, KV cache "
             f"{(info['sleep_bytes'] - info['weight_bytes']) / GiB:.2f} GiB. Seconds are medians of the steady "
             f"cycles; GB/s count the weights' bytes.", ""]
    for pattern in ("big", "full"):
        rows = [s for s in summaries if s["pattern"] == pattern]
        if not rows:
            continue
        lines += [f"**Pattern {pattern}**", "",
                  "| method | sleep s | claim s | wake s | cycle s | sleep GB/s | wake GB/s | first cycle s "
                  "(sleep + claim + wake) | freed in mem_get_info | identical |",
                  "|---|---|---|---|---|---|---|---|---|---|"]
        for s in rows:
            st, f = s["steady"], s["first"]
            lines.append(f"| {s['method']} | {st['sleep_s']:.3f} | {st['claim_s']:.3f} | {st['wake_s']:.3f} | "
                         f"**{st['cycle_s']:.3f}** | {s['sleep_gbps']:.1f} | {s['wake_gbps']:.1f} | "
                         f"{f['cycle_s']:.3f} ({f['sleep_s']:.3f} + {f['claim_s']:.3f} + {f['wake_s']:.3f}) | "
                         f"{s['freed_visible_gib']:.2f} GiB | {'yes' if s['identical'] else '**NO**'} |")
        lines.append("")
        lines += [f"Calls of pattern {pattern}, seconds until each returned (steady medians, then the fastest and "
                  "slowest steady cycle's; an asynchronous call's copies go on after it returns):", ""]
        lines += [f"- {s['method']}: " + ", ".join(f"{label} {sec:.4f} ({returned_range(s, label)})"
                                                   for label, sec in s.get("returned_s", {}).items())
                  for s in rows]
        lines.append("")
        phased = [s for s in rows if s.get("wake_phases")]
        if phased:
            names = sorted({name for s in phased for name in s["wake_phases"]})
            lines += [f"Wake of pattern {pattern}, phase by phase (`uvm.last_move()`, steady medians: starts "
                      "after the call began, seconds, GB/s; phases overlap):", "",
                      "| method | " + " | ".join(names) + " |", "|---|" + "---|" * len(names)]
            for s in phased:
                cells = []
                for name in names:
                    p = s["wake_phases"].get(name)
                    cells.append(f"+{p['start'] * 1e3:.1f} ms, {p['seconds'] * 1e3:.1f} ms, {p['gbps']:.1f}" if p else "–")
                lines.append(f"| {s['method']} | " + " | ".join(cells) + " |")
            lines.append("")
    return "\n".join(lines)


# The drop-in's goals, each a line with met / NOT met and its ratio.
SAME_AS_NATIVE = 1.05               # memory_saver's sleep and wake at most 5 % slower than offload / onload
AHEAD_OF_PEER = {"big": 1.25, "full": 1.1}  # memory_saver's cycle against torch_memory_saver's, same hook mode
NEAR_PINNED = 1.15                  # the full pattern's cycle at most 15 % slower than pinned memcpy's
NO_RETAIN_SLEEP_GBPS = 35.0         # a sleep without retained backups, weights' bytes per second


def verdict(met: bool) -> str:
    return "met" if met else "NOT met"


def first_call_beside_peer(mine: dict, theirs: dict | None) -> str:
    """The sleep's first call (pause kv_cache: a release with nothing to copy) for the drop-in and the
    original in the same run: where the driver's work after the claim's free lands (measurements.md,
    "The drop-in at the native calls' speed")."""
    label = next(iter(mine.get("returned_s", {})), None)
    if label is None:
        return ""
    text = f" (its first call, {label}, {mine['returned_s'][label]:.3f} s"
    if theirs and label in theirs.get("returned_s", {}):
        text += f"; torch_memory_saver's {theirs['returned_s'][label]:.3f} s"
    return text + ")"


def drop_in_goal_lines(summaries: list[dict]) -> list[str]:
    """The drop-in's goals: as fast as the native calls, ahead of the peer in each hook mode, the full
    pattern near pinned memcpy, and sleeps without retained backups at the link's pace."""
    out = []
    for pattern in ("big", "full"):
        rows = {s["method"]: s for s in summaries if s["pattern"] == pattern}
        native = rows.get("uvm releasable")
        for mode in ("", " (preload)"):
            mine, theirs = rows.get(f"uvm memory_saver{mode}"), rows.get(f"torch_memory_saver{mode}")
            name = f"uvm memory_saver{mode or ' (torch)'}"
            if mine and native:
                for step, key in (("sleep", "sleep_s"), ("wake", "wake_s")):
                    ratio = mine["steady"][key] / native["steady"][key]
                    out.append(f"goal {pattern}: {name} {step} {mine['steady'][key]:.3f} s within 5 % of uvm releasable's "
                               f"{native['steady'][key]:.3f} s: {ratio:.2f}x, {verdict(ratio <= SAME_AS_NATIVE)}"
                               f"{first_call_beside_peer(mine, theirs) if step == 'sleep' else ''}")
            if mine and theirs:
                ratio = theirs["steady"]["cycle_s"] / mine["steady"]["cycle_s"]
                out.append(f"goal {pattern}: {name} cycle {AHEAD_OF_PEER[pattern]:.2f}x faster than torch_memory_saver"
                           f"{mode or ' (torch)'}: {ratio:.2f}x, {verdict(ratio >= AHEAD_OF_PEER[pattern])}")
        pinned = rows.get("pinned memcpy")
        if pattern == "full" and pinned:
            for method in ("uvm releasable", "uvm memory_saver", "uvm memory_saver (preload)"):
                if method in rows:
                    ratio = rows[method]["steady"]["cycle_s"] / pinned["steady"]["cycle_s"]
                    out.append(f"goal full: {method} cycle within 15 % of pinned memcpy's {pinned['steady']['cycle_s']:.3f} "
                               f"s: {ratio:.2f}x, {verdict(ratio <= NEAR_PINNED)}")
        no_retain = rows.get("uvm memory_saver (no retain)")
        if no_retain:
            out.append(f"goal {pattern}: uvm memory_saver (no retain) sleep at {NO_RETAIN_SLEEP_GBPS:.0f} GB/s: "
                       f"{no_retain['sleep_gbps']:.1f} GB/s, {verdict(no_retain['sleep_gbps'] >= NO_RETAIN_SLEEP_GBPS)}")
    return out


def goal_lines(summaries: list[dict]) -> list[str]:
    out = drop_in_goal_lines(summaries)
    for pattern in ("big", "full"):
        rows = {s["method"]: s for s in summaries if s["pattern"] == pattern}
        ours = rows.get("uvm releasable") or rows.get("uvm memory_saver")
        peers = [rows[m] for m in ("torch_memory_saver", "torch_memory_saver (no retain)") if m in rows]
        pinned = rows.get("pinned memcpy")
        if not ours:
            continue
        if peers:
            best = min(peers, key=lambda s: s["steady"]["cycle_s"])
            best_first = min(peers, key=lambda s: s["first"]["cycle_s"])
            out.append(f"{pattern}: steady cycle {ours['method']} {ours['steady']['cycle_s']:.3f} s vs "
                       f"{best['method']} {best['steady']['cycle_s']:.3f} s (ratio "
                       f"{best['steady']['cycle_s'] / ours['steady']['cycle_s']:.2f}x); first cycle "
                       f"{ours['first']['cycle_s']:.3f} vs {best_first['first']['cycle_s']:.3f} s; sleep "
                       f"{ours['sleep_gbps']:.1f} vs {best['sleep_gbps']:.1f} GB/s; wake {ours['wake_gbps']:.1f} vs "
                       f"{best['wake_gbps']:.1f} GB/s")
        if pinned:
            out.append(f"{pattern}: wake {ours['wake_gbps']:.1f} GB/s = {ours['wake_gbps'] / pinned['wake_gbps']:.0%} "
                       f"of pinned memcpy ({pinned['wake_gbps']:.1f} GB/s)")
    return out


def plot(summaries: list[dict], path: str) -> bool:
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return False
    patterns = [p for p in ("big", "full") if any(s["pattern"] == p for s in summaries)]
    fig, axes = plt.subplots(1, len(patterns), figsize=(7 * len(patterns), 4.8), squeeze=False)
    for ax, pattern in zip(axes[0], patterns):
        rows = [s for s in summaries if s["pattern"] == pattern]
        names = [s["method"].replace(" (", "\n(") for s in rows]
        bottom = [0.0] * len(rows)
        for key, color in (("sleep_s", "#4c72b0"), ("claim_s", "#dd8452"), ("wake_s", "#55a868")):
            values = [s["steady"][key] * 1e3 for s in rows]
            ax.barh(names, values, left=bottom, color=color, label=key[:-2])
            bottom = [b + v for b, v in zip(bottom, values)]
        ax.set_xlabel("steady cycle, ms (sleep + claim + wake)")
        ax.set_title(f"pattern {pattern}")
        ax.invert_yaxis()
        ax.legend(loc="lower right")
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    return True


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--cycles", type=int, default=4, help="cycles per method and pattern (the first is reported apart)")
    parser.add_argument("--patterns", default="big,full")
    parser.add_argument("--methods", default=",".join(METHODS))
    parser.add_argument("--out", default="bench-out/rl")
    parser.add_argument("--idle-before-sleep", type=float, default=0.0, metavar="S",
                        help="seconds the GPU stays idle before each sleep (does the driver's work after the claim's "
                             "free go on by itself, or wait for the next caller?)")
    parser.add_argument("--child", nargs=2, metavar=("METHOD", "PATTERN"), help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.child:
        print(json.dumps(child(args.child[0], args.child[1], args.cycles, args.idle_before_sleep)), flush=True)
        sys.stderr.flush()
        if os.environ.get("UVM_TRACE") and "uvm" in sys.modules:  # the last moves too (os._exit runs no atexit)
            sys.modules["uvm"].trace_flush()
        # Skips the interpreter's teardown: torch_memory_saver's torch mode aborts when its pools are
        # destroyed at exit ("only support interesting region"), which says nothing about the cycles.
        os._exit(0)
    methods = selected_methods(parser, args.methods, METHODS)
    env = environment()
    os.makedirs(args.out, exist_ok=True)
    results, failures = [], []
    for pattern in args.patterns.split(","):
        for method in methods:
            with child_environment(method):
                proc = subprocess.run([sys.executable, os.path.abspath(__file__), "--cycles", str(args.cycles),
                                       "--idle-before-sleep", str(args.idle_before_sleep), "--child", method, pattern], capture_output=True, text=True, timeout=900)
            if proc.returncode != 0:
                failures.append(f"{method} / {pattern}: exit {proc.returncode}\n{proc.stderr[-3000:]}")
                print(f"FAILED {method} / {pattern}:\n{proc.stderr[-3000:]}", flush=True)
                continue
            result = json.loads(proc.stdout.strip().splitlines()[-1])
            results.append(result)
            s = summarize(result)
            print(f"{pattern:4} {method:32} steady cycle {s['steady']['cycle_s'] * 1e3:7.1f} ms (sleep "
                  f"{s['steady']['sleep_s'] * 1e3:.1f} + claim {s['steady']['claim_s'] * 1e3:.1f} + wake "
                  f"{s['steady']['wake_s'] * 1e3:.1f}), first {s['first']['cycle_s'] * 1e3:.1f} ms, identical "
                  f"{s['identical']}", flush=True)
    summaries = [summarize(r) for r in results]
    info = results[0] if results else {"weight_bytes": 0, "sleep_bytes": 0, "tensors": 0}
    with open(os.path.join(args.out, "results.json"), "w") as f:
        json.dump({"environment": env, "results": results, "summaries": summaries, "failures": failures}, f, indent=1)
    table = markdown(summaries, env, info)
    goals = goal_lines(summaries)
    with open(os.path.join(args.out, "results.md"), "w") as f:
        f.write(table + "\n" + "\n".join(f"- {g}" for g in goals) + "\n")
    print(table)
    print("\n".join(goals))
    if plot(summaries, os.path.join(args.out, "rl_cycle.png")):
        print(f"plot: {os.path.join(args.out, 'rl_cycle.png')}")
    not_identical = [s["method"] + " / " + s["pattern"] for s in summaries if not s["identical"]]
    if not_identical:
        print(f"OUTPUTS DIFFER after a cycle: {not_identical}")
    return 1 if failures or not_identical else 0


if __name__ == "__main__":
    sys.exit(main())
