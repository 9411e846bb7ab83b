"""The seed's public surface: same names, shapes and semantics; import without torch."""
import inspect
import sys

import pytest
from conftest import SHIM, python

sys.path.insert(0, str(SHIM))
import uvm  # noqa: E402

try:
    import torch
except ImportError:
    torch = None
needs_torch = pytest.mark.skipif(torch is None, reason="torch is not installed here")


def test_import_does_not_import_torch():
    out = python("import sys, uvm; print('torch' in sys.modules)").stdout.strip()
    assert out == "False"


def test_seed_names_and_shapes():
    assert [s.name for s in uvm.CompilationState] == ["UNATTEMPTED", "FAILURE", "SUCCESS"]
    assert issubclass(uvm.UnifiedMemoryUnsupportedError, Exception)
    assert issubclass(uvm.UnifiedMemoryCompileTimeoutError, uvm.UnifiedMemoryUnsupportedError)
    for name in ("_compilation_state", "_compilation_error", "_so_path", "_ctypes_lib", "_ctypes_lock",
                 "_alloc", "_mod"):
        getattr(uvm, name)  # exists
    keyword_only = inspect.Parameter.KEYWORD_ONLY
    expected = {
        "prefetch_managed_tensor": ["tensor", "device", "stream"],
        "advise_managed_tensor_preferred_location": ["tensor", "device"],
        "advise_managed_tensor_accessed_by": ["tensor", "device"],
        "prefetch_managed_module_parameters": ["module", "device", "include_buffers", "stream"],
        "advise_managed_module_parameters_preferred_location": ["module", "device", "include_buffers"],
    }
    for name, params in expected.items():
        signature = inspect.signature(getattr(uvm, name))
        assert list(signature.parameters) == params, name
        assert signature.parameters["device"].kind == keyword_only, name
    assert callable(uvm.compile_allocator) and callable(uvm.create_unified_mempool)
    assert callable(uvm._get_ctypes_lib)
    with uvm._compile_timeout(5):
        pass
    with pytest.raises(ValueError):
        with uvm._compile_timeout(0):
            pass


def test_ctypes_library_declares_every_entry():
    lib = uvm._get_ctypes_lib()
    assert uvm._ctypes_lib is lib
    assert lib.uvm_prefetch.argtypes is not None and lib.uvm_malloc.restype is not None
    header = (SHIM.parent / "include" / "uvm.h").read_text()
    import re
    declared = set(re.findall(r"UVM_API [^;(]*?\b(uvm_\w+)\(", header))
    assert declared == set(uvm._lib.SIGNATURES), declared ^ set(uvm._lib.SIGNATURES)


def test_without_a_gpu_or_torch_the_pool_is_refused_with_the_reason():
    code = ("import uvm\ntry:\n    uvm.create_unified_mempool()\nexcept uvm.UnifiedMemoryUnsupportedError as e:\n"
            "    print(uvm._compilation_state.name, '|', e)")
    out = python(code).stdout
    if torch is None:
        assert out.startswith("FAILURE | unified memory is unavailable: torch is not installed")
    elif not torch.cuda.is_available():
        assert "no CUDA device or driver is visible to torch" in out


def test_expandable_segments_is_refused_with_what_to_do():
    code = ("import uvm\ntry:\n    uvm.create_unified_mempool()\nexcept uvm.UnifiedMemoryUnsupportedError as e:\n"
            "    print(e)")
    out = python(code, {"PYTORCH_CUDA_ALLOC_CONF": "expandable_segments:True"}).stdout
    if torch is None:
        pytest.skip("torch is not installed here: the torch check comes first")
    assert "expandable_segments:True" in out and "remove it" in out


@needs_torch
def test_tensor_guards():
    assert uvm.prefetch_managed_tensor(None, device=0) is None
    with pytest.raises(TypeError, match="must be a torch.Tensor, not list"):
        uvm.prefetch_managed_tensor([1, 2], device=0)
    assert uvm.prefetch_managed_tensor(torch.empty(0), device=0) is None
    with pytest.raises(ValueError, match="is a cpu tensor"):
        uvm.advise_managed_tensor_preferred_location(torch.ones(4), device=0)
    with pytest.raises(ValueError, match="is a cpu tensor"):
        uvm.prefetch_managed_module_parameters(torch.nn.Linear(2, 2), device=0)


def test_stats_without_a_device_say_so():
    lib = uvm.library()
    if lib.uvm_device_count() > 0:
        pytest.skip("a CUDA device is present: the no-device path is for CPU machines")
    with pytest.raises(uvm.UnifiedMemoryUnsupportedError, match="no usable CUDA device or driver"):
        uvm.stats(0)


def test_doctor_exits_nonzero_with_the_reason_when_no_pool_can_be_made():
    result = python("import sys, uvm.__main__ as m; sys.exit(m.main(['doctor']))", check=False)
    if torch is not None and torch.cuda.is_available():
        assert result.returncode == 0, result.stdout
        assert "ok: uvm.create_unified_mempool() will work" in result.stdout
    else:
        assert result.returncode == 1
        assert "not ok: a pool cannot be created:" in result.stdout
