"""Megatron-Core (its PyPI wheel, unmodified) on uvm, up to its dynamic inference engine. Before Megatron
is imported, its unified-memory module and the torch_memory_saver it imports are aliased to uvm's
(sys.modules), and flash_attn is uvm's plain-PyTorch reference of the two kernels the engine calls
(tests/peers/flash_attn_reference): no file of Megatron's is edited. A small GPT (local layer spec,
grouped-query attention, bf16 wrapped in Megatron's Float16Module as its scripts wrap one) is built
with Megatron's own classes. Parts:

  weights        parameters in Megatron's create_unified_mempool; its weight-offload flow (advise +
                 prefetch to the CPU and back) with a plain allocation between; logits bit-identical
  tokens         greedy generation of prompts spanning one to three KV blocks, the KV cache in plain
                 memory (unified_memory_level=0): the reference every other part compares with
  tokens uvm     the same with the KV cache in uvm memory (unified_memory_level=1)
  suspend uvm    level 1, suspended mid-generation; the KV buffer offloaded by uvm, its memory taken by
                 a plain allocation, then resumed: same tokens
  control        the KV cache overwritten mid-generation must change the tokens (else the comparisons
                 above could not see a loss)
  suspend saver  static KV pointers + kv_cache_management_mode=offload through uvm.memory_saver:
                 mem_get_info shows the KV buffer freed while suspended; same tokens
  rl saver       Megatron's RL flow with the weights in a torch_memory_saver region (uvm's) and the KV
                 cache paused with them, "training" taking the memory between rollouts; 3 cycles
  rl unified     the same with the weights in a unified-memory pool moved by Megatron's prefetch helpers
  cuda graphs    Megatron's inference CUDA graphs (block scope) with the KV cache in uvm memory,
                 suspended and resumed mid-generation: same tokens as the graphed run without it
  bad client     requests that raise (wrong dtype) or that the engine rejects (too long) with uvm
                 pools alive, garbage collection, then another engine: no abort, same tokens

`--time SAVER` (uvm or peer) instead times engine.suspend()/resume() of a larger KV cache (static
pointers, offload mode) through uvm.memory_saver or the real torch_memory_saver wheel, one JSON line.

Prints one line per part and "N passed, M failed, K blocked". Needs a GPU and megatron-core.
"""
from __future__ import annotations

import argparse
import gc
import json
import os
import sys
import time
import traceback
import types
from pathlib import Path

HERE = Path(__file__).resolve().parent
RESULTS: list[tuple[str, str, str]] = []
PROMPT_LENGTHS = (17, 260, 600, 33)  # block_size_tokens=256: one, two and three KV blocks
NEW_TOKENS = 24
VOCAB = 4096


class Blocked(Exception):
    """A part that cannot run here for a reason outside uvm (a dependency that cannot travel)."""


def part(name: str):
    def run(body):
        try:
            detail = body() or ""
            RESULTS.append((name, "PASS", detail))
        except Blocked as why:
            RESULTS.append((name, "BLOCKED", str(why)))
        except Exception as error:  # noqa: BLE001 - every failure is reported with its traceback
            RESULTS.append((name, "FAIL", f"{type(error).__name__}: {error}\n{traceback.format_exc(limit=8)}"))
        gc.collect()  # engines of earlier parts go now: a paused tag must not find their buffers
        print(f"{RESULTS[-1][1]} {name}: {RESULTS[-1][2]}", flush=True)
        return body
    return run


def alias(saver: str) -> None:
    sys.path.insert(0, str(HERE / "flash_attn_reference"))
    import uvm
    sys.modules["megatron.core.inference.unified_memory"] = uvm
    if saver == "uvm":
        import uvm.memory_saver
        sys.modules["torch_memory_saver"] = uvm.memory_saver


def setup() -> None:
    import torch
    os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
    os.environ.setdefault("MASTER_PORT", "29517")
    torch.cuda.set_device(0)
    torch.distributed.init_process_group("nccl", rank=0, world_size=1)
    from megatron.core import parallel_state
    from megatron.core.tensor_parallel.random import model_parallel_cuda_manual_seed
    parallel_state.initialize_model_parallel(1, 1)
    # Megatron's inference CUDA graphs need its inference RNG tracker (as its engine tests set it up).
    model_parallel_cuda_manual_seed(1234, inference_rng_tracker=True, use_cudagraphable_rng=False,
                                    force_reset_rng=True)


def model_config(graphs: bool = False):
    import torch
    from megatron.core.transformer.enums import InferenceCudaGraphScope
    from megatron.core.transformer.transformer_config import TransformerConfig
    return TransformerConfig(num_layers=4, hidden_size=512, num_attention_heads=8, num_query_groups=2,
                             ffn_hidden_size=2048, params_dtype=torch.bfloat16, bf16=True, add_bias_linear=True,
                             use_cpu_initialization=False, hidden_dropout=0.0, attention_dropout=0.0,
                             inference_rng_tracker=True,
                             cuda_graph_impl="local" if graphs else "none",
                             inference_cuda_graph_scope=(InferenceCudaGraphScope.block if graphs
                                                         else InferenceCudaGraphScope.none))


def build_model(pool=None, region=None, graphs: bool = False, weights: dict | None = None):
    """A bf16 GPT wrapped in Float16Module, its parameters allocated in `pool` or `region` if given.

    The wrapper is made inside too: it converts the fp32 position embedding to bf16, a new tensor."""
    import contextlib

    import torch
    from megatron.core.models.gpt.gpt_layer_specs import get_gpt_layer_local_spec
    from megatron.core.models.gpt.gpt_model import GPTModel
    from megatron.core.transformer.module import Float16Module
    config = model_config(graphs)
    where = (torch.cuda.use_mem_pool(pool) if pool is not None else region if region is not None
             else contextlib.nullcontext())
    with where:
        model = GPTModel(config=config, transformer_layer_spec=get_gpt_layer_local_spec(), vocab_size=VOCAB,
                         max_sequence_length=1024, pre_process=True, post_process=True).cuda()
        if weights is not None:
            with torch.no_grad():
                for name, parameter in model.named_parameters():
                    parameter.copy_(weights[name])
        wrapped = Float16Module(config, model).eval()
    return wrapped, config


def weight_bytes(model) -> int:
    return sum(p.nbytes for p in model.parameters())


def engine_for(model, config, **inference):
    import torch
    from megatron.core.inference.config import InferenceConfig
    from megatron.core.inference.contexts.dynamic_context import DynamicInferenceContext
    from megatron.core.inference.engines import DynamicInferenceEngine
    from megatron.core.inference.model_inference_wrappers.gpt.gpt_inference_wrapper import GPTInferenceWrapper
    from megatron.core.inference.text_generation_controllers.text_generation_controller import (
        TextGenerationController)
    from megatron.core.transformer.cuda_graphs import delete_cuda_graphs
    settings = dict(buffer_size_gb=0.25, max_sequence_length=1024, block_size_tokens=256, max_requests=8)
    settings.update(inference)
    context = DynamicInferenceContext(config, InferenceConfig(**settings))
    wrapper = GPTInferenceWrapper(model, context)
    tokenizer = types.SimpleNamespace(vocab_size=VOCAB, detokenize=lambda tokens: "", eod=-1)
    controller = TextGenerationController(wrapper, tokenizer)
    delete_cuda_graphs()
    with torch.inference_mode():
        return DynamicInferenceEngine(controller, context)


def prompts() -> list[list[int]]:
    return [[(7 + 31 * i + 97 * r) % VOCAB for i in range(n)] for r, n in enumerate(PROMPT_LENGTHS)]


def generate(engine, between=None, first_id: int = 0) -> list[list[int]]:
    """Greedy tokens for prompts(); `between(step)` runs after each engine step."""
    import torch
    from megatron.core.inference.sampling_params import SamplingParams
    tokens: dict[int, list[int]] = {}
    with torch.inference_mode():
        for i, prompt in enumerate(prompts()):
            engine.add_request(first_id + i, prompt, SamplingParams(num_tokens_to_generate=NEW_TOKENS, top_k=1,
                                                                    termination_id=-1))
        steps = 0
        while engine.has_unfinished_requests():
            result = engine.step_modern()
            steps += 1
            if steps > 10 * NEW_TOKENS:
                raise RuntimeError(f"the engine did not finish in {steps} steps")
            for record in result["finished_request_records"]:
                request = record.merge()
                tokens[request.request_id - first_id] = [int(t) for t in request.generated_tokens]
            if between is not None:
                between(steps)
    return [tokens[i] for i in range(len(PROMPT_LENGTHS))]


def same_tokens(got, want, what: str) -> None:
    for i, (g, w) in enumerate(zip(got, want)):
        if g != w:
            raise AssertionError(f"{what}: request {i} generated {g}, the reference {w}")
    if len(got) != len(want):
        raise AssertionError(f"{what}: {len(got)} requests finished, the reference had {len(want)}")


def claim(nbytes: int) -> None:
    """What training does between rollouts: a plain allocation of `nbytes`, written, then freed."""
    import torch
    taken = torch.empty(nbytes, dtype=torch.uint8, device="cuda")
    taken.fill_(0xA5)
    torch.cuda.synchronize()
    del taken
    torch.cuda.empty_cache()


def suspend_offload_resume(engine) -> tuple[int, int]:
    """Level 1: the engine suspended, its KV buffer offloaded by uvm and its memory taken by a plain
    allocation, then resumed and onloaded. Returns (bytes offloaded, host bytes while offloaded)."""
    import torch

    import uvm
    buffer = engine.context.memory_buffer
    engine.suspend()
    moved = uvm.offload(buffer)
    torch.cuda.synchronize()
    host = uvm.residency()["host_bytes"]
    claim(buffer.nbytes)
    engine.resume()
    uvm.onload(buffer)
    return moved, host


def freed_by(action) -> int:
    import torch
    torch.cuda.synchronize()
    before = torch.cuda.mem_get_info()[0]
    action()
    torch.cuda.synchronize()
    return torch.cuda.mem_get_info()[0] - before


def run_parts() -> int:
    import torch

    import uvm
    setup()
    from megatron.core.inference import unified_memory as megatron_um
    from torch_memory_saver import torch_memory_saver as saver
    assert megatron_um is uvm and type(saver).__module__ == "uvm.memory_saver", "uvm is not aliased"
    import flash_attn
    assert flash_attn.__file__.startswith(str(HERE)), f"flash_attn is not the reference: {flash_attn.__file__}"
    from megatron.core.inference.config import KVCacheManagementMode
    reference_model, config = build_model()
    weights = {name: p.detach().clone() for name, p in reference_model.module.named_parameters()}
    state: dict = {}

    @part("weights")
    def _():
        pool = megatron_um.create_unified_mempool()
        model, _ = build_model(pool, weights=weights)
        params = list(model.parameters())
        assert all(uvm.library().uvm_is_managed(p.data_ptr()) for p in params), "parameters are not uvm memory"
        tokens = torch.tensor([[(i * 37) % VOCAB for i in range(128)]], device="cuda")
        positions = torch.arange(128, device="cuda").view(1, 128)
        mask = torch.ones(1, 1, 128, 128, dtype=torch.bool, device="cuda").triu(1)
        with torch.no_grad():
            before = model(tokens, positions, mask).float()
        megatron_um.advise_managed_module_parameters_preferred_location(model, device=-1)
        moved = megatron_um.prefetch_managed_module_parameters(model, device=-1)
        torch.cuda.synchronize()
        host = uvm.residency()["host_bytes"]
        claim(weight_bytes(model))
        megatron_um.advise_managed_module_parameters_preferred_location(model, device=0)
        megatron_um.prefetch_managed_module_parameters(model, device=0)
        with torch.no_grad():
            after = model(tokens, positions, mask).float()
        assert torch.equal(before, after), "logits differ after the weights went to the CPU and back"
        return f"{len(params)} parameters, {moved} bytes prefetched, {host} on the host between, logits identical"

    @part("tokens")
    def _():
        engine = engine_for(reference_model, config)
        state["reference"] = generate(engine)
        lengths = [len(t) for t in state["reference"]]
        assert lengths == [NEW_TOKENS] * len(PROMPT_LENGTHS), f"generated {lengths} tokens"
        assert len({tuple(t) for t in state["reference"]}) > 1, "every request generated the same tokens"
        return f"{len(lengths)} requests (prompts {PROMPT_LENGTHS} tokens), {NEW_TOKENS} tokens each, plain KV"

    def reference():
        if "reference" not in state:
            raise AssertionError("no reference tokens (the 'tokens' part failed)")
        return state["reference"]

    @part("tokens uvm")
    def _():
        engine = engine_for(reference_model, config, unified_memory_level=1)
        buffer = engine.context.memory_buffer
        assert engine.context.unified_memory_level == 1, "Megatron fell back from unified memory"
        assert uvm.library().uvm_is_managed(buffer.data_ptr()), "the KV buffer is not in the uvm pool"
        same_tokens(generate(engine), reference(), "unified_memory_level=1")
        return f"KV buffer {buffer.nbytes} bytes in uvm memory, tokens identical"

    @part("suspend uvm")
    def _():
        engine = engine_for(reference_model, config, unified_memory_level=1)
        buffer = engine.context.memory_buffer
        address = buffer.data_ptr()
        notes = []

        def suspend_resume(step):
            if step != 6:
                return
            moved, host = suspend_offload_resume(engine)
            notes.append(f"suspended at step {step}: {moved} bytes offloaded ({host} on the host), "
                         f"{buffer.nbytes} bytes claimed by a plain allocation")
        same_tokens(generate(engine, suspend_resume), reference(), "level 1 suspended mid-generation")
        assert notes, "the engine finished before the suspend"
        assert engine.context.memory_buffer.data_ptr() == address, "the KV buffer moved"
        return notes[0] + "; tokens identical"

    @part("control")
    def _():
        # The comparisons above prove something only if lost KV bytes change the tokens: lose them here.
        engine = engine_for(reference_model, config, unified_memory_level=1)
        buffer = engine.context.memory_buffer

        def lose_kv(step):
            if step == 6:
                buffer.view(torch.uint8).view(-1).fill_(0xA5)
        got = generate(engine, lose_kv)
        changed = [i for i, (g, w) in enumerate(zip(got, reference())) if g != w]
        assert changed, "overwriting the KV cache mid-generation left every token unchanged"
        return f"KV cache overwritten at step 6: requests {changed} of {len(got)} generate other tokens"

    @part("suspend saver")
    def _():
        engine = engine_for(reference_model, config, static_kv_memory_pointers=True,
                            kv_cache_management_mode=KVCacheManagementMode.OFFLOAD)
        context = engine.context
        assert context._uses_torch_memory_saver, "Megatron did not route the KV buffer to torch_memory_saver"
        buffer = context.memory_buffer
        address = buffer.data_ptr()
        notes = []

        def suspend_resume(step):
            if step != 6:
                return
            freed = freed_by(engine.suspend)
            assert freed >= 0.9 * buffer.nbytes, f"suspend freed {freed} of {buffer.nbytes} bytes in mem_get_info"
            claim(buffer.nbytes)
            engine.resume()
            notes.append(f"suspended at step {step}: {freed} of {buffer.nbytes} bytes freed in mem_get_info")
        same_tokens(generate(engine, suspend_resume), reference(), "static KV offloaded through uvm.memory_saver")
        assert notes, "the engine finished before the suspend"
        assert context.memory_buffer.data_ptr() == address, "the KV buffer moved"
        return notes[0] + "; tokens identical, address stable"

    @part("rl saver")
    def _():
        model, _ = build_model(region=saver.region(tag="weights", enable_cpu_backup=True), weights=weights)
        engine = engine_for(model, config, static_kv_memory_pointers=True,
                            kv_cache_management_mode=KVCacheManagementMode.OFFLOAD)
        held = weight_bytes(model) + engine.context.memory_buffer.nbytes
        freed_per_cycle = []
        for cycle in range(3):
            same_tokens(generate(engine, first_id=100 * cycle), reference(), f"rollout {cycle}")

            def pause():
                engine.suspend()
                saver.pause("weights")
            freed_per_cycle.append(freed_by(pause))
            assert freed_per_cycle[-1] >= 0.9 * held, f"pause freed {freed_per_cycle[-1]} of {held} bytes"
            claim(held)
            saver.resume("weights")
            engine.resume()
        same_tokens(generate(engine, first_id=900), reference(), "rollout after the last resume")
        return (f"4 rollouts, 3 pauses of weights + KV ({held} bytes), freed {min(freed_per_cycle)}..."
                f"{max(freed_per_cycle)} in mem_get_info, claimed by training each time; tokens identical")

    @part("rl unified")
    def _():
        model, _ = build_model(megatron_um.create_unified_mempool(), weights=weights)
        engine = engine_for(model, config, unified_memory_level=1)
        buffer = engine.context.memory_buffer
        core = model.module
        for cycle in range(3):
            same_tokens(generate(engine, first_id=100 * cycle), reference(), f"rollout {cycle}")
            engine.suspend()
            # Megatron's _maybe_prefetch_separate_inference_model_weights(to_cpu=True), then the KV cache.
            megatron_um.advise_managed_module_parameters_preferred_location(core, device=-1, include_buffers=False)
            megatron_um.prefetch_managed_module_parameters(core, device=-1, include_buffers=False)
            uvm.offload(buffer)
            torch.cuda.synchronize()
            claim(weight_bytes(model) + buffer.nbytes)
            megatron_um.advise_managed_module_parameters_preferred_location(core, device=0, include_buffers=False)
            megatron_um.prefetch_managed_module_parameters(core, device=0, include_buffers=False)
            torch.cuda.synchronize()
            engine.resume()
            uvm.onload(buffer)
        same_tokens(generate(engine, first_id=900), reference(), "rollout after the last resume")
        return "4 rollouts, weights and KV cache moved to the host and back 3 times around training; tokens identical"

    @part("cuda graphs")
    def _():
        # One model per engine, as Megatron's tests do: a layer's captured graphs hold the context they saw.
        settings = dict(unified_memory_level=1, num_cuda_graphs=4, use_cuda_graphs_for_non_decode_steps=False)
        baseline = generate(engine_for(*build_model(graphs=True, weights=weights), **settings))
        engine = engine_for(*build_model(graphs=True, weights=weights), **settings)
        graphs = engine.context.cuda_graph_batch_dimensions_list
        assert graphs, "the engine captured no CUDA graph"
        replays = []

        def suspend_resume(step):
            replays.append(engine.context.using_cuda_graph_this_step())
            if step != 6:
                return
            suspend_offload_resume(engine)
        same_tokens(generate(engine, suspend_resume), baseline, "graphed run suspended mid-generation")
        graphed_steps = sum(bool(r) for r in replays[6:])
        assert graphed_steps, "no step after the resume replayed a CUDA graph"
        eager = ("and to the eager reference" if baseline == reference() else
                 "(the eager reference's differ: padded graph batches may round bf16 differently)")
        return (f"{len(graphs)} graphs captured, {graphed_steps} graphed steps after the resume, tokens identical "
                f"to the graphed run without suspend {eager}")

    @part("bad client")
    def _():
        model, _ = build_model(megatron_um.create_unified_mempool(), weights=weights)
        engine = engine_for(model, config, unified_memory_level=1)
        from megatron.core.inference.sampling_params import SamplingParams
        raised = []
        try:
            engine.add_request(50, torch.ones(8, device="cuda"), SamplingParams(num_tokens_to_generate=4))
        except AssertionError as error:
            raised.append(f"float prompt: AssertionError({error})")
        else:
            raise AssertionError("a float prompt was accepted")
        with torch.inference_mode():
            try:
                engine.add_request(51, [1] * 1100, SamplingParams(num_tokens_to_generate=4, termination_id=-1))
                steps = 0
                while engine.has_unfinished_requests() and steps < 20:
                    engine.step_modern()
                    steps += 1
                raised.append(f"over-long prompt: {engine.get_request(51).status.name}")
            except Exception as error:  # noqa: BLE001 - whatever Megatron raises, the process must go on
                raised.append(f"over-long prompt: {type(error).__name__}({error})")
        del engine, model
        gc.collect()
        torch.cuda.synchronize()
        model, _ = build_model(megatron_um.create_unified_mempool(), weights=weights)
        same_tokens(generate(engine_for(model, config, unified_memory_level=1)), reference(), "after the bad client")
        return "; ".join(raised) + "; after gc a new engine on uvm pools generates identical tokens"

    passed = sum(r[1] == "PASS" for r in RESULTS)
    failed = sum(r[1] == "FAIL" for r in RESULTS)
    blocked = sum(r[1] == "BLOCKED" for r in RESULTS)
    import megatron.core
    print(f"megatron-core {getattr(megatron.core, '__version__', '?')}, torch {torch.__version__}, "
          f"{torch.cuda.get_device_name(0)}")
    print(f"{passed} passed, {failed} failed, {blocked} blocked")
    torch.distributed.destroy_process_group()
    return 1 if failed else 0


def time_suspend(saver_name: str, gib: float, cycles: int) -> int:
    """engine.suspend()/resume() of a `gib` KV cache (static pointers, offload mode) through the saver."""
    import torch
    setup()
    from megatron.core.inference.config import KVCacheManagementMode
    import torch_memory_saver
    where = getattr(torch_memory_saver, "__file__", "?")
    model, config = build_model()
    engine = engine_for(model, config, buffer_size_gb=gib, static_kv_memory_pointers=True,
                        kv_cache_management_mode=KVCacheManagementMode.OFFLOAD)
    buffer = engine.context.memory_buffer
    with torch.inference_mode():
        buffer.view(-1)[::4096].fill_(1)  # every page touched: the bytes are real, not never-written zeros
    reference = generate(engine)
    rows = []

    def suspend_resume(step):
        if step != 6:
            return
        for _ in range(cycles):
            torch.cuda.synchronize()
            start = time.perf_counter()
            engine.suspend()
            torch.cuda.synchronize()
            middle = time.perf_counter()
            claim(buffer.nbytes // 2)
            torch.cuda.synchronize()
            resume_start = time.perf_counter()
            engine.resume()
            torch.cuda.synchronize()
            rows.append((middle - start, time.perf_counter() - resume_start))
    same_tokens(generate(engine, suspend_resume, first_id=100), reference, f"{saver_name}: suspended run")
    print(json.dumps({"saver": saver_name, "module": where, "kv_bytes": buffer.nbytes,
                      "suspend_s": [r[0] for r in rows], "resume_s": [r[1] for r in rows],
                      "device": torch.cuda.get_device_name(0), "torch": torch.__version__}), flush=True)
    torch.distributed.destroy_process_group()
    return 0


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--time", choices=["uvm", "peer"], help="time engine suspend/resume through this saver")
    parser.add_argument("--gib", type=float, default=4.0, help="KV cache size for --time")
    parser.add_argument("--cycles", type=int, default=3)
    args = parser.parse_args()
    alias(args.time or "uvm")
    if args.time:
        return time_suspend(args.time, args.gib, args.cycles)
    return run_parts()


if __name__ == "__main__":
    sys.exit(main())
