"""SGLang's own torch_memory_saver adapter (python/sglang/srt/utils/torch_memory_saver_adapter.py at
sgl-project/sglang 1373e4f547, fetched into .deps/sglang by scripts/fetch_peers.sh, run unmodified;
only `sglang.srt.utils.common.is_xpu`, all it imports from the rest of SGLang, is stubbed here),
driven through the calls SGLang's engine makes, on uvm.memory_saver under the name
torch_memory_saver: through the installed wheel's switch (UVM_PEERS_VIA=switch, UVM_SWITCH:
tests/peers/run_switched.sh), else this tree's uvm (tests/peers/tms_alias). Its result names the module
that answered `import torch_memory_saver`.

    python tests/peers/sglang_adapter.py MODE OUT.json     MODE: preload | torch | off

The parent starts a scheduler-like process inside the adapter's configure_subprocess(), as SGLang's
engine does. The child loads a transformers Llama model (random weights from a fixed seed) in
region("weights") with a CPU backup, its static KV cache in region("kv_cache"), and captures a decode
step with adapter.cuda_graph(tag="cuda_graph"). Then, several times: greedy decode, SGLang's
release_memory_occupation (pause kv_cache, weights, cuda_graph), a training-like step claiming the
freed memory, resume_memory_occupation (weights, kv_cache, cuda_graph), and greedy decode again
after the KV cache is refilled (its bytes were dropped, as SGLang flushes it). MODE off uses the
adapter disabled (SGLang without --enable-memory-saver): the tokens to match. Writes the tokens and,
per tag, the bytes mem_get_info showed freed by its pause."""
import contextlib
import json
import multiprocessing
import os
import sys
import tempfile
import traceback

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
TAGS_RELEASE = ["kv_cache", "weights", "cuda_graph"]  # SGLang's order: KV cache first, then weights
TAGS_RESUME = ["weights", "kv_cache", "cuda_graph"]
CYCLES, PROMPT, NEW_TOKENS, MAX_LEN = 3, 24, 24, 2048


def sglang_on_path() -> str:
    """A folder with the fetched adapter in SGLang's package layout and the one stubbed import."""
    adapter = os.path.join(ROOT, ".deps", "sglang", "torch_memory_saver_adapter.py")
    if not os.path.isfile(adapter):
        print(f"SKIP: SGLang's adapter is not at {adapter} (scripts/fetch_peers.sh)")
        sys.exit(77)
    folder = tempfile.mkdtemp(prefix="sglang-stub-")
    utils = os.path.join(folder, "sglang", "srt", "utils")
    os.makedirs(utils)
    for package in ("sglang", "sglang/srt", "sglang/srt/utils"):
        open(os.path.join(folder, package, "__init__.py"), "w").close()
    with open(os.path.join(utils, "common.py"), "w") as stub:
        stub.write("def is_xpu():\n    return False\n")
    with open(adapter, "rb") as source, open(os.path.join(utils, "torch_memory_saver_adapter.py"), "wb") as copy:
        copy.write(source.read())
    return folder


def scheduler(mode: str, results) -> None:
    try:
        results.put(run_scheduler(mode))
    except Exception:
        traceback.print_exc()
        results.put({"error": traceback.format_exc()})


def run_scheduler(mode: str) -> dict:
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM, StaticCache
    from sglang.srt.utils.torch_memory_saver_adapter import TorchMemorySaverAdapter

    if mode == "torch":
        import torch_memory_saver
        torch_memory_saver.torch_memory_saver.hook_mode = "torch"
    adapter = TorchMemorySaverAdapter.create(enable=mode != "off")
    if mode == "preload":
        import torch_memory_saver
        saver = torch_memory_saver.torch_memory_saver
        if type(saver).__module__.startswith("uvm."):  # the original fixes its mode later, at first use
            assert saver.hook_mode == "preload"
    device = torch.device("cuda", 0)
    torch.cuda.set_device(device)
    torch.manual_seed(0)
    config = LlamaConfig(vocab_size=8192, hidden_size=1024, intermediate_size=2816, num_hidden_layers=8,
                         num_attention_heads=16, num_key_value_heads=8, max_position_embeddings=MAX_LEN)
    model = LlamaForCausalLM(config).to(torch.bfloat16).eval()
    with adapter.region("weights", enable_cpu_backup=True):
        model = model.to(device)
    cache = StaticCache(config=config, max_cache_len=MAX_LEN)
    with adapter.region("kv_cache"):
        cache.early_initialization(batch_size=8, num_heads=config.num_key_value_heads,
                                   head_dim=config.hidden_size // config.num_attention_heads,
                                   dtype=torch.bfloat16, device=device)
    layers = cache.layers
    prompt = torch.randint(0, config.vocab_size, (8, PROMPT), generator=torch.Generator().manual_seed(1)).to(device)

    static_ids = torch.zeros((8, 1), dtype=torch.long, device=device)
    static_pos = torch.zeros((8, 1), dtype=torch.long, device=device)

    def set_length(length: int) -> None:
        for layer in layers:
            layer.cumulative_length.fill_(length)

    def decode_step():
        return model(input_ids=static_ids, position_ids=static_pos, past_key_values=cache, use_cache=True).logits

    def prefill() -> torch.Tensor:
        set_length(0)
        with torch.no_grad():
            logits = model(input_ids=prompt, position_ids=torch.arange(PROMPT, device=device).expand(8, -1),
                           past_key_values=cache, use_cache=True).logits
        return logits[:, -1].argmax(-1)

    # Capture, as SGLang's graph runner: warm up on a side stream, then capture on it.
    first = prefill()
    static_ids.copy_(first[:, None])
    static_pos.fill_(PROMPT)
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream), torch.no_grad():
        for _ in range(2):
            set_length(PROMPT)
            decode_step()
    torch.cuda.current_stream().wait_stream(stream)
    graph, pool = torch.cuda.CUDAGraph(), torch.cuda.graph_pool_handle()
    torch.cuda.empty_cache()  # as torch.cuda.graph does on entry: what remains is the capture's
    torch.cuda.synchronize()
    free_before_capture = torch.cuda.mem_get_info(device)[0]
    set_length(PROMPT)
    capture = (adapter.cuda_graph(cuda_graph=graph, pool=pool, stream=stream, tag="cuda_graph") if adapter.enabled
               else torch.cuda.graph(graph, pool=pool, stream=stream))
    with torch.no_grad(), capture:
        static_logits = decode_step()
    torch.cuda.synchronize()
    graph_bytes = free_before_capture - torch.cuda.mem_get_info(device)[0]  # what the capture took

    def decode() -> list:
        tokens = [prefill()]
        for step in range(NEW_TOKENS - 1):
            static_ids.copy_(tokens[-1][:, None])
            static_pos.fill_(PROMPT + step)
            set_length(PROMPT + step)
            graph.replay()
            tokens.append(static_logits[:, -1].argmax(-1))
        return torch.stack(tokens, 1).tolist()

    sizes = {"weights": sum(p.numel() * p.element_size() for p in model.parameters()),
             "kv_cache": sum(layer.keys.nbytes + layer.values.nbytes for layer in layers), "cuda_graph": graph_bytes}
    cycles = []
    for _ in range(CYCLES):
        tokens = decode()
        torch.cuda.synchronize()
        freed = {}
        for tag in TAGS_RELEASE:  # release_memory_occupation
            free_before = torch.cuda.mem_get_info(device)[0]
            adapter.pause(tag)
            freed[tag] = torch.cuda.mem_get_info(device)[0] - free_before
        # The training step: plain tensors in the freed memory, outside every region.
        claim = int(0.9 * sum(max(value, 0) for value in freed.values())) // 4 or 1 << 20
        work = torch.ones(claim, dtype=torch.float32, device=device)
        work.mul_(2).sum().item()
        del work
        torch.cuda.empty_cache()
        for tag in TAGS_RESUME:  # resume_memory_occupation
            adapter.resume(tag)
        cycles.append({"tokens_before_release": tokens, "freed": freed, "claimed": claim * 4})
    final = decode()
    import torch_memory_saver
    saver = "off" if mode == "off" else type(torch_memory_saver.torch_memory_saver).__module__
    return {"mode": mode, "sizes": sizes, "cycles": cycles, "tokens_after_last_resume": final, "saver": saver,
            "torch": torch.__version__, "device": torch.cuda.get_device_name(device)}


def adapter_on_path() -> None:
    """SGLang's adapter on sys.path and on the PYTHONPATH children inherit. With UVM_PEERS_VIA=switch
    only SGLang's stub is added: what `import torch_memory_saver` gives is the installed packages'
    and UVM_SWITCH's affair (tests/peers/run_switched.sh). Else this tree's uvm under the original's
    name (tests/peers/tms_alias)."""
    added = [sglang_on_path()]
    if os.environ.get("UVM_PEERS_VIA") != "switch":
        added += [os.path.join(ROOT, "tests", "peers", "tms_alias"), os.path.join(ROOT, "python_shim")]
    sys.path[:0] = added
    os.environ["PYTHONPATH"] = os.pathsep.join(added + [os.environ.get("PYTHONPATH", "")])


def main() -> int:
    mode, out = sys.argv[1], sys.argv[2]
    adapter_on_path()
    from sglang.srt.utils.torch_memory_saver_adapter import TorchMemorySaverAdapter
    adapter = TorchMemorySaverAdapter.create(enable=mode != "off")
    results = multiprocessing.get_context("spawn").Queue()
    with adapter.configure_subprocess():  # as SGLang's engine starts its scheduler
        child = multiprocessing.get_context("spawn").Process(target=scheduler, args=(mode, results))
        child.start()
    result = results.get()
    child.join()
    with open(out, "w") as file:
        json.dump(result, file)
    if "error" in result:
        print(f"{mode}: FAILED in the scheduler process:\n{result['error']}")
        return 1
    print(f"{mode}: exit {child.exitcode}, sizes {result['sizes']}, freed per cycle {[c['freed'] for c in result['cycles']]}")
    return child.exitcode


if __name__ == "__main__":
    sys.exit(main())
