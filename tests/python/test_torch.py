"""uvm.torch's moves without a GPU: a stand-in libuvm records every C call, so a test can fail one
and see what the shim moves back. (Moves on a GPU: test_torch_gpu.py.)"""
import ctypes
import sys

import pytest
from conftest import UVM_PATH

sys.path.insert(0, str(UVM_PATH))


class Library:
    """libuvm as uvm.torch's moves call it, on one device (0): a selection on device 1 fails."""

    def __init__(self):
        self.calls = []

    @staticmethod
    def _tags(tags, count):
        return [tags[i].decode() for i in range(count)] if tags else []

    def uvm_offload_selection(self, device, tags, count, strategy, stream, nbytes):
        self.calls.append(("offload", device, self._tags(tags, count)))
        if device != 0:
            return 1  # UVM_ERROR_INVALID_ARGUMENT
        ctypes.cast(nbytes, ctypes.POINTER(ctypes.c_size_t)).contents.value = 4096
        return 0

    def uvm_onload_selection(self, device, tags, count, stream, nbytes):
        self.calls.append(("onload", device, self._tags(tags, count)))
        return 0

    def uvm_offload_ranges(self, ranges, count, strategy, stream):
        self.calls.append(("offload ranges", count))
        return 0

    def uvm_onload_ranges(self, ranges, count, stream):
        self.calls.append(("onload ranges", count))
        return 0

    def uvm_device_count(self):
        return 1

    def uvm_begin_moves(self, staging):
        return 0

    def uvm_end_moves(self):
        return 0

    def uvm_last_error(self):
        return b"uvm_offload_selection(device=1): no such device"

    def uvm_status_string(self, status):
        return b"invalid argument"

    def uvm_clear_last_error(self):
        pass


@pytest.fixture
def moves(monkeypatch):
    from uvm import _lib, torch as uvm_torch
    library = Library()
    monkeypatch.setitem(sys.modules, "torch", None)  # no torch: streams are the legacy one
    monkeypatch.setattr(_lib, "library", lambda: library)
    monkeypatch.setattr(_lib, "_ctypes_lib", library)
    monkeypatch.setattr(uvm_torch._state, "moves_must_migrate", lambda: False)
    return uvm_torch, library


def test_an_offload_of_a_tag_and_a_device_that_fails_on_the_device_moves_the_tag_back(moves):
    """Issue 73: a failed offload rolled back only the tensors it had moved; a tag moved before the
    failure stayed off the GPU, and NCCL registrations were restored over it."""
    uvm_torch, library = moves
    with pytest.raises(ValueError, match="no such device"):
        uvm_torch.offload(["weights", 1], strategy="staged")
    assert library.calls == [("offload", 0, ["weights"]), ("offload", 1, []), ("onload", 0, ["weights"])]
