"""Train actors on uvm, started as the RL stacks start them, each stack's own lookup of the library to
preload run as written (from the pinned files scripts/fetch_peers.sh puts in .deps/):
- slime (THUDM/slime, .deps/slime/COMMIT): slime/ray/actor_group.py, RayTrainGroup._allocate_gpus_for_actor,
  finds it two folders above torch_memory_saver.__file__, under the original's file names. The
  statements of its `if self.args.offload_train and ...` block are taken from slime's file with ast
  and executed unmodified, offload_train and the Megatron backend on.
- AReaL (inclusionAI/AReaL, .deps/areal/COMMIT): areal/utils/offload.py, the whole module loaded
  unmodified from its file, and its get_tms_env_vars() called, as AReaL's schedulers do for a
  training worker.
- NeMo-RL (NVIDIA-NeMo/RL, .deps/nemo-rl/COMMIT): its Megatron worker preloads nothing; its
  nemo_rl/models/megatron/memory_saver.py (loaded unmodified, hook mode "torch") is what the worker
  builds its colocated inference model under and pauses and resumes it with.
Then a child starts with exactly the environment such an actor gets: this process's (where
UVM_SWITCH decides which torch_memory_saver answers) and the stack's env_vars (LD_PRELOAD,
TMS_INIT_ENABLE, TMS_INIT_ENABLE_CPU_BACKUP); none of uvm's own (UVM_PRELOAD_*). The child does
what the stack's actor does with it: torch allocates inside the region TMS_INIT_ENABLE opens
(AReaL's engine sets torch_memory_saver.hook_mode = "preload" first, from its module's own import;
NeMo-RL's region is its module's inference_model_alloc_region()), the pause must free the memory, slime reads the backup with get_cpu_backup(zero_copy=True), and
the resume must bring every byte back at the same address.

    train_actors.py STACK OUT.json    STACK: slime | areal | nemo-rl
                                      exit 0: passed; 1: failed; 77: skipped (the stack's file or a GPU missing)
"""
import ast
import json
import os
import subprocess
import sys
import types
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
FILES = {"slime": ROOT / ".deps" / "slime" / "slime" / "ray" / "actor_group.py",
         "areal": ROOT / ".deps" / "areal" / "areal" / "utils" / "offload.py",
         "nemo-rl": ROOT / ".deps" / "nemo-rl" / "nemo_rl" / "models" / "megatron" / "memory_saver.py"}

ACTOR = r"""
import json, os, sys, torch
MiB = 1 << 20
stack, stack_file = sys.argv[1], sys.argv[2]
report = {"LD_PRELOAD": os.environ.get("LD_PRELOAD")}
import contextlib, importlib.util
if stack != "slime":  # the stack's module, unmodified, with its own import of the saver
    spec = importlib.util.spec_from_file_location(stack.replace("-", "_") + "_saver_module", stack_file)
    stack_module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(stack_module)
if stack == "areal" and stack_module.is_tms_enabled():  # FSDPEngine.initialize
    stack_module.torch_memory_saver.hook_mode = "preload"
# slime and AReaL: the region TMS_INIT_ENABLE opens; NeMo-RL: the Megatron worker builds its colocated
# inference model inside inference_model_alloc_region() (hook mode torch, set by the module).
region = stack_module.inference_model_alloc_region() if stack == "nemo-rl" else contextlib.nullcontext()
with region:
    weights = torch.empty(96 * MiB + 4096, dtype=torch.uint8, device="cuda")
for start in range(0, weights.numel(), 16 * MiB):
    count = min(16 * MiB, weights.numel() - start)
    weights[start:start + count] = (torch.arange(count, device="cuda", dtype=torch.int32) * 7 + start // MiB).to(torch.uint8)
expected = weights.cpu()
address = weights.data_ptr()
if stack == "slime":
    from torch_memory_saver import torch_memory_saver  # slime/backends/megatron_utils/actor.py
    pause, resume = torch_memory_saver.pause, torch_memory_saver.resume
elif stack == "areal":  # FSDPEngine.offload / onload
    pause, resume = stack_module.torch_memory_saver.pause, stack_module.torch_memory_saver.resume
else:  # MegatronPolicyWorker._offload_inference_model and its restore
    pause, resume = stack_module.pause_inference_weights, stack_module.resume_inference_weights
import torch_memory_saver as module
report["module"] = getattr(module, "__uvm_switch__", False) and "uvm.memory_saver" or module.__name__
torch.cuda.synchronize()
before = torch.cuda.mem_get_info()[0]
pause()
torch.cuda.synchronize()
report["freed"] = torch.cuda.mem_get_info()[0] - before
if stack == "slime":
    backup = torch_memory_saver.get_cpu_backup(weights, zero_copy=True)  # update_weight/common.py
    report["backup_matches"] = backup is not None and bool(torch.equal(backup.view(torch.uint8).reshape(-1)[:expected.numel()], expected))
resume()
report["same_address"] = weights.data_ptr() == address
report["bytes_back"] = bool(torch.equal(weights.cpu(), expected))
report["size"] = expected.numel()
print(json.dumps(report))
"""


def slime_lookup(path: Path) -> dict:
    """Runs slime's block as written and returns the env_vars it set."""
    tree = ast.parse(path.read_text(), str(path))
    blocks = [node for node in ast.walk(tree) if isinstance(node, ast.If) and "offload_train" in ast.unparse(node.test)
              and "LD_PRELOAD" in ast.unparse(node)]
    if len(blocks) != 1:
        raise SystemExit(f"FAIL: slime's file has {len(blocks)} blocks that set LD_PRELOAD for offload_train, not 1")
    module = ast.Module(body=[blocks[0]], type_ignores=[])
    args = types.SimpleNamespace(offload_train=True, train_backend="megatron")
    scope = {"os": os, "self": types.SimpleNamespace(args=args), "args": args, "env_vars": {}}
    exec(compile(module, str(path), "exec"), scope)
    return scope["env_vars"]


def no_lookup(path: Path) -> dict:
    """NeMo-RL's Megatron worker preloads nothing: its module sets hook mode "torch"."""
    return {}


def areal_lookup(path: Path) -> dict:
    """Loads AReaL's module as written and returns what its get_tms_env_vars() gives."""
    import importlib.util
    spec = importlib.util.spec_from_file_location("areal_offload", path)
    offload = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(offload)
    return offload.get_tms_env_vars()


LOOKUPS = {"slime": slime_lookup, "areal": areal_lookup, "nemo-rl": no_lookup}


def finish(report: dict, problems: list, out: Path | None) -> int:
    """Writes the report; 1 (after saying why) where something failed, else 0."""
    report["problems"] = problems
    if out:
        out.write_text(json.dumps(report, indent=1))
    if problems:
        print("FAIL: " + "; ".join(problems))
        return 1
    return 0


def main() -> int:
    if len(sys.argv) < 2 or sys.argv[1] not in FILES:
        print(f"usage: train_actors.py {{{'|'.join(FILES)}}} [OUT.json]")
        return 2
    stack = sys.argv[1]
    out = Path(sys.argv[2]) if len(sys.argv) > 2 else None
    path = FILES[stack]
    if not path.is_file():
        print(f"SKIP: {stack}'s {path.relative_to(ROOT)} is not here (scripts/fetch_peers.sh)")
        return 77
    commit_file = ROOT / ".deps" / stack / "COMMIT"
    commit = commit_file.read_text().strip() if commit_file.exists() else "?"
    env_vars = LOOKUPS[stack](path)
    print(f"{stack} {commit}: LD_PRELOAD={env_vars.get('LD_PRELOAD')}")
    import torch_memory_saver
    switched = getattr(torch_memory_saver, "__uvm_switch__", False)
    report = {"stack": stack, "commit": commit, "switched": switched, "env_vars": env_vars}
    env = {name: value for name, value in os.environ.items() if not name.startswith("UVM_PRELOAD_")}
    env.update(env_vars)
    try:
        import torch
        gpu = torch.cuda.is_available()
    except ImportError:
        gpu = False
    problems = []
    preloaded = Path(env_vars.get("LD_PRELOAD", ""))
    is_uvms = preloaded.is_file() and b"uvm_preload_active" in preloaded.read_bytes()
    if env_vars and switched != is_uvms:
        problems.append(f"{stack} preloads {preloaded}, {'not ' if switched else ''}uvm's interposer, with the switch "
                        f"{'on' if switched else 'off'}")
    if not gpu:
        if finish(report, problems, out):
            return 1
        print("SKIP: the lookup found its library; the actor needs a GPU")
        return 77
    child = subprocess.run([sys.executable, "-c", ACTOR, stack, str(path)], env=env, capture_output=True, text=True,
                           timeout=300)
    try:
        actor = json.loads(child.stdout.strip().splitlines()[-1])
    except (IndexError, ValueError):
        actor = {}
        problems.append(f"the actor failed (exit {child.returncode}): {child.stderr[-1500:]}")
    report["actor"] = actor
    if actor:
        if actor["freed"] < 0.9 * actor["size"]:
            problems.append(f"pause freed {actor['freed']} bytes of {actor['size']}")
        for check in ("backup_matches", "same_address", "bytes_back"):
            if not actor.get(check, stack != "slime" and check == "backup_matches"):
                problems.append(f"{check} is false")
        wanted = "uvm.memory_saver" if switched else "torch_memory_saver"
        if actor["module"] != wanted:
            problems.append(f"the actor's torch_memory_saver is {actor['module']}, not {wanted}")
    if finish(report, problems, out):
        return 1
    backup = ", the CPU backup read" if stack == "slime" else ""
    print(f"PASS: {actor['module']} in an actor started as {stack} starts it: freed {actor['freed']} of {actor['size']} "
          f"bytes while paused{backup}, every byte back at the same address")
    return 0


if __name__ == "__main__":
    sys.exit(main())
