"""GPU (one device): a uvm.memory_saver region with a pinned CPU backup prepares its first pause at
its end: uvm pins the staging memory the pause will copy into on a thread of its own, so the pause
pins nothing and its bytes come back whole; with UVM_PREPARE_PAUSE=0 nothing is pinned before the
pause. 64 MiB of releasable memory per process, in a child process of its own."""
import os
import subprocess
import sys

import pytest
from conftest import UVM_PATH

torch = pytest.importorskip("torch", reason="torch is not installed here")
if not torch.cuda.is_available():
    pytest.skip("no CUDA device visible to torch", allow_module_level=True)

SCRIPT = r"""
import sys, torch
import uvm
from uvm import _prepare
from uvm.memory_saver import torch_memory_saver as saver
MiB = 1 << 20
saver.retain_cpu_backup = True
uvm.release_staging()
with saver.region("weights", enable_cpu_backup=True):
    weights = torch.arange(16 * MiB, device="cuda", dtype=torch.int32)  # 64 MiB
expected = weights.clone()
_prepare.preparer.wait()
before = uvm.staging()
saver.pause("weights")
after = uvm.staging()
saver.resume("weights")
assert torch.equal(weights, expected), "bytes lost across the pause"
print("staging", before["capacity_bytes"], after["capacity_bytes"], after["blocks"])
"""


def run(tmp_path, prepare: str) -> tuple[int, int, int]:
    script = tmp_path / "prepare.py"
    script.write_text(SCRIPT)
    env = {**os.environ, "PYTHONPATH": str(UVM_PATH), "UVM_PREPARE_PAUSE": prepare}
    result = subprocess.run([sys.executable, str(script)], env=env, capture_output=True, text=True, timeout=200)
    assert result.returncode == 0, result.stdout + result.stderr
    line = next(line for line in result.stdout.splitlines() if line.startswith("staging "))
    return tuple(int(x) for x in line.split()[1:])


def test_a_region_with_a_pinned_backup_prepares_its_first_pause(tmp_path):
    before, after, _ = run(tmp_path, "1")
    assert before >= 64 << 20, f"nothing pinned ahead of the pause ({before} bytes)"
    assert after == before, f"the pause pinned more ({before} -> {after} bytes)"


def test_uvm_prepare_pause_0_pins_nothing_ahead(tmp_path):
    before, after, _ = run(tmp_path, "0")
    assert before == 0
    assert after >= 64 << 20
