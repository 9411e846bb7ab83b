"""uvm.memory_saver without torch: importable, and every option it cannot honour says what to use
instead. (The GPU behaviour: test_memory_saver_gpu.py.)"""
import pytest
from conftest import python


def test_imports_without_torch_and_refuses_what_it_cannot_do():
    code = r"""
import sys
sys.modules["torch"] = None  # importing torch now fails, as where it is not installed
from uvm.memory_saver import TorchMemorySaver, torch_memory_saver, configure_subprocess
saver = torch_memory_saver
assert saver.enabled and saver.hook_mode == "torch"
saver.hook_mode = "torch"
for mode, kind, words in (("preload", NotImplementedError, "hook_mode 'torch' only"),
                          ("cuda", ValueError, "must be 'torch'")):
    try:
        saver.hook_mode = mode
    except kind as error:
        assert words in str(error), error
    else:
        raise AssertionError(mode)
try:
    configure_subprocess()
except NotImplementedError as error:
    assert "no preload mode" in str(error)
else:
    raise AssertionError("configure_subprocess")
assert saver.backing == "releasable"
saver.backing = "managed"
saver.backing = "releasable"
for bad in ("vmm", None):
    try:
        saver.backing = bad
    except ValueError as error:
        assert "releasable" in str(error)
    else:
        raise AssertionError(bad)
saver.memory_margin_bytes = 1 << 20
assert TorchMemorySaver().memory_margin_bytes == 1 << 20  # one process-wide state, like the original
for bad in (-1, 1.5, True):
    try:
        saver.memory_margin_bytes = bad
    except ValueError:
        pass
    else:
        raise AssertionError(bad)
saver.retain_cpu_backup = True
assert saver.retain_cpu_backup is True
print("ok")
"""
    assert python(code).stdout.strip().endswith("ok")


@pytest.mark.parametrize("options, kind, words", [
    ({"enable_disk_backup": True}, NotImplementedError, "enable_cpu_backup=True"),
    ({"enable_cpu_backup": True, "cpu_backup_backend": "mmap"}, NotImplementedError, "pinned"),
    ({"cpu_backup_backend": "pinned"}, ValueError, "requires enable_cpu_backup"),
])
def test_backup_options_it_cannot_honour_are_refused_by_name(options, kind, words):
    from uvm.memory_saver import _check_backup_options
    with pytest.raises(kind, match=words):
        _check_backup_options(options.get("enable_cpu_backup", False), options.get("enable_disk_backup", False),
                              options.get("cpu_backup_backend"))


@pytest.mark.parametrize("tag, kind", [("", TypeError), (None, TypeError), (3, TypeError), ("x" * 64, ValueError)])
def test_bad_tags_are_refused(tag, kind):
    from uvm.memory_saver import _check_tag
    with pytest.raises(kind):
        _check_tag(tag)


def test_a_region_tag_is_uvm_tag_itself_and_the_backup_a_setting_of_its_own():
    """No GPU needed: the tag may be as long as uvm's (no suffix marks a backup any more), and
    _backup sets the thread's backup for uvm_pause and restores it."""
    from uvm import _lib
    from uvm.memory_saver import UVM_BACKUP_HOST, UVM_BACKUP_NONE, _backup, _check_tag
    assert _check_tag("x" * 63) == "x" * 63
    lib = _lib.library()
    assert lib.uvm_get_thread_backup() == UVM_BACKUP_NONE
    with _backup(True):
        assert lib.uvm_get_thread_backup() == UVM_BACKUP_HOST
        with _backup(False):
            assert lib.uvm_get_thread_backup() == UVM_BACKUP_NONE
        assert lib.uvm_get_thread_backup() == UVM_BACKUP_HOST
    assert lib.uvm_get_thread_backup() == UVM_BACKUP_NONE
