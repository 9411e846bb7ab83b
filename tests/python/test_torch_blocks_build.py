"""The hook that reports PyTorch's blocks to uvm (_torch_blocks.cpp): built against the installed
torch's headers, cached like libuvm.so, and exporting the one entry the shim calls. Needs torch with
its C++ headers (skipped with the reason otherwise: CI's environment has no torch)."""
import ctypes
import sys
from pathlib import Path

import pytest
from conftest import SHIM, builds

sys.path.insert(0, str(SHIM))
from uvm import _build  # noqa: E402

torch = pytest.importorskip("torch", reason="torch is not installed here")
TORCH_DIR = Path(torch.__file__).resolve().parent
if not (TORCH_DIR / "include" / "c10" / "cuda" / "CUDACachingAllocator.h").is_file():
    pytest.skip("this torch has no CUDA allocator headers", allow_module_level=True)


def test_the_hook_builds_once_against_torch_and_exports_its_entry(tmp_path, monkeypatch):
    monkeypatch.setenv("UVM_CACHE_DIR", str(tmp_path))
    abi = bool(torch._C._GLIBCXX_USE_CXX11_ABI)
    first = _build.build_torch_blocks(TORCH_DIR, abi)
    second = _build.build_torch_blocks(TORCH_DIR, abi)
    assert first == second and builds(tmp_path) == 1
    hook = ctypes.CDLL(str(first))
    assert hook.uvm_torch_watch_blocks(None, None, None) == 1  # refuses missing entry points
