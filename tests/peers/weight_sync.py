"""A trainer→engine weight update end to end (issue 60, item 4), through SGLang's own adapter
(tests/peers/sglang_adapter.py says where it comes from) on uvm.memory_saver.

    python tests/peers/weight_sync.py MODE OUT.json     MODE: preload | torch | off

Two processes besides this launcher, as an RL run has them. The "trainer" keeps a Llama-style
model's bf16 weights in a uvm.memory_saver region (hook mode torch, CPU backup). The "engine" is
started inside the adapter's configure_subprocess(), as SGLang's engine starts its scheduler, and
keeps the same model's weights in region("weights") (CPU backup) and its static KV cache in
region("kv_cache"). Several steps, each:
  1. the trainer wakes its region, "trains" (every weight drawn again from the step's seed, so that
     each step's tokens differ), has the engine wake (resume_memory_occupation), and sends its
     tensors as SGLang's serializer does (torch.multiprocessing's pickler): uvm memory travels by
     CUDA IPC (uvm.sharing), no byte through the host;
  2. the engine wakes its regions, copies the received tensors into its weights, drops them and
     answers; the trainer can sleep again only then (uvm refuses a pause of memory another process
     maps), and does;
  3. the same update through host memory, timed: the trainer copies its weights to the CPU and sends
     them (torch.multiprocessing puts CPU tensors in shared memory), the engine copies them to the
     GPU (into buffers of its own, outside its weights, so that only the IPC update reaches them);
  4. the engine decodes greedily and sleeps (SGLang's release_memory_occupation: KV cache, weights).
MODE off is the reference: the adapter disabled (SGLang without --enable-memory-saver), weights
loaded from the host copies with load_state_dict, no IPC. Writes each step's tokens and the two
updates' times (from the trainer's send to the engine's copies done, on the system's monotonic
clock)."""
import gc
import json
import multiprocessing
import os
import sys
import time
import traceback

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from sglang_adapter import adapter_on_path  # noqa: E402

STEPS, PROMPT, NEW_TOKENS, MAX_LEN, BATCH = 4, 24, 24, 1024, 8


def config():
    from transformers import LlamaConfig
    return LlamaConfig(vocab_size=8192, hidden_size=1024, intermediate_size=2816, num_hidden_layers=8,
                       num_attention_heads=16, num_key_value_heads=8, max_position_embeddings=MAX_LEN)


def model_on(device, region):
    import torch
    from transformers import LlamaForCausalLM
    torch.manual_seed(0)
    model = LlamaForCausalLM(config()).to(torch.bfloat16).eval()
    with region:
        return model.to(device)


def train(model, step: int) -> None:
    """Every weight drawn again from the step's seed, at its initial scale (norms stay 1)."""
    import torch
    generator = torch.Generator(device="cuda").manual_seed(1000 + step)
    with torch.no_grad():
        for name, parameter in sorted(model.named_parameters()):
            if parameter.dim() > 1:
                parameter.normal_(0.0, 0.02, generator=generator)


def serialized(named_tensors) -> bytes:
    """As SGLang's MultiprocessingSerializer sends tensors: torch.multiprocessing's pickler, here in
    the sender's thread (a Queue pickles in a thread of its own, where a failure is only printed)."""
    import io
    from multiprocessing.reduction import ForkingPickler
    buffer = io.BytesIO()
    ForkingPickler(buffer).dump(named_tensors)
    return buffer.getvalue()


def trainer(mode: str, to_engine, from_engine, results) -> None:
    try:
        import torch
        import uvm
        from uvm.memory_saver import torch_memory_saver as saver
        saver.hook_mode = "torch"
        saver.shareable_tags = {"train"}  # its tensors are sent to the engine (uvm.sharing)
        device = torch.device("cuda", 0)
        torch.cuda.set_device(device)
        model = model_on(device, saver.region("train", enable_cpu_backup=True))
        names = [name for name, _ in model.named_parameters()]
        for step in range(STEPS):
            saver.resume("train")
            train(model, step)
            torch.cuda.synchronize()
            to_engine.put(("wake", 0.0, b""))  # SGLang's resume_memory_occupation, before the update
            assert from_engine.get(timeout=120) == "awake"
            if mode != "off":
                sent = time.monotonic()
                to_engine.put(("ipc", sent, serialized([(n, p.detach()) for n, p in model.named_parameters()])))
                assert from_engine.get(timeout=120) == "dropped"
            sent = time.monotonic()
            to_engine.put(("host", sent, serialized([(n, p.detach().to("cpu")) for n, p in model.named_parameters()])))
            assert from_engine.get(timeout=120) == "copied"
            saver.pause("train")  # refused while the engine still mapped the weights
        to_engine.put(("done", 0.0, names))
        results.put({"trainer": "ok", "uvm": uvm.__file__})
    except Exception:
        traceback.print_exc()
        results.put({"error": "trainer: " + traceback.format_exc()})


def engine(mode: str, to_engine, from_engine, results) -> None:
    try:
        results.put(run_engine(mode, to_engine, from_engine))
    except Exception:
        traceback.print_exc()
        results.put({"error": "engine: " + traceback.format_exc()})


def run_engine(mode: str, to_engine, from_engine) -> dict:
    import torch
    from transformers import StaticCache
    from sglang.srt.utils.torch_memory_saver_adapter import TorchMemorySaverAdapter

    if mode == "torch":
        import torch_memory_saver
        torch_memory_saver.torch_memory_saver.hook_mode = "torch"
    adapter = TorchMemorySaverAdapter.create(enable=mode != "off")
    device = torch.device("cuda", 0)
    torch.cuda.set_device(device)
    model = model_on(device, adapter.region("weights", enable_cpu_backup=True))
    parameters = dict(model.named_parameters())
    scratch = {name: torch.empty_like(p) for name, p in parameters.items()}  # the host path's target
    cfg = config()
    cache = StaticCache(config=cfg, max_cache_len=MAX_LEN)
    with adapter.region("kv_cache"):
        cache.early_initialization(batch_size=BATCH, num_heads=cfg.num_key_value_heads,
                                   head_dim=cfg.hidden_size // cfg.num_attention_heads, dtype=torch.bfloat16,
                                   device=device)
    prompt = torch.randint(0, cfg.vocab_size, (BATCH, PROMPT), generator=torch.Generator().manual_seed(1)).to(device)

    def decode() -> list:
        for layer in cache.layers:
            layer.cumulative_length.fill_(0)
        with torch.no_grad():
            logits = model(input_ids=prompt, position_ids=torch.arange(PROMPT, device=device).expand(BATCH, -1),
                           past_key_values=cache, use_cache=True).logits
            tokens = [logits[:, -1].argmax(-1)]
            for step in range(NEW_TOKENS - 1):
                logits = model(input_ids=tokens[-1][:, None],
                               position_ids=torch.full((BATCH, 1), PROMPT + step, device=device),
                               past_key_values=cache, use_cache=True).logits
                tokens.append(logits[:, -1].argmax(-1))
        return torch.stack(tokens, 1).tolist()

    steps, paused = [], False
    weight_bytes = sum(p.numel() * p.element_size() for p in parameters.values())
    while True:
        kind, sent, payload = to_engine.get(timeout=300)
        if kind == "done":
            break
        if kind == "wake":
            if paused:  # resume_memory_occupation
                adapter.resume("weights")
                adapter.resume("kv_cache")
                paused = False
            from_engine.put("awake")
            continue
        from multiprocessing.reduction import ForkingPickler
        payload = ForkingPickler.loads(payload)  # CUDA IPC (uvm.sharing) or shared host memory
        if kind == "ipc":
            with torch.no_grad():
                for name, tensor in payload:
                    parameters[name].copy_(tensor)
            torch.cuda.synchronize()
            ipc_s = time.monotonic() - sent
            same = all(tensor.device == device for _, tensor in payload)
            del payload, tensor
            gc.collect()  # the last view of each mapping goes: the trainer is counted out
            from_engine.put("dropped")
            steps.append({"ipc_update_s": ipc_s, "received_on_device": same})
            continue
        targets = scratch if mode != "off" else parameters  # off: the reference loads them directly
        with torch.no_grad():
            if mode == "off":
                model.load_state_dict(dict(payload), strict=True)
            else:
                for name, tensor in payload:
                    targets[name].copy_(tensor)
        torch.cuda.synchronize()
        host_s = time.monotonic() - sent
        del payload
        from_engine.put("copied")
        if mode == "off":
            steps.append({})
        steps[-1]["host_update_s"] = host_s
        steps[-1]["tokens"] = decode()
        torch.cuda.synchronize()
        adapter.pause("kv_cache")  # release_memory_occupation, SGLang's order
        adapter.pause("weights")
        paused = True
    import torch_memory_saver
    saver = "off" if mode == "off" else type(torch_memory_saver.torch_memory_saver).__module__
    return {"mode": mode, "steps": steps, "weight_bytes": weight_bytes, "saver": saver, "torch": torch.__version__,
            "cuda": torch.version.cuda, "device": torch.cuda.get_device_name(device),
            "driver": torch.cuda.driver_version() if hasattr(torch.cuda, "driver_version") else None}


def main() -> int:
    mode, out = sys.argv[1], sys.argv[2]
    adapter_on_path()
    from sglang.srt.utils.torch_memory_saver_adapter import TorchMemorySaverAdapter
    adapter = TorchMemorySaverAdapter.create(enable=mode != "off")
    spawn = multiprocessing.get_context("spawn")
    to_engine, from_engine, results = spawn.Queue(), spawn.Queue(), spawn.Queue()
    with adapter.configure_subprocess():  # as SGLang's engine starts its scheduler
        engine_process = spawn.Process(target=engine, args=(mode, to_engine, from_engine, results), daemon=True)
        engine_process.start()
    trainer_process = spawn.Process(target=trainer, args=(mode, to_engine, from_engine, results), daemon=True)
    trainer_process.start()
    answers = []
    while len(answers) < 2 and not any("error" in answer for answer in answers):
        answers.append(results.get(timeout=900))
    errors = [answer["error"] for answer in answers if "error" in answer]
    result = next((answer for answer in answers if "steps" in answer), {})
    if errors:
        result = {"error": "\n".join(errors)}
    for process in (trainer_process, engine_process):
        process.join(60 if not errors else 5)
        if process.is_alive():
            process.kill()  # the other side's failure left it waiting
    with open(out, "w") as file:
        json.dump(result, file)
    if errors:
        print(f"{mode}: FAILED\n{result['error']}")
        return 1
    print(f"{mode}: {len(result['steps'])} steps, {result['weight_bytes']} bytes of weights, updates (s): "
          + ", ".join(f"ipc {s.get('ipc_update_s', 0):.3f} host {s['host_update_s']:.3f}" for s in result["steps"]))
    return 0


if __name__ == "__main__":
    sys.exit(main())
