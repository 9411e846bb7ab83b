"""create_unified_mempool(sync_ranks=True): a rank that cannot build makes every rank raise the same
error. Two ranks over gloo on loopback; needs torch (a CPU build will do: the ranks agree before any
pool is made), and a CUDA device where a rank makes its pool."""
import os
import socket
import subprocess
import sys

import pytest
from conftest import UVM_PATH

torch = pytest.importorskip("torch", reason="torch is not installed here")
needs_cuda = pytest.mark.skipif(not torch.cuda.is_available(), reason="no CUDA device visible to torch: rank 0 makes a pool")

RANK = """
import os, torch.distributed as dist, uvm
dist.init_process_group("gloo", rank=int(os.environ["RANK"]), world_size=2)
try:
    uvm.create_unified_mempool(sync_ranks=%s)
    print("pool")
except uvm.UnifiedMemoryUnsupportedError as error:
    print("error:", error)
dist.destroy_process_group()
"""


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def run_ranks(tmp_path, sync: bool) -> list[str]:
    port = str(free_port())
    children = []
    for rank in range(2):
        env = {**os.environ, "PYTHONPATH": str(UVM_PATH), "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": port,
               "RANK": str(rank), "UVM_CACHE_DIR": str(tmp_path / f"cache{rank}"), "UVM_LIBRARY": ""}
        if rank == 1:
            env["UVM_CXX"] = "/nonexistent/c++"  # this rank cannot build
        children.append(subprocess.Popen([sys.executable, "-c", RANK % sync], env=env, text=True,
                                         stdout=subprocess.PIPE, stderr=subprocess.PIPE))
    outputs = [child.communicate(timeout=240) for child in children]
    assert [c.returncode for c in children] == [0, 0], outputs
    return [out.strip().splitlines()[-1] for out, _ in outputs]


def test_ranks_agree_on_failure_when_asked(tmp_path):
    rank0, rank1 = run_ranks(tmp_path, sync=True)
    assert rank0 == rank1  # the same error on every rank: the first failing rank's
    if torch.cuda.is_available():
        assert rank0.startswith("error: unified memory is unavailable: rank 1: building libuvm.so failed")
        assert "C++ compiler '/nonexistent/c++' not found" in rank0
    else:  # with no device, rank 0 fails too, and first
        assert rank0.startswith("error: unified memory is unavailable: rank 0: no CUDA device or driver is visible")


@needs_cuda
def test_without_sync_each_rank_decides_alone(tmp_path):
    rank0, rank1 = run_ranks(tmp_path, sync=False)
    assert rank0 == "pool"
    assert rank1.startswith("error:") and "not found" in rank1
