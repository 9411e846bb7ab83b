"""The hook that reports PyTorch's blocks to uvm (_torch_blocks.cpp), compiled here for a torch the
installation carries no prebuilt hook for: built against the installed torch's headers, cached like
libuvm.so, exporting the entries the shim calls (attach, probe, arm), and refusing to arm without
uvm's entries. Needs torch with its C++ headers (skipped with the reason otherwise). The prebuilt
hooks are tested in test_wheel.py."""
import ctypes
import sys
from pathlib import Path

import pytest
from conftest import UVM_PATH, builds

sys.path.insert(0, str(UVM_PATH))
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
    for name in ("uvm_torch_blocks_attach", "uvm_torch_blocks_probe", "uvm_torch_blocks_saw", "uvm_torch_blocks_arm"):
        assert hasattr(hook, name), name
    hook.uvm_torch_blocks_arm.argtypes = [ctypes.c_void_p] * 3
    assert hook.uvm_torch_blocks_arm(None, None, None) == 1  # refuses missing entry points
