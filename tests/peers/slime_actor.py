"""slime's Megatron train actors on uvm, started as slime starts them. slime (THUDM/slime at the commit
in .deps/slime/COMMIT, scripts/fetch_peers.sh) finds the library to preload in
slime/ray/actor_group.py, RayTrainGroup._allocate_gpus_for_actor: two folders above
torch_memory_saver.__file__, under the original's file names. Here that lookup runs as written: the
statements of its `if self.args.offload_train and ...` block, taken from slime's file with ast and
executed unmodified, with offload_train and the Megatron backend on. Then a child starts with exactly
the environment a Ray actor gets: this process's (where UVM_SWITCH decides which torch_memory_saver
answers) and the block's env_vars (LD_PRELOAD, TMS_INIT_ENABLE, TMS_INIT_ENABLE_CPU_BACKUP); none of
uvm's own (UVM_PRELOAD_*). The child does what slime's actor does with it: torch allocates inside
the region TMS_INIT_ENABLE opens, `from torch_memory_saver import torch_memory_saver`, pause()
(actor.sleep) must free the memory, get_cpu_backup(zero_copy=True) reads the backup, resume()
(actor.wake_up) must bring every byte back at the same address.

    slime_actor.py OUT.json    exit 0: passed; 1: failed; 77: skipped (slime's file or a GPU missing)
"""
import ast
import json
import os
import subprocess
import sys
import types
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
SLIME = ROOT / ".deps" / "slime"
ACTOR_GROUP = SLIME / "slime" / "ray" / "actor_group.py"

ACTOR = r"""
import json, os, sys, torch
MiB = 1 << 20
report = {"LD_PRELOAD": os.environ.get("LD_PRELOAD")}
weights = torch.empty(96 * MiB + 4096, dtype=torch.uint8, device="cuda")  # inside the region: TMS_INIT_ENABLE
for start in range(0, weights.numel(), 16 * MiB):
    count = min(16 * MiB, weights.numel() - start)
    weights[start:start + count] = (torch.arange(count, device="cuda", dtype=torch.int32) * 7 + start // MiB).to(torch.uint8)
expected = weights.cpu()
address = weights.data_ptr()
from torch_memory_saver import torch_memory_saver  # slime/backends/megatron_utils/actor.py
import torch_memory_saver as module
report["module"] = getattr(module, "__uvm_switch__", False) and "uvm.memory_saver" or module.__name__
torch.cuda.synchronize()
before = torch.cuda.mem_get_info()[0]
torch_memory_saver.pause()  # MegatronTrainRayActor.sleep
torch.cuda.synchronize()
report["freed"] = torch.cuda.mem_get_info()[0] - before
backup = torch_memory_saver.get_cpu_backup(weights, zero_copy=True)  # update_weight/common.py
report["backup_matches"] = backup is not None and bool(torch.equal(backup.view(torch.uint8).reshape(-1)[:expected.numel()], expected))
torch_memory_saver.resume()  # MegatronTrainRayActor.wake_up
report["same_address"] = weights.data_ptr() == address
report["bytes_back"] = bool(torch.equal(weights.cpu(), expected))
report["size"] = expected.numel()
print(json.dumps(report))
"""


def slime_lookup() -> dict:
    """Runs slime's block as written and returns the env_vars it set."""
    tree = ast.parse(ACTOR_GROUP.read_text(), str(ACTOR_GROUP))
    blocks = [node for node in ast.walk(tree) if isinstance(node, ast.If) and "offload_train" in ast.unparse(node.test)
              and "LD_PRELOAD" in ast.unparse(node)]
    if len(blocks) != 1:
        raise SystemExit(f"FAIL: slime's file has {len(blocks)} blocks that set LD_PRELOAD for offload_train, not 1")
    module = ast.Module(body=[blocks[0]], type_ignores=[])
    args = types.SimpleNamespace(offload_train=True, train_backend="megatron")
    scope = {"os": os, "self": types.SimpleNamespace(args=args), "args": args, "env_vars": {}}
    exec(compile(module, str(ACTOR_GROUP), "exec"), scope)
    return scope["env_vars"]


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
    out = Path(sys.argv[1]) if len(sys.argv) > 1 else None
    if not ACTOR_GROUP.is_file():
        print(f"SKIP: slime's {ACTOR_GROUP.relative_to(ROOT)} is not here (scripts/fetch_peers.sh)")
        return 77
    commit = (SLIME / "COMMIT").read_text().strip() if (SLIME / "COMMIT").exists() else "?"
    env_vars = slime_lookup()
    print(f"slime {commit}: LD_PRELOAD={env_vars.get('LD_PRELOAD')}")
    import torch_memory_saver
    switched = getattr(torch_memory_saver, "__uvm_switch__", False)
    report = {"slime": commit, "switched": switched, "env_vars": env_vars}
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
    if switched != is_uvms:
        problems.append(f"slime preloads {preloaded}, {'not ' if switched else ''}uvm's interposer, with the switch "
                        f"{'on' if switched else 'off'}")
    if not gpu:
        if finish(report, problems, out):
            return 1
        print("SKIP: the lookup found its library; the actor needs a GPU")
        return 77
    child = subprocess.run([sys.executable, "-c", ACTOR], env=env, capture_output=True, text=True, timeout=300)
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
            if not actor[check]:
                problems.append(f"{check} is false")
        wanted = "uvm.memory_saver" if switched else "torch_memory_saver"
        if actor["module"] != wanted:
            problems.append(f"the actor's torch_memory_saver is {actor['module']}, not {wanted}")
    if finish(report, problems, out):
        return 1
    print(f"PASS: {actor['module']} in an actor started as slime starts it: freed {actor['freed']} of {actor['size']} "
          "bytes while paused, the CPU backup read, every byte back at the same address")
    return 0


if __name__ == "__main__":
    sys.exit(main())
