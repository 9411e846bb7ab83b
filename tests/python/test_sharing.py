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
    fake.cuda = types.SimpleNamespace(device_count=lambda: len(uuids),
                                      get_device_properties=lambda i: types.SimpleNamespace(uuid=uuids[i]))
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
    return module


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
