"""Megatron-Core (its PyPI wheel, unmodified) on uvm. Before Megatron is imported, its unified-memory
module and the torch_memory_saver it imports are aliased to uvm's (sys.modules) — no file of
Megatron's is edited. A small GPT model (local layer spec) is built with Megatron's own classes, then:

  weights     the parameters live in a uvm pool made by Megatron's create_unified_mempool; Megatron's
              weight-offload flow (advise_managed_module_parameters_preferred_location + 
              prefetch_managed_module_parameters, to the CPU and back) runs through uvm, a plain
              allocation of the memory happens in between, and the logits come back bit-identical
  uvm kv      DynamicInferenceContext with unified_memory_level=1: its KV buffer is allocated in the
              pool Megatron asked uvm for
  saver kv    DynamicInferenceContext with static KV pointers and kv_cache_management_mode=offload:
              Megatron pauses and resumes its KV buffer through torch_memory_saver (here uvm's); the
              buffer's memory shows free while suspended and its bytes come back
  engine      a DynamicInferenceEngine generating tokens with unified_memory_level=1; recorded as
              BLOCKED with the exact reason when a dependency that cannot travel is missing

Prints one line per part and "N passed, M failed, K blocked". Needs a GPU and megatron-core.
"""
from __future__ import annotations

import os
import sys
import traceback

import torch

import uvm
import uvm.memory_saver

sys.modules["megatron.core.inference.unified_memory"] = uvm
sys.modules["torch_memory_saver"] = uvm.memory_saver

RESULTS: list[tuple[str, str, str]] = []


def part(name: str):
    def run(body):
        try:
            detail = body() or ""
            RESULTS.append((name, "PASS", detail))
        except Blocked as why:
            RESULTS.append((name, "BLOCKED", str(why)))
        except Exception as error:  # noqa: BLE001 - every failure is reported with its traceback
            RESULTS.append((name, "FAIL", f"{type(error).__name__}: {error}\n{traceback.format_exc(limit=6)}"))
        print(f"{RESULTS[-1][1]} {name}: {RESULTS[-1][2]}", flush=True)
        return body
    return run


class Blocked(Exception):
    """A part that cannot run here for a reason outside uvm (a dependency that cannot travel)."""


def setup():
    os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
    os.environ.setdefault("MASTER_PORT", "29517")
    torch.cuda.set_device(0)
    torch.distributed.init_process_group("nccl", rank=0, world_size=1)
    from megatron.core import parallel_state
    from megatron.core.tensor_parallel.random import model_parallel_cuda_manual_seed
    parallel_state.initialize_model_parallel(1, 1)
    model_parallel_cuda_manual_seed(1234)


def build_model(pool=None):
    from megatron.core.models.gpt.gpt_layer_specs import get_gpt_layer_local_spec
    from megatron.core.models.gpt.gpt_model import GPTModel
    from megatron.core.transformer.transformer_config import TransformerConfig
    config = TransformerConfig(num_layers=4, hidden_size=512, num_attention_heads=8, ffn_hidden_size=2048,
                               params_dtype=torch.bfloat16, bf16=True, add_bias_linear=True,
                               use_cpu_initialization=False, hidden_dropout=0.0, attention_dropout=0.0)
    context = torch.cuda.use_mem_pool(pool) if pool is not None else torch.no_grad()
    with context:
        model = GPTModel(config=config, transformer_layer_spec=get_gpt_layer_local_spec(), vocab_size=4096,
                         max_sequence_length=1024, pre_process=True, post_process=True).cuda()
    return model.eval(), config


def logits_of(model):
    tokens = (torch.arange(128, device="cuda").view(1, 128) * 37) % 4096
    positions = torch.arange(128, device="cuda").view(1, 128)
    mask = torch.ones(1, 1, 128, 128, dtype=torch.bool, device="cuda").triu(1)
    # Megatron wraps bf16 models in its Float16Module for this; autocast does the same casting here.
    with torch.no_grad(), torch.autocast("cuda", dtype=torch.bfloat16):
        return model(tokens, positions, mask).float()


def main() -> int:
    setup()
    from megatron.core.inference import unified_memory as megatron_um
    assert megatron_um is uvm

    @part("weights")
    def _():
        pool = megatron_um.create_unified_mempool()
        model, _ = build_model(pool)
        params = list(model.parameters())
        assert all(uvm.library().uvm_is_managed(p.data_ptr()) for p in params), "parameters are not uvm memory"
        before = logits_of(model)
        megatron_um.advise_managed_module_parameters_preferred_location(model, device=-1)
        moved = megatron_um.prefetch_managed_module_parameters(model, device=-1)
        torch.cuda.synchronize()
        host = uvm.residency()["host_bytes"]
        claim = torch.empty(sum(p.nbytes for p in params), dtype=torch.uint8, device="cuda").fill_(7)
        del claim
        megatron_um.advise_managed_module_parameters_preferred_location(model, device=0)
        megatron_um.prefetch_managed_module_parameters(model, device=0)
        after = logits_of(model)
        assert torch.equal(before, after), "logits differ after the weights went to the CPU and back"
        return f"{len(params)} parameters, {moved} bytes prefetched, {host} on the host between, logits identical"

    @part("uvm kv")
    def _():
        from megatron.core.inference.config import InferenceConfig
        from megatron.core.inference.contexts.dynamic_context import DynamicInferenceContext
        _, config = build_model()
        context = DynamicInferenceContext(config, InferenceConfig(unified_memory_level=1, buffer_size_gb=0.25,
                                                                  max_sequence_length=1024, block_size_tokens=256))
        assert context.unified_memory_level == 1, "Megatron fell back from unified memory"
        buffer = context.memory_buffer
        assert uvm.library().uvm_is_managed(buffer.data_ptr()), "the KV buffer is not in the uvm pool"
        return f"KV buffer {tuple(buffer.shape)} ({buffer.nbytes} bytes) in uvm managed memory"

    @part("saver kv")
    def _():
        from megatron.core.inference.config import InferenceConfig, KVCacheManagementMode
        from megatron.core.inference.contexts.dynamic_context import DynamicInferenceContext
        _, config = build_model()
        context = DynamicInferenceContext(config, InferenceConfig(
            unified_memory_level=0, buffer_size_gb=0.5, max_sequence_length=1024, block_size_tokens=256,
            static_kv_memory_pointers=True, kv_cache_management_mode=KVCacheManagementMode.OFFLOAD))
        assert context._uses_torch_memory_saver, "Megatron did not route the KV buffer to torch_memory_saver"
        buffer = context.memory_buffer
        expected = torch.randint(0, 255, (buffer.nbytes,), dtype=torch.uint8, device="cuda", generator=torch.Generator("cuda").manual_seed(5))
        buffer.view(torch.uint8).view(-1).copy_(expected)
        address = buffer.data_ptr()
        torch.cuda.synchronize()
        free_before = torch.cuda.mem_get_info()[0]
        context.deallocate_inference_state_buffers()
        torch.cuda.synchronize()
        freed = torch.cuda.mem_get_info()[0] - free_before
        assert freed >= 0.9 * buffer.nbytes, f"suspend freed {freed} of {buffer.nbytes} bytes in mem_get_info"
        claim = torch.empty(int(0.9 * buffer.nbytes), dtype=torch.uint8, device="cuda").fill_(1)
        del claim
        torch.cuda.empty_cache()
        context.reinitialize_inference_state_buffers()
        assert context.memory_buffer.data_ptr() == address
        assert torch.equal(context.memory_buffer.view(torch.uint8).view(-1), expected), "KV bytes lost"
        return f"KV buffer {buffer.nbytes} bytes: {freed} freed while suspended, bytes identical after resume"

    @part("engine")
    def _():
        from megatron.core.inference.config import InferenceConfig
        from megatron.core.inference.contexts.dynamic_context import DynamicInferenceContext
        from megatron.core.inference.engines import DynamicInferenceEngine
        from megatron.core.inference.model_inference_wrappers.gpt.gpt_inference_wrapper import GPTInferenceWrapper
        from megatron.core.inference.sampling_params import SamplingParams
        from megatron.core.inference.text_generation_controllers.text_generation_controller import (
            TextGenerationController)
        try:
            import flash_attn  # noqa: F401
        except ImportError as error:
            raise Blocked("Megatron-Core's dynamic batching attention calls flash_attn_varlen_func / "
                          "flash_attn_with_kvcache (megatron/core/transformer/attention.py), and flash-attn is not "
                          f"installed here ({error}); PyPI has only its source, which needs hours of nvcc, and "
                          "this machine has no network to fetch a prebuilt wheel") from None
        model, config = build_model(megatron_um.create_unified_mempool())
        context = DynamicInferenceContext(config, InferenceConfig(unified_memory_level=1, buffer_size_gb=0.25,
                                                                  max_sequence_length=1024))
        wrapper = GPTInferenceWrapper(model, context)
        controller = TextGenerationController(wrapper, tokenizer=None)
        engine = DynamicInferenceEngine(controller, context)
        for i in range(4):
            engine.add_request(i, list(range(1 + i, 17 + i)), SamplingParams(num_tokens_to_generate=8))
        steps = 0
        while engine.has_unfinished_requests() and steps < 100:
            engine.step_modern()
            steps += 1
        return f"{steps} engine steps"

    passed = sum(r[1] == "PASS" for r in RESULTS)
    failed = sum(r[1] == "FAIL" for r in RESULTS)
    blocked = sum(r[1] == "BLOCKED" for r in RESULTS)
    import megatron.core
    print(f"megatron-core {getattr(megatron.core, '__version__', '?')}, torch {torch.__version__}, "
          f"{torch.cuda.get_device_name(0)}")
    print(f"{passed} passed, {failed} failed, {blocked} blocked")
    torch.distributed.destroy_process_group()
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
