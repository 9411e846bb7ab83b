"""GPU (two devices): a uvm.memory_saver region's tensor on GPU 0, in both hook modes, sent to
another process through torch.multiprocessing (uvm.sharing) and received
- mapped for the peer GPU (uvm.sharing.receive_on(1)): the receiver's kernels on GPU 1 read the
  sender's bytes and their writes reach the sender, with no copy;
- by a process that sees the GPUs in the other order (CUDA_VISIBLE_DEVICES=1,0), in the form SGLang
  sends (the device as the GPU's UUID): mapped on its index 1, the sender's GPU.
While either maps the tensor the sender's pause fails naming it; once it drops the tensor the pause,
the resume and the bytes are whole. The sender holds 32 MiB of releasable memory."""
import pytest

from test_sharing_gpu import run, torch

if torch.cuda.device_count() < 2:
    pytest.skip(f"needs 2 GPUs; torch sees {torch.cuda.device_count()}", allow_module_level=True)

SCRIPT = r"""
import gc, os, pickle, sys, torch
import torch.multiprocessing as mp
MiB = 1 << 20

def receiver(inbox, outbox, where):
    try:
        use(inbox, outbox, where)
        gc.collect()
        outbox.put("dropped")
        assert inbox.get() == "exit"
    except BaseException:  # the sender reports it, instead of waiting for an answer that never comes
        import traceback
        outbox.put(("error", traceback.format_exc()))

def answer(outbox):
    got = outbox.get(timeout=60)
    if isinstance(got, tuple) and got[0] == "error":
        raise AssertionError("the receiver failed:\n" + got[1])
    return got

def use(inbox, outbox, where):  # the tensor lives in this frame only: its return drops it
    if where == "peer":
        import uvm.sharing
        with uvm.sharing.receive_on(1):
            tensor = inbox.get()
    else:  # this process sees GPU 1 as its index 0 and the sender's GPU as its index 1
        rebuild, args = pickle.loads(inbox.get())
        tensor = rebuild(*args)
    outbox.put(("read", tensor.device.index, int(tensor.to(torch.int64).sum())))
    tensor[:MiB].fill_(5)  # a kernel of the receiver's GPU writes the sender's memory
    torch.cuda.synchronize(tensor.device)
    outbox.put("written")
    assert inbox.get() == "drop"

def pattern(n, seed):
    index = torch.arange(n, device="cuda:0", dtype=torch.int64)
    return ((index * 131 + seed * 17 + 1) % 251).to(torch.uint8)

def sglang_form(tensor):  # what SGLang's MultiprocessingSerializer sends: the device as the GPU's UUID
    from torch.multiprocessing import reductions
    rebuild, args = reductions.reduce_tensor(tensor)
    args = (*args[:6], str(torch.cuda.get_device_properties(args[6]).uuid), *args[7:])
    return pickle.dumps((rebuild, args))

if __name__ == "__main__":
    import faulthandler
    faulthandler.dump_traceback_later(150, exit=True)  # a hang shows where, before the test's timeout
    import uvm
    from uvm.memory_saver import torch_memory_saver as saver
    assert saver.hook_mode == sys.argv[1], (saver.hook_mode, sys.argv[1])
    saver.shareable_tags = {"weights"}  # sent to the receiver (uvm.sharing)
    with saver.region("weights", enable_cpu_backup=True):
        weights = pattern(32 * MiB + 4096, 3)
    expected = weights.clone()
    context = mp.get_context("spawn")
    for where in ("peer", "reordered"):
        inbox, outbox = context.Queue(), context.Queue()
        visible = os.environ.get("CUDA_VISIBLE_DEVICES")
        if where == "reordered":
            os.environ["CUDA_VISIBLE_DEVICES"] = "1,0"  # the child's environment, from its start
        process = context.Process(target=receiver, args=(inbox, outbox, where), daemon=True)
        process.start()
        if visible is None:
            os.environ.pop("CUDA_VISIBLE_DEVICES", None)
        else:
            os.environ["CUDA_VISIBLE_DEVICES"] = visible
        inbox.put(weights if where == "peer" else sglang_form(weights))
        assert answer(outbox) == ("read", 1, int(expected.to(torch.int64).sum())), where
        assert answer(outbox) == "written"
        expected[:MiB].fill_(5)
        assert torch.equal(weights, expected), f"the {where} receiver's write did not reach the sender"
        try:
            saver.pause("weights")
        except RuntimeError as error:
            assert f"mapped by process {process.pid}" in str(error), error
        else:
            raise AssertionError(f"a pause under the {where} receiver's mapping went through")
        inbox.put("drop")
        assert answer(outbox) == "dropped"
        saver.pause("weights")
        saver.resume("weights")
        assert torch.equal(weights, expected), f"bytes lost across the pause after the {where} receiver"
        inbox.put("exit")
        process.join(60)
        assert process.exitcode == 0, (where, process.exitcode)
        expected = pattern(32 * MiB + 4096, 4)
        weights.copy_(expected)
    print("shared with peers")
"""


@pytest.mark.parametrize("hook_mode", ["torch", "preload"])
def test_a_region_tensor_is_mapped_for_a_peer_gpu_and_found_by_uuid_in_another_gpu_order(tmp_path, hook_mode):
    run(tmp_path, hook_mode, "region", SCRIPT, "shared with peers")
