"""vLLM end to end with a model, on vLLM's allocator and on uvm's, for a machine that has vLLM installed
(its compiled ops match its torch) and a model on disk; the GPU machines here have neither, so this has
not run there. Each allocator runs in a fresh process: an LLM with --enable-sleep-mode, greedy tokens
for a few prompts, then for each level asked a sleep, a wake (level 2: the weights reloaded, as verl
and TRL do) and the same prompts again: the tokens must not change. Prints the sleep and wake times of
each, and fails (exit 1) on any token that changed or any run that failed.

    python tests/peers/vllm_model.py --model /path/to/Qwen3-0.6B [--levels 1,2] [--cycles 2]

Exit 77 (skip) where vLLM cannot be imported."""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time

PROMPTS = ["The capital of France is", "def fibonacci(n):", "Sleep mode lets an inference engine"]


def child(model: str, levels: list[int], cycles: int) -> dict:
    from vllm import LLM, SamplingParams
    from vllm.device_allocator import get_mem_allocator_instance
    llm = LLM(model, enable_sleep_mode=True, enforce_eager=True, gpu_memory_utilization=0.3, max_model_len=1024)
    greedy = SamplingParams(temperature=0, max_tokens=16)

    def tokens():
        return [list(output.outputs[0].token_ids) for output in llm.generate(PROMPTS, greedy)]

    allocator = llm.collective_rpc(lambda worker: type(get_mem_allocator_instance()).__module__)[0]
    expected, runs = tokens(), []
    for level in levels:
        for _ in range(cycles):
            start = time.perf_counter()
            llm.sleep(level=level)
            slept = time.perf_counter() - start
            start = time.perf_counter()
            llm.wake_up()
            if level == 2:
                llm.collective_rpc("reload_weights")
            woke = time.perf_counter() - start
            runs.append({"level": level, "sleep_s": slept, "wake_s": woke, "same_tokens": tokens() == expected})
    return {"allocator": allocator, "runs": runs}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", required=True, help="a model vLLM can load (a path, or a name it can fetch)")
    parser.add_argument("--levels", default="1,2")
    parser.add_argument("--cycles", type=int, default=2)
    parser.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    levels = [int(level) for level in args.levels.split(",")]
    if args.child:
        print(json.dumps(child(args.model, levels, args.cycles)))
        return 0
    try:
        import vllm  # noqa: F401
    except Exception as error:  # noqa: BLE001 - any reason vLLM cannot load is a reason to skip
        print(f"SKIP: vLLM cannot be imported here ({type(error).__name__}: {error})")
        return 77
    failed = []
    for name, switch in (("vLLM's allocator", ""), ("uvm's allocator", "vllm")):
        done = subprocess.run([sys.executable, os.path.abspath(__file__), "--child", "--model", args.model,
                               "--levels", args.levels, "--cycles", str(args.cycles)],
                              env={**os.environ, "UVM_SWITCH": switch}, capture_output=True, text=True, timeout=3600)
        lines = [line for line in done.stdout.splitlines() if line.startswith("{")]
        if done.returncode != 0 or not lines:
            print(f"{name}: FAILED\n{done.stderr[-3000:]}")
            failed.append(name)
            continue
        result = json.loads(lines[-1])
        expected_module = "uvm.vllm" if switch else "vllm.device_allocator.cumem"
        if result["allocator"] != expected_module:
            failed.append(f"{name}: allocator {result['allocator']}, not {expected_module}")
        for run in result["runs"]:
            print(f"{name}: level {run['level']}: sleep {run['sleep_s']:.3f} s, wake {run['wake_s']:.3f} s, "
                  f"tokens {'the same' if run['same_tokens'] else 'CHANGED'}")
            if not run["same_tokens"]:
                failed.append(f"{name}: level {run['level']} changed the tokens")
    for reason in failed:
        print(f"FAIL: {reason}")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
