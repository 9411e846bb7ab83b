"""uvm.vllm without a GPU: the plugin and the switch put uvm's allocator in vLLM's place only where
asked and only for a vLLM it knows; vLLM's sleep policy (level x tag, backup or drop, selective
wake); and what the allocator refuses. A stand-in vLLM of the real one's shape (its cumem module,
get_mem_allocator_instance importing the class at each call, and its installed version) stands in
for vLLM, which needs torch 2.14. The GPU half: tests/peers/run_vllm_tests.sh runs vLLM's own
allocator tests on uvm."""
import textwrap

import pytest
from conftest import UVM_PATH, python

STAND_IN = {
    "vllm/__init__.py": "",
    "vllm/device_allocator/__init__.py": """
        DEFERRABLE_TAGS = ("weights", "kv_cache")
        def get_mem_allocator_instance():
            from vllm.device_allocator.cumem import CuMemAllocator
            return CuMemAllocator.get_instance()
    """,
    "vllm/device_allocator/cumem.py": """
        def create_and_map(handle):
            pass
        class CuMemAllocator:
            instance = None
            ORIGINAL = True
            @staticmethod
            def get_instance():
                if CuMemAllocator.instance is None:
                    CuMemAllocator.instance = CuMemAllocator()
                return CuMemAllocator.instance
    """,
    # vLLM's loader of general plugins (vllm/plugins/__init__.py): every entry point of the group,
    # or those VLLM_PLUGINS names.
    "vllm/plugins.py": """
        import os
        from importlib.metadata import entry_points
        def load_general_plugins():
            allowed = os.environ.get("VLLM_PLUGINS")
            allowed = None if allowed is None else allowed.split(",")
            for plugin in entry_points(group="vllm.general_plugins"):
                if allowed is None or plugin.name in allowed:
                    plugin.load()()
    """,
}


def stand_in(folder, version: str = "0.33.0"):
    for name, text in STAND_IN.items():
        path = folder / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(textwrap.dedent(text))
    info = folder / f"vllm-{version}.dist-info"
    info.mkdir()
    (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: vllm\nVersion: {version}\n")
    return folder


WHICH = """
import sys, uvm._switch
uvm._switch.install()  # what uvm_switch.pth does at start-up when UVM_SWITCH is set
from vllm.device_allocator import get_mem_allocator_instance
allocator = get_mem_allocator_instance()
print(type(allocator).__module__, "torch" in sys.modules)
"""


@pytest.mark.parametrize("value, module", [("vllm", "uvm.vllm"), ("1", "uvm.vllm"), ("all", "uvm.vllm"),
                                           ("torch_memory_saver,vllm", "uvm.vllm"), ("megatron", "vllm.device_allocator.cumem"),
                                           ("0", "vllm.device_allocator.cumem"), ("", "vllm.device_allocator.cumem")])
def test_the_switch_gives_vllm_uvms_allocator_only_where_asked_and_imports_no_torch(tmp_path, value, module):
    folder = stand_in(tmp_path)
    shown = python(WHICH, {"PYTHONPATH": f"{folder}:{UVM_PATH}", "UVM_SWITCH": value})
    # The class only: nothing of CUDA or torch is touched until vLLM allocates (vLLM forks workers).
    assert shown.stdout.split() == [module, "False"], shown.stdout + shown.stderr
    assert "uvm:" not in shown.stderr


def test_a_vllm_version_it_does_not_know_keeps_vllms_allocator_and_is_told_once(tmp_path):
    folder = stand_in(tmp_path, "0.34.0")
    code = WHICH + """
import vllm.device_allocator.cumem as cumem, uvm.vllm, uvm.vllm_plugin
uvm.vllm_plugin.register(); uvm.vllm_plugin.register(); uvm.vllm.patch(cumem)  # said once, however often asked
print(cumem.CuMemAllocator.ORIGINAL)
"""
    shown = python(code, {"PYTHONPATH": f"{folder}:{UVM_PATH}", "UVM_SWITCH": "vllm"})
    assert shown.stdout.split() == ["vllm.device_allocator.cumem", "False", "True"], shown.stdout
    assert shown.stderr.count("uvm: vLLM 0.34.0 is not a version uvm's sleep-mode allocator knows (it knows 0.33); "
                              "vLLM keeps its own CuMemAllocator") == 1, shown.stderr


def test_the_plugin_puts_it_in_place_where_no_pth_ran_and_refuses_after_vllms_own_was_made(tmp_path):
    folder = stand_in(tmp_path)
    code = """
import sys
import vllm.device_allocator.cumem as cumem  # imported before the plugin ran: no import hook saw it
import uvm.vllm_plugin
uvm.vllm_plugin.register(); uvm.vllm_plugin.register()  # vLLM may run a plugin more than once
from vllm.device_allocator import get_mem_allocator_instance
print(type(get_mem_allocator_instance()).__module__, cumem.vllm_CuMemAllocator.ORIGINAL, "torch" in sys.modules)
"""
    env = {"PYTHONPATH": f"{folder}:{UVM_PATH}", "UVM_SWITCH": "vllm"}
    assert python(code, env).stdout.split() == ["uvm.vllm", "True", "False"]
    # vLLM's own allocator made first: two allocators would split the memory; it stays, and says why.
    made_first = """
import os
import vllm.device_allocator.cumem as cumem, uvm.vllm_plugin
cumem.CuMemAllocator.get_instance()
os.environ["UVM_SWITCH"] = "vllm"  # switched only now: the process started unswitched
uvm.vllm_plugin.register()
print(cumem.CuMemAllocator.ORIGINAL)
"""
    shown = python(made_first, {**env, "UVM_SWITCH": ""})
    assert shown.stdout.strip() == "True"
    assert "vLLM made its own CuMemAllocator before uvm's plugin ran" in shown.stderr
    off = python(code.replace("vllm_CuMemAllocator", "CuMemAllocator"), {**env, "UVM_SWITCH": "megatron"})
    assert off.stdout.split() == ["vllm.device_allocator.cumem", "True", "False"]


@pytest.mark.parametrize("level, weights, runtime, graphs, kv, workspace, default", [
    (1, True, True, True, False, False, False),   # level 1: weights, runtime state and graphs kept
    (2, False, True, True, False, False, False),  # level 2: weights dropped too
])
def test_the_sleep_policy_of_each_level_keeps_what_vllms_keeps(level, weights, runtime, graphs, kv, workspace, default):
    from uvm.vllm import sleep_backups
    # vLLM's CuMemBackend.suspend(level): ("weights",)? + ("runtime", "cudagraph")
    offload = (("weights",) if level == 1 else ()) + ("runtime", "cudagraph")
    tags = ["weights", "runtime", "cudagraph", "kv_cache", "workspace", "default"]
    assert sleep_backups(tags, offload) == {"weights": weights, "runtime": runtime, "cudagraph": graphs,
                                            "kv_cache": kv, "workspace": workspace, "default": default}


def test_sleep_without_tags_keeps_the_default_tag_and_a_str_is_one_tag():
    from uvm.vllm import sleep_backups
    assert sleep_backups(["default", "weights"], None) == {"default": True, "weights": False}
    assert sleep_backups(["weights", "weights_extra"], "weights") == {"weights": True, "weights_extra": False}
    assert sleep_backups(["weights"], ()) == {"weights": False}


@pytest.mark.parametrize("tags, woken", [
    (None, ["weights", "kv_cache", "runtime", "workspace", "cudagraph"]),
    (["weights"], ["weights", "runtime", "workspace", "cudagraph"]),  # kv_cache deferred, the rest always
    (["kv_cache"], ["kv_cache", "runtime", "workspace", "cudagraph"]),
    ([], ["runtime", "workspace", "cudagraph"]),
])
def test_a_selective_wake_defers_only_weights_and_kv_cache(tags, woken):
    from uvm.vllm import wake_tags
    assert wake_tags(["weights", "kv_cache", "runtime", "workspace", "cudagraph"], tags) == woken


def test_a_backup_kind_it_does_not_have_is_refused_by_name(monkeypatch):
    from uvm.vllm import CuMemAllocator
    monkeypatch.setenv("UVM_VLLM_BACKUP", "nvme")
    with pytest.raises(ValueError, match=r"UVM_VLLM_BACKUP='nvme': use one of pinned, mmap, disk"):
        CuMemAllocator()
    monkeypatch.setenv("UVM_VLLM_BACKUP", "mmap")
    monkeypatch.setenv("UVM_VLLM_RETAIN_BACKUPS", "0")
    monkeypatch.setenv("UVM_COMPRESS_BACKUPS", "1")
    made = CuMemAllocator()
    assert (made.backup, made.retain_backups, made.compress_backups) == ("mmap", False, True)
    monkeypatch.delenv("UVM_VLLM_RETAIN_BACKUPS")
    assert CuMemAllocator().retain_backups is True  # kept by default: the host memory vLLM holds anyway


def test_a_failure_reaches_vllm_as_runtime_error_naming_the_call_and_tag():
    from uvm import _lib
    from uvm.vllm import _checked
    lib = _lib.library()
    status = lib.uvm_pause(99, b"vllm.weights")  # a device that does not exist: uvm's ValueError
    with pytest.raises(RuntimeError, match=r"uvm's vLLM allocator: sleep of tag 'weights' failed: .*uvm_pause\(device=99"):
        _checked(status, "sleep", "weights")


class FakeLib:
    """Records what uvm's vLLM allocator asks of libuvm (no GPU): every call succeeds."""

    def __init__(self):
        self.calls = []

    def __getattr__(self, name):
        def call(*args):
            self.calls.append((name, args[1].decode() if name in ("uvm_set_backup", "uvm_pause") else None))
            return 0
        return call


def test_a_sleep_remembers_the_tags_it_kept_pinned_and_after_a_wake_gives_back_then_pins_ahead(monkeypatch):
    """With backups given back, the release and the next sleep's pinning run on a thread of their own,
    in that order (a release stops a preparation under way), for the tags the last sleep kept pinned."""
    import uvm.vllm as vllm
    from uvm import _lib, _prepare
    fake = FakeLib()
    monkeypatch.setattr(_lib, "library", lambda: fake)
    monkeypatch.setattr(vllm, "_allocations", lambda lib, tag: [])
    asked = []
    monkeypatch.setattr(_prepare.preparer, "ask", lambda tag: asked.append((tag, len(fake.calls))))
    monkeypatch.setenv("UVM_VLLM_RETAIN_BACKUPS", "0")
    allocator = vllm.CuMemAllocator()
    allocator._put_to_sleep({"weights": True, "kv_cache": False, "runtime": True}, "sleep")
    assert allocator._kept_pinned == ["weights", "runtime"]
    assert ("uvm_pause", "vllm.kv_cache") in fake.calls and ("uvm_set_backup", "vllm.kv_cache") in fake.calls
    allocator._put_to_sleep({"weights": False, "runtime": True}, "sleep")  # level 2 next: weights dropped
    assert allocator._kept_pinned == ["runtime"]
    fake.calls.clear()
    allocator._give_back_after_wake(list(allocator._kept_pinned))
    allocator._giving_back.join(10)
    assert [name for name, _ in fake.calls] == ["uvm_release_staging"]
    assert asked == [("vllm.runtime", 1)]  # after the release
    monkeypatch.setenv("UVM_PREPARE_PAUSE", "0")
    asked.clear()
    allocator._give_back_after_wake(["runtime"])
    allocator._giving_back.join(10)
    assert asked == []  # released, nothing pinned ahead: the next sleep pins for itself


def test_a_sleep_whose_host_backups_cannot_fit_is_refused_before_anything_sleeps(monkeypatch):
    """Pinning past the host's memory would bring the OOM killer: refused by name, nothing paused;
    disk backups and what uvm already holds pinned count as room."""
    import types
    import uvm.vllm as vllm
    from uvm import _lib, _prepare
    fake = FakeLib()
    monkeypatch.setattr(_lib, "library", lambda: fake)
    weights = types.SimpleNamespace(ptr=0x1000, size=8 << 30, device=0)
    monkeypatch.setattr(vllm, "_allocations", lambda lib, tag: [weights] if tag == "vllm.weights" else [])
    monkeypatch.setattr(vllm, "_state_of", lambda lib, address: types.SimpleNamespace(paused=0, backup=0))
    monkeypatch.setattr(_prepare, "_available", lambda: 4 << 30)
    allocator = vllm.CuMemAllocator()
    with pytest.raises(RuntimeError, match=r"sleep would keep 8589934592 bytes in host memory, but the host has "
                                           r"4294967296 bytes available .*UVM_VLLM_BACKUP=disk"):
        allocator._put_to_sleep({"weights": True, "kv_cache": False}, "sleep")
    asked = [name for name, _ in fake.calls if name != "uvm_share_importers"]
    assert asked == ["uvm_get_staging"]  # asked what it holds; nothing set, nothing paused
    allocator._put_to_sleep({"weights": False, "kv_cache": False}, "sleep")  # level 2: nothing to keep
    assert ("uvm_pause", "vllm.weights") in fake.calls
    allocator.backup = "disk"
    allocator._put_to_sleep({"weights": True}, "sleep")
    monkeypatch.setattr(_prepare, "_available", lambda: 7 << 30)
    allocator.backup = "pinned"
    with pytest.raises(RuntimeError):
        allocator._put_to_sleep({"weights": True}, "sleep")


def test_the_model_runner_skips_where_vllm_cannot_be_imported(tmp_path):
    """tests/peers/vllm_model.py, for a machine with vLLM and a model: here it says why it cannot run."""
    import subprocess
    import sys
    from conftest import ROOT
    (tmp_path / "vllm").mkdir()
    (tmp_path / "vllm" / "__init__.py").write_text("raise ImportError('its compiled ops need another torch')\n")
    done = subprocess.run([sys.executable, str(ROOT / "tests" / "peers" / "vllm_model.py"), "--model", "/nowhere"],
                          capture_output=True, text=True, timeout=120, env={"PYTHONPATH": str(tmp_path), "PATH": ""})
    assert done.returncode == 77, done.stdout + done.stderr
    assert "SKIP: vLLM cannot be imported here (ImportError: its compiled ops need another torch)" in done.stdout


class SharedFakeLib(FakeLib):
    """A FakeLib where the allocation at `shared` is mapped by process 4242 (uvm_share_importers)."""

    def __init__(self, shared: int):
        super().__init__()
        self.shared = shared

    def uvm_share_importers(self, ptr, pids, capacity, count):
        mapped = [4242] if ptr == self.shared else []
        count._obj.value = len(mapped)
        for index, pid in enumerate(mapped[:capacity]):
            pids[index] = pid
        return 0


@pytest.mark.parametrize("call", ["sleep", "discard"])
def test_a_sleep_of_memory_another_process_maps_is_refused_naming_it_before_anything_sleeps(monkeypatch, call):
    """A tensor sent through torch.multiprocessing is mapped by its receiver: a sleep would take the
    memory from under it. Refused by tag, address and process, before any tag is paused (uvm_pause
    would refuse that one tag only, after the tags before it slept)."""
    import types
    import uvm.vllm as vllm
    from uvm import _lib
    fake = SharedFakeLib(shared=0x2000)
    monkeypatch.setattr(_lib, "library", lambda: fake)
    found = {"vllm.weights": [types.SimpleNamespace(ptr=0x1000, size=1 << 20, device=0)],
             "vllm.kv_cache": [types.SimpleNamespace(ptr=0x2000, size=2 << 20, device=0)]}
    monkeypatch.setattr(vllm, "_allocations", lambda lib, tag: found.get(tag, []))
    monkeypatch.setattr(vllm, "_state_of", lambda lib, address: types.SimpleNamespace(paused=0, backup=0))
    allocator = vllm.CuMemAllocator()
    keep = {"weights": False, "kv_cache": False}
    with pytest.raises(RuntimeError, match=rf"uvm's vLLM allocator: {call} of tag 'kv_cache' refused: the allocation "
                                           r"at 0x2000 \(2097152 bytes\) is mapped by process 4242.*nothing was put to sleep"):
        allocator._put_to_sleep(keep, call)
    assert [name for name, _ in fake.calls if name in ("uvm_pause", "uvm_set_backup")] == []
    fake.shared = None  # the receiver dropped its tensor
    allocator._put_to_sleep(keep, call)
    assert ("uvm_pause", "vllm.weights") in fake.calls and ("uvm_pause", "vllm.kv_cache") in fake.calls
