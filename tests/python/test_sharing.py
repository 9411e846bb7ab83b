"""uvm.sharing without torch or a GPU: a stand-in torch (tensor classes, torch.multiprocessing's
reductions, device properties) shows the reducer installed once in front of whatever reducer was
there (torch's, or a patch such as SGLang's), tensors uvm did not allocate handed to it untouched,
and the receiver finding its GPU by the UUID SGLang puts in the device's place. (Bytes between
processes on a GPU: test_sharing_gpu.py.)"""
import sys
import types
from multiprocessing.reduction import ForkingPickler

import pytest
from conftest import UVM_PATH

sys.path.insert(0, str(UVM_PATH))


class Tensor:
    is_cuda = False


class Parameter(Tensor):
    pass


@pytest.fixture
def sharing(monkeypatch):
    def earlier(tensor):  # torch's reducer, or a patch installed before uvm's
        return ("earlier", tensor)

    reductions = types.SimpleNamespace(reduce_tensor=earlier)
    uuids = ["GPU-aaaa", "GPU-bbbb"]
    fake = types.ModuleType("torch")
    fake.Tensor = Tensor
    fake.nn = types.SimpleNamespace(Parameter=Parameter)
    fake.strided = "strided"
    fake.capturing = False  # what is_current_stream_capturing answers; a test sets it
    fake.cuda = types.SimpleNamespace(device_count=lambda: len(uuids),
                                      get_device_properties=lambda i: types.SimpleNamespace(uuid=uuids[i]),
                                      is_current_stream_capturing=lambda: fake.capturing)
    multiprocessing = types.ModuleType("torch.multiprocessing")
    multiprocessing.reductions = reductions
    fake.multiprocessing = multiprocessing
    monkeypatch.setitem(sys.modules, "torch", fake)
    monkeypatch.setitem(sys.modules, "torch.multiprocessing", multiprocessing)
    monkeypatch.setitem(sys.modules, "torch.multiprocessing.reductions", reductions)
    monkeypatch.setattr(ForkingPickler, "_extra_reducers", dict(ForkingPickler._extra_reducers))
    import uvm.sharing as module
    monkeypatch.setattr(module, "_installed", False)
    monkeypatch.setattr(module, "_torch_reduce", None)
    monkeypatch.setattr(module, "reductions", reductions, raising=False)  # for the tests to read
    monkeypatch.setattr(module, "torch", fake, raising=False)  # likewise
    monkeypatch.setattr(module, "_pending_closes", [], raising=False)
    monkeypatch.setattr(module, "_told_close_failed", False, raising=False)
    return module


class FakeLib:
    """The ctypes library as sharing.py calls it: every call recorded; statuses as a test sets them."""

    def __init__(self, monkeypatch, sharing):
        self.calls = []
        self.close_status = 0
        monkeypatch.setattr(sharing._lib, "library", lambda: self)

    def uvm_allocation_info(self, pointer, *out):
        self.calls.append(("info", pointer))
        return 0  # every pointer asked is uvm's

    def uvm_share_export(self, pointer, handle):
        self.calls.append(("export", pointer))
        return 0

    def uvm_share_close(self, pointer):
        self.calls.append(("close", pointer))
        return self.close_status

    def uvm_last_error(self):
        return b"uvm_share_close(0x1000): the test failed it"

    def uvm_clear_last_error(self):
        self.calls.append(("clear",))


def test_the_reducer_goes_in_front_of_the_earlier_one_once_for_tensors_and_parameters(sharing):
    sharing.install()
    sharing.install()  # idempotent: the earlier reducer is kept, not uvm's own
    assert sharing.reductions.reduce_tensor is sharing.reduce_tensor
    assert ForkingPickler._extra_reducers[Tensor] is sharing.reduce_tensor
    assert ForkingPickler._extra_reducers[Parameter] is sharing.reduce_tensor
    assert sharing._torch_reduce(None)[0] == "earlier"


def test_a_tensor_uvm_did_not_allocate_goes_to_the_earlier_reducer_untouched(sharing):
    sharing.install()
    host = Tensor()  # not on a GPU: never asked of uvm
    assert sharing.reduce_tensor(host) == ("earlier", host)


def test_the_receiver_finds_its_gpu_by_index_or_by_the_uuid_sglang_sends(sharing):
    assert sharing._device_index(1) == 1
    assert sharing._device_index("GPU-bbbb") == 1
    with pytest.raises(RuntimeError, match="no GPU of this process has UUID GPU-cccc"):
        sharing._device_index("GPU-cccc")


def test_receive_on_maps_for_the_named_gpu_in_its_block_and_thread_only(sharing):
    import threading
    assert sharing._receiving_device("GPU-aaaa") == 0
    with sharing.receive_on(1):
        assert sharing._receiving_device("GPU-aaaa") == 1
        assert sharing._receiving_device(0) == 1
        seen = []
        other = threading.Thread(target=lambda: seen.append(sharing._receiving_device(0)))
        other.start()
        other.join()
        assert seen == [0], "receive_on reached another thread"
        with sharing.receive_on(0):  # nested: the inner block's GPU, then the outer's again
            assert sharing._receiving_device("GPU-bbbb") == 0
        assert sharing._receiving_device("GPU-bbbb") == 1
    assert sharing._receiving_device("GPU-bbbb") == 1  # the sender's again: found by its UUID
    assert sharing._receiving_device(0) == 0
    for wrong in (-1, "1", True, 1.0):
        with pytest.raises(ValueError, match="receive_on: device must be a GPU index"):
            with sharing.receive_on(wrong):
                pass


class Refusing(Tensor):
    """A tensor with no storage to ask for (sparse, nested, fake): untyped_storage() raises."""
    is_cuda = True

    def __init__(self, layout):
        self.layout = layout
        self.asked = False

    def untyped_storage(self):
        self.asked = True
        raise RuntimeError("this tensor has no storage")


def test_a_tensor_that_is_not_dense_or_has_no_storage_goes_to_the_earlier_reducer_without_asking_uvm(sharing,
                                                                                                     monkeypatch):
    lib = FakeLib(monkeypatch, sharing)
    sharing.install()
    sparse, storageless = Refusing("sparse_coo"), Refusing("strided")
    for tensor in (sparse, storageless):
        assert sharing.reduce_tensor(tensor) == ("earlier", tensor)
    assert lib.calls == []
    # A sparse tensor is not asked for a storage at all: asking spoils torch's own reduction of it.
    assert not sparse.asked and storageless.asked


class Dense(Tensor):
    """A dense CUDA tensor in uvm memory whose stream cannot be waited for."""
    is_cuda = True
    layout = "strided"
    requires_grad = False

    def untyped_storage(self):
        return types.SimpleNamespace(data_ptr=lambda: 0x1000, nbytes=lambda: 64)


def test_a_send_that_fails_before_its_export_leaves_no_export(sharing, monkeypatch):
    lib = FakeLib(monkeypatch, sharing)

    def broken_stream(device):
        raise RuntimeError("the stream cannot be waited for")

    sharing.torch.cuda.current_stream = broken_stream
    tensor = Dense()
    tensor.device = types.SimpleNamespace(index=0)
    with pytest.raises(RuntimeError, match="cannot be waited for"):
        sharing.reduce_tensor(tensor)
    assert ("export", 0x1000) not in lib.calls


def test_a_received_mapping_is_never_left_without_an_owner(sharing, monkeypatch, capsys):
    lib = FakeLib(monkeypatch, sharing)
    # Its tensor dies while this thread captures a graph: no close (it would wait for the device and
    # spoil the capture); kept for later.
    sharing.torch.capturing = True
    mapped = sharing._Mapped(0x1000, 64, 0)
    del mapped  # its last reference: the finalizer runs here
    assert lib.calls == []
    assert sharing.close_pending() == 1  # still capturing
    sharing.torch.capturing = False
    # A close that fails is said once, and kept too.
    lib.close_status = 2
    assert sharing.close_pending() == 1
    mapped = sharing._Mapped(0x2000, 64, 0)
    del mapped
    assert sharing.close_pending() == 2
    err = capsys.readouterr().err
    assert err.count("could not be closed") == 1
    assert "uvm_share_close(0x1000): the test failed it" in err
    lib.close_status = 0
    assert sharing.close_pending() == 0
    assert [call for call in lib.calls if call[0] == "close"][-2:] == [("close", 0x1000), ("close", 0x2000)]
