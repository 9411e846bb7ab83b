"""uvm._prepare without torch or a GPU: a stand-in libuvm records the preparations. Each tag asked is
prepared once on a thread of uvm's, in the order asked, bounded by half the host's available memory;
a failure is kept for the user to read and leaves no error pending; UVM_PREPARE_PAUSE=0 turns it
off. (The first pause's speed with it, on the GPU: bench/node_bench.py.)"""
import sys
import threading

import pytest
from conftest import UVM_PATH

sys.path.insert(0, str(UVM_PATH))


class Library:
    """libuvm as _prepare uses it."""

    def __init__(self, fail=False):
        self.calls, self.cleared, self.fail = [], 0, fail
        self.thread_names = set()
        self.gate = threading.Event()
        self.gate.set()

    def uvm_prepare_pause(self, device, tag, max_bytes, pinned):
        self.gate.wait()
        self.calls.append((device, tag, max_bytes, pinned))
        self.thread_names.add(threading.current_thread().name)
        return 7 if self.fail else 0

    def uvm_get_staging(self, capacity, staged):
        capacity._obj.value = self.held  # what this process holds pinned (a byref)
        return 0

    held = 0

    def uvm_last_error(self):
        return b"uvm_prepare_pause: cudaHostRegister failed"

    def uvm_clear_last_error(self):
        self.cleared += 1


@pytest.fixture
def prepare(monkeypatch, tmp_path):
    import uvm._prepare as module
    from uvm import _lib
    library = Library()
    monkeypatch.setattr(_lib, "library", lambda: library)
    monkeypatch.setattr(module, "_available", lambda: 246 << 20)  # half of it: 123 MiB
    monkeypatch.setattr(module, "_ledger_path", lambda: str(tmp_path / "ledger.json"))
    return module, library


def test_each_tag_is_prepared_once_in_order_on_a_thread_of_uvms_bounded_by_the_host(prepare):
    module, library = prepare
    preparer = module.Preparer()
    library.gate.clear()  # the first preparation waits: the next asks queue behind it
    preparer.ask("weights")
    preparer.ask("kv")
    preparer.ask("kv")  # asked twice while queued: prepared once
    library.gate.set()
    preparer.wait()
    assert [(tag, bound) for _, tag, bound, _ in library.calls] == [(b"weights", 123 << 20), (b"kv", 123 << 20)]
    assert all(device == -1 for device, *_ in library.calls)  # every device of the tag
    assert library.thread_names == {"uvm-prepare-pause"}
    assert preparer.last_error == ""


def test_a_failed_preparation_is_kept_to_read_and_leaves_no_error_pending(prepare):
    module, library = prepare
    library.fail = True
    preparer = module.Preparer()
    preparer.ask("weights")
    preparer.wait()
    assert preparer.last_error == "uvm_prepare_pause: cudaHostRegister failed"
    assert library.cleared == 1


def waits_within(preparer, seconds: float = 10) -> bool:
    """Whether preparer.wait() returns within `seconds` (a hung wait fails the test, not the run)."""
    waiter = threading.Thread(target=preparer.wait, daemon=True)
    waiter.start()
    waiter.join(seconds)
    return not waiter.is_alive()


def test_a_preparation_that_raises_is_kept_and_the_thread_goes_on(prepare, monkeypatch):
    module, library = prepare
    from uvm import _lib
    from uvm._errors import UnifiedMemoryUnsupportedError

    def no_library():
        raise UnifiedMemoryUnsupportedError("libuvm.so could not be loaded")

    monkeypatch.setattr(_lib, "library", no_library)
    preparer = module.Preparer()
    preparer.ask("weights")
    assert waits_within(preparer), "wait() hung after a preparation raised"
    assert preparer.last_error == "UnifiedMemoryUnsupportedError: libuvm.so could not be loaded"
    monkeypatch.setattr(_lib, "library", lambda: library)
    preparer.ask("kv")  # the thread still answers
    assert waits_within(preparer)
    assert [tag for _, tag, _, _ in library.calls] == [b"kv"]


def test_a_forked_child_prepares_on_a_thread_of_its_own(prepare):
    import os
    module, library = prepare
    preparer = module.Preparer()
    preparer.ask("weights")  # the parent's thread runs
    assert waits_within(preparer)
    library.gate.clear()
    preparer.ask("held")  # and is busy with this one when the child is made
    child = os.fork()
    if child == 0:
        library.gate.set()
        preparer.ask("in the child")
        os._exit(0 if waits_within(preparer, 5) and b"in the child" in [c[1] for c in library.calls] else 1)
    library.gate.set()
    _, status = os.waitpid(child, 0)
    assert os.WIFEXITED(status) and os.WEXITSTATUS(status) == 0
    assert waits_within(preparer)


def test_uvm_prepare_pause_0_turns_it_off_and_the_bound_is_half_of_memavailable(monkeypatch):
    import uvm._prepare as module
    monkeypatch.setenv("UVM_PREPARE_PAUSE", "0")
    assert not module.enabled()
    monkeypatch.setenv("UVM_PREPARE_PAUSE", "1")
    assert module.enabled()
    monkeypatch.delenv("UVM_PREPARE_PAUSE")
    assert module.enabled()



def test_the_host_memory_is_read_from_memavailable(tmp_path):
    import uvm._prepare as module
    meminfo = tmp_path / "meminfo"
    meminfo.write_text("MemTotal:       263856524 kB\nMemFree:         1000 kB\nMemAvailable:   131072000 kB\n")
    assert module._available(str(meminfo)) == 131072000 * 1024
    meminfo.write_text("MemTotal:       263856524 kB\n")
    assert module._available(str(meminfo)) is None
    assert module._available(str(tmp_path / "none")) is None


def test_the_node_shares_one_bound_half_its_memory_across_its_processes(prepare):
    """Issue 73: each process bounded itself at half of MemAvailable, so eight ranks on a node each
    claimed half. Now another live process's holding counts against this one's share, a gone one's
    does not, and what is claimed is in the ledger while it is pinned."""
    import json
    import os
    module, library = prepare
    gone = os.fork()
    if gone == 0:
        os._exit(0)
    os.waitpid(gone, 0)
    with open(module._ledger_path(), "w") as ledger:
        json.dump({str(os.getppid()): 100 << 20, str(gone): 500 << 20}, ledger)
    library.held = 10 << 20  # this process holds 10 MiB already
    preparer = module.Preparer()
    preparer.ask("weights")
    assert waits_within(preparer)
    # Half of (246 available + 100 held by the other + 10 of ours) = 178, less 110: 68 MiB more.
    assert [bound for _, _, bound, _ in library.calls] == [68 << 20]
    with open(module._ledger_path()) as ledger:
        assert json.load(ledger) == {str(os.getppid()): 100 << 20, str(os.getpid()): 10 << 20}
    # The other processes hold the node's half: nothing is pinned, and the user can read why.
    with open(module._ledger_path(), "w") as ledger:
        json.dump({str(os.getppid()): 400 << 20}, ledger)
    preparer.ask("kv")
    assert waits_within(preparer)
    assert len(library.calls) == 1
    assert "the node's processes hold half of its available memory" in preparer.last_error
