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
assert saver.enabled and saver.hook_mode == "torch"  # no interposer preloaded here
saver.hook_mode = "torch"
for mode, kind, words in (("preload", RuntimeError, "configure_subprocess()"),
                          ("cuda", ValueError, "must be one of ('preload', 'torch')")):
    try:
        saver.hook_mode = mode
    except kind as error:
        assert words in str(error), error
    else:
        raise AssertionError(mode)
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
import uvm
assert uvm.library().uvm_get_retain_backups() == 1  # uvm's own setting: uvm_resume reads it
saver.retain_cpu_backup = False
assert saver.retain_cpu_backup is False
print("ok")
"""
    assert python(code).stdout.strip().endswith("ok")


@pytest.mark.parametrize("value, expected", [("1", True), ("yes", True), ("0", False), ("", None), ("maybe", None)])
def test_retain_cpu_backup_starts_from_the_originals_environment_variable(value, expected):
    code = """
from uvm.memory_saver import torch_memory_saver
try:
    print(torch_memory_saver.retain_cpu_backup)
except ValueError as error:
    print(error)
"""
    out = python(code, env={"TMS_RETAIN_CPU_BACKUP": value} if value else {}).stdout.strip()
    if value == "maybe":
        assert "TMS_RETAIN_CPU_BACKUP='maybe' is not a boolean" in out
    else:
        assert out == str(bool(expected))


@pytest.mark.parametrize("options, kind, words", [
    ({"enable_disk_backup": True, "enable_cpu_backup": True}, ValueError, "mutually exclusive"),
    ({"enable_cpu_backup": True, "cpu_backup_backend": "cuda"}, ValueError, "must be one of"),
    ({"cpu_backup_backend": "pinned"}, ValueError, "requires enable_cpu_backup"),
])
def test_backup_options_it_cannot_honour_are_refused_by_name(options, kind, words):
    from uvm.memory_saver import _backup_kind
    with pytest.raises(kind, match=words):
        _backup_kind(options.get("enable_cpu_backup", False), options.get("enable_disk_backup", False),
                     options.get("cpu_backup_backend"))


@pytest.mark.parametrize("cpu, backend, expected", [
    (False, None, "none"), (True, None, "host"), (True, "pinned", "host"), (True, "mmap", "mmap"),
])
def test_each_cpu_backup_option_picks_its_uvm_backup(cpu, backend, expected):
    from uvm.memory_saver import _backup_kind
    assert _backup_kind(cpu, False, backend) == expected


def test_disk_backup_takes_the_directory_given_or_the_environment_s(tmp_path):
    """No GPU needed: set_disk_backup_dir creates the directory (as the original does) and uvm
    records it; without one, a disk region takes TMS_DISK_BACKUP_DIR; a plain file is refused by
    name."""
    import subprocess
    if subprocess.run(["stat", "-f", "-c", "%T", str(tmp_path)], capture_output=True, text=True).stdout.strip() == "tmpfs":
        pytest.skip(f"{tmp_path} is on a tmpfs, which uvm refuses for disk backups")
    code = f"""
import os
from uvm.memory_saver import torch_memory_saver as saver, _backup_kind
import uvm
assert uvm.disk_backup_dir() is None
os.environ["TMS_DISK_BACKUP_DIR"] = {str(tmp_path / "from-env")!r}
assert _backup_kind(False, True, None) == "disk"
assert uvm.disk_backup_dir() == {str(tmp_path / "from-env")!r}, uvm.disk_backup_dir()
saver.set_disk_backup_dir({str(tmp_path / "a" / "b")!r})
assert uvm.disk_backup_dir() == {str(tmp_path / "a" / "b")!r}
assert oct(os.stat({str(tmp_path / "a" / "b")!r}).st_mode & 0o777) == "0o700"
open({str(tmp_path / "plain")!r}, "w").close()
try:
    uvm.set_disk_backup_dir({str(tmp_path / "plain")!r})
except ValueError as e:
    assert "is not a directory" in str(e), e
else:
    raise AssertionError("a plain file was taken")
print("ok")
"""
    assert python(code).stdout.strip().endswith("ok")


@pytest.mark.parametrize("tag, kind", [("", TypeError), (None, TypeError), (3, TypeError), ("x" * 64, ValueError)])
def test_bad_tags_are_refused(tag, kind):
    from uvm.memory_saver import _check_tag
    with pytest.raises(kind):
        _check_tag(tag)


def test_a_region_tag_is_uvm_tag_itself_and_the_backup_a_setting_of_its_own():
    """No GPU needed: the tag may be as long as uvm's (no suffix marks a backup any more), and
    _backup sets the thread's backup for uvm_pause and restores it."""
    from uvm import _lib
    from uvm.memory_saver import _backup, _check_tag
    assert _check_tag("x" * 63) == "x" * 63
    lib = _lib.library()
    assert lib.uvm_get_thread_backup() == _lib.BACKUPS["none"]
    with _backup("host"):
        assert lib.uvm_get_thread_backup() == _lib.BACKUPS["host"]
        with _backup("disk"):
            assert lib.uvm_get_thread_backup() == _lib.BACKUPS["disk"]
        assert lib.uvm_get_thread_backup() == _lib.BACKUPS["host"]
    assert lib.uvm_get_thread_backup() == _lib.BACKUPS["none"]


def test_compress_backups_is_a_bool_that_regions_of_a_backup_pass_on_to_the_thread(monkeypatch):
    """No GPU needed: the setting is a bool (env UVM_COMPRESS_BACKUPS by default), and a region's
    config sets the thread's compression for its allocations only where there is a backup to keep."""
    from uvm import _lib
    from uvm.memory_saver import _region_config, _state, torch_memory_saver
    lib = _lib.library()
    with pytest.raises(TypeError, match="bool"):
        torch_memory_saver.compress_backups = 1
    monkeypatch.setattr(_state, "compress", True)
    assert torch_memory_saver.compress_backups is True
    with _region_config("weights", "host"):
        assert lib.uvm_get_thread_compression() == 1
        with _region_config("kv", "none"):  # nothing kept: nothing to compress
            assert lib.uvm_get_thread_compression() == 0
        assert lib.uvm_get_thread_compression() == 1
    assert lib.uvm_get_thread_compression() == 0
    monkeypatch.setattr(_state, "compress", False)
    with _region_config("weights", "mmap"):
        assert lib.uvm_get_thread_compression() == 0
