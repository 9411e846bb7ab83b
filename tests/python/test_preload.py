"""Preload mode without a GPU: uvm's cudaMalloc interposer (libuvm_preload.so) loads or says why
not, passes every call outside a region to the CUDA runtime as it came, and carries
torch_memory_saver's C names and thread state; configure_subprocess() gives a child what it needs.
(With a GPU and torch: test_preload_gpu.py, and the peer's own tests in tests/peers/.)"""
import json
import os
import shutil

import pytest
from conftest import python

# Calls cudaMalloc/cudaFree through the process's global symbols, as torch does, and prints what
# they returned: with the interposer preloaded these are its functions.
CALL_RUNTIME = r"""
import ctypes, json
ctypes.CDLL("libcudart.so.13" if ctypes.util.find_library("cudart") is None else ctypes.util.find_library("cudart"),
            mode=ctypes.RTLD_GLOBAL)
process = ctypes.CDLL(None)
pointer = ctypes.c_void_p()
malloc_status = process.cudaMalloc(ctypes.byref(pointer), 1 << 20)
free_status = process.cudaFree(pointer)
print(json.dumps({"malloc": malloc_status, "free": free_status, "pointer": pointer.value}))
"""


@pytest.fixture(scope="module")
def interposer():
    """The interposer and the libuvm.so beside it, built (or found) by the shim."""
    found = python("from uvm import _preload, _lib; print(_preload.library_path()); print(_lib._so_path)")
    path, libuvm = found.stdout.split()
    return {"LD_PRELOAD": path, "UVM_PRELOAD_LIBUVM": libuvm}


def test_a_process_that_cannot_open_libuvm_runs_and_fails_only_in_a_region_naming_why(interposer):
    """Decided in issue 57: the interposer reaches every descendant of a configured process (shells,
    compilers, nvidia-smi). One that cannot open libuvm runs as without it; a cudaMalloc inside a
    region fails there, naming the path, and uvm.memory_saver refuses preload mode with the reason."""
    env = {**interposer, "UVM_PRELOAD_LIBUVM": "/nonexistent/libuvm.so"}
    assert python("print('main ran')", env=env).stdout.strip() == "main ran"
    outside = json.loads(python("import ctypes.util\n" + CALL_RUNTIME, env=env).stdout)
    plain = json.loads(python("import ctypes.util\n" + CALL_RUNTIME).stdout)
    assert outside["malloc"] == plain["malloc"]
    inside = python("import ctypes.util\n" + CALL_RUNTIME, env={**env, "TMS_INIT_ENABLE": "1"})
    assert json.loads(inside.stdout)["malloc"] == 3  # cudaErrorInitializationError
    assert "cannot open libuvm at /nonexistent/libuvm.so" in inside.stderr and "in a region" in inside.stderr
    refused = python("import sys\nsys.modules['torch'] = None\n"
                     "from uvm.memory_saver import torch_memory_saver as s\nprint(s.hook_mode)", env=env, check=False)
    assert refused.returncode != 0 and "cannot open libuvm at /nonexistent/libuvm.so" in refused.stderr


def test_a_missing_cuda_runtime_is_named_at_the_first_allocation_in_a_region(interposer):
    env = {**interposer, "UVM_PRELOAD_CUDART": "/nonexistent/libcudart.so.13"}
    assert python("print('main ran')", env=env).stdout.strip() == "main ran"
    inside = python("import ctypes.util\n" + CALL_RUNTIME, env={**env, "TMS_INIT_ENABLE": "1"})
    assert json.loads(inside.stdout)["malloc"] == 3
    assert "cannot open the CUDA runtime UVM_PRELOAD_CUDART=/nonexistent/libcudart.so.13" in inside.stderr


def test_an_interposer_only_opened_is_not_active_and_a_stale_libuvm_path_does_not_end_the_process(interposer):
    """Issue 57 item 3: opened with ctypes (hook mode "torch" reads the tms_* names this way), the
    interposer found its own cudaMalloc and said it was preloaded; with a stale UVM_PRELOAD_LIBUVM
    inherited from a configured parent, its constructor then ended the process inside ctypes.CDLL."""
    code = f"""
import ctypes, ctypes.util
opened = ctypes.CDLL({interposer["LD_PRELOAD"]!r})
print(opened.uvm_preload_active())
ctypes.CDLL(ctypes.util.find_library("cudart") or "libcudart.so.13", mode=ctypes.RTLD_GLOBAL)
print(opened.uvm_preload_active())
opened.uvm_preload_load_error.restype = ctypes.c_char_p
print(opened.uvm_preload_load_error())
"""
    fresh = python(code, env={"LD_PRELOAD": "", "UVM_PRELOAD_LIBUVM": ""}).stdout.split("\n")
    assert fresh[:3] == ["0", "0", "None"]
    stale = python(code, env={"LD_PRELOAD": "", "UVM_PRELOAD_LIBUVM": "/nonexistent/libuvm.so"})
    lines = stale.stdout.split("\n")
    assert lines[:2] == ["0", "0"] and "cannot open libuvm at /nonexistent/libuvm.so" in lines[2]


# The runtime's cudaMalloc called before the runtime is in the process, then after it was loaded
# (globally, or locally as a library that opens its own runtime does), and a control with it loaded first.
LATE_RUNTIME = r"""
import ctypes, ctypes.util, json, sys
name = ctypes.util.find_library("cudart") or "libcudart.so.13"
mode = {"global": ctypes.RTLD_GLOBAL, "local": ctypes.RTLD_LOCAL}[sys.argv[1]]
process = ctypes.CDLL(None)
pointer = ctypes.c_void_p()
answers = []
if sys.argv[2] == "late":
    answers.append(process.cudaMalloc(ctypes.byref(pointer), 1 << 20))
ctypes.CDLL(name, mode=mode)
answers.append(process.cudaMalloc(ctypes.byref(pointer), 1 << 20))
answers.append(process.cudaFree(None))
print(json.dumps(answers))
"""


@pytest.mark.parametrize("mode", ["global", "local"])
@pytest.mark.parametrize("libuvm", ["opened", "missing"])
def test_a_runtime_loaded_after_the_first_call_is_found(interposer, mode, libuvm):
    """Issue 57 item 2: the first lookup of the runtime's cudaMalloc was kept even when it failed.
    With libuvm opened, its runtime is loaded but not global, and every cudaMalloc failed (3) where
    the runtime answers (35 without a driver); without it, no runtime is loaded until the program
    loads one, and every cudaMalloc after that failed too."""
    import subprocess
    import sys
    def run(how, order, env):
        result = subprocess.run([sys.executable, "-c", LATE_RUNTIME, how, order], capture_output=True, text=True,
                                env={**os.environ, **env}, timeout=60, check=True)
        return json.loads(result.stdout), result.stderr
    control, _ = run("global", "first", {"LD_PRELOAD": ""})
    env = interposer if libuvm == "opened" else {**interposer, "UVM_PRELOAD_LIBUVM": "/nonexistent/libuvm.so"}
    late, stderr = run(mode, "late", env)
    if libuvm == "opened":  # libuvm's own runtime answers from the first call
        assert late == [control[0]] + control, (late, control)
    else:
        assert late[0] == 3 and "the CUDA runtime's cudaMalloc is not loaded in this process" in stderr
        assert late[1:] == control, (late, control)


def test_inside_a_region_cudaMalloc_is_uvms_and_a_failure_says_why(interposer):
    """TMS_INIT_ENABLE=1 puts every thread inside a region, tag "default". Without a GPU nothing can
    be allocated: the caller gets the runtime's error for the device it asked about (no pointer),
    and stderr the reason."""
    result = python("import ctypes.util\n" + CALL_RUNTIME, env={**interposer, "TMS_INIT_ENABLE": "1"}, check=False)
    answer = json.loads(result.stdout)
    if answer["malloc"] == 0:
        pytest.skip("a GPU is here: test_preload_gpu.py covers allocation in a region")
    assert answer["pointer"] is None
    assert "cudaMalloc(1048576 bytes) in a region: cudaGetDevice failed" in result.stderr


def test_torch_memory_savers_thread_state_as_the_original_reports_it(interposer):
    """The C names the peer's tests read (nested_region, cpu_backup), in a preloaded process started
    with the original's TMS_INIT_* settings; each thread starts from them."""
    code = r"""
import threading
from uvm.memory_saver import torch_memory_saver as saver
cdll = saver._impl._binary_wrapper.cdll
assert cdll.uvm_preload_active() == 1
assert cdll.tms_get_interesting_region() is True
assert cdll.tms_get_enable_cpu_backup() is True
assert cdll.tms_get_current_tag() == b"default"
assert cdll.tms_get_cpu_backup_backend() == b"mmap"
cdll.tms_set_enable_cpu_backup(False)
assert cdll.tms_get_cpu_backup_backend() == b"mmap"      # remembered while the copy is off
cdll.tms_set_cpu_backup_backend(b"pinned")
cdll.tms_set_enable_cpu_backup(True)
assert cdll.tms_get_cpu_backup_backend() == b"pinned"
cdll.tms_set_enable_disk_backup(True)
assert cdll.tms_get_enable_disk_backup() and not cdll.tms_get_enable_cpu_backup()
cdll.tms_set_current_tag(b"kv_cache")
assert cdll.tms_get_current_tag() == b"kv_cache"
cdll.tms_set_interesting_region(False)
assert cdll.tms_get_interesting_region() is False
seen = {}
def other():
    seen.update(region=cdll.tms_get_interesting_region(), tag=cdll.tms_get_current_tag(),
                backend=cdll.tms_get_cpu_backup_backend())
thread = threading.Thread(target=other)
thread.start()
thread.join()
assert seen == {"region": True, "tag": b"default", "backend": b"mmap"}, seen
cdll.tms_set_retain_cpu_backup(True)
assert cdll.tms_get_retain_cpu_backup() is True
assert saver.retain_cpu_backup is True
print("ok")
"""
    env = {**interposer, "TMS_INIT_ENABLE": "1", "TMS_INIT_ENABLE_CPU_BACKUP": "1", "TMS_INIT_CPU_BACKUP_BACKEND": "mmap"}
    assert python(code, env=env).stdout.strip() == "ok"


def test_a_threads_tag_starts_as_default_and_its_first_setting_is_kept(interposer):
    """Issue 57 item 4: tms_get_current_tag() said "" where the original says "default" (so a C caller's
    region allocation had no tag and tms_pause("default") paused nothing), and a thread's first call
    tms_set_enable_cpu_backup(False) was overridden by TMS_INIT_ENABLE_CPU_BACKUP at its next call."""
    code = r"""
import threading
from uvm.memory_saver import torch_memory_saver as saver
cdll = saver._impl._binary_wrapper.cdll
seen = {}
def fresh_thread():
    cdll.tms_set_enable_cpu_backup(False)
    seen["backup"] = cdll.tms_get_enable_cpu_backup()
    seen["tag"] = cdll.tms_get_current_tag()
thread = threading.Thread(target=fresh_thread)
thread.start()
thread.join()
print(seen)
"""
    env = {**interposer, "TMS_INIT_ENABLE": "1", "TMS_INIT_ENABLE_CPU_BACKUP": "1"}
    assert python(code, env=env).stdout.strip() == "{'backup': False, 'tag': b'default'}"
    unset = python(code.replace("cdll.tms_set_enable_cpu_backup(False)", "pass"), env=interposer).stdout.strip()
    assert unset == "{'backup': False, 'tag': b'default'}"


def test_hook_mode_follows_the_process_and_preload_elsewhere_names_configure_subprocess(interposer):
    code = r"""
import sys
sys.modules["torch"] = None
from uvm.memory_saver import torch_memory_saver as saver
print(saver.hook_mode)
"""
    assert python(code, env=interposer).stdout.strip() == "preload"
    refused = python(code.replace("print(saver.hook_mode)", "saver.hook_mode = 'preload'"), check=False)
    assert refused.returncode != 0
    assert "RuntimeError" in refused.stderr and "configure_subprocess()" in refused.stderr


def test_preload_mode_refuses_torch_settings_it_cannot_see(interposer):
    code = r"""
from uvm.memory_saver import torch_memory_saver as saver
saver.hook_mode = "preload"
"""
    refused = python(code, env={**interposer, "PYTORCH_CUDA_ALLOC_CONF": "expandable_segments:True"}, check=False)
    assert "expandable_segments:True" in refused.stderr and "hook_mode 'torch'" in refused.stderr
    managed = python("from uvm.memory_saver import torch_memory_saver as s\ns.backing = 'managed'\ns.hook_mode = 'preload'",
                     env=interposer, check=False)
    assert "backing 'managed' needs hook_mode 'torch'" in managed.stderr


def test_the_preload_settings_refusal_holds_at_every_access(interposer):
    """Issue 57 item 1: the mode was recorded before its settings were checked, so the second look
    at hook_mode said "preload" and torch went on allocating past the interposer, unseen."""
    code = r"""
import sys
sys.modules["torch"] = None
from uvm.memory_saver import torch_memory_saver as saver
for attempt in range(3):
    try:
        print("mode", saver.hook_mode)
    except RuntimeError as error:
        print("refused", "expandable_segments:True" in str(error))
"""
    result = python(code, env={**interposer, "PYTORCH_CUDA_ALLOC_CONF": "expandable_segments:True"})
    assert result.stdout.split("\n")[:3] == ["refused True"] * 3, result.stdout


def test_configure_subprocess_preloads_children_started_inside_only(interposer):
    code = r"""
import os, subprocess, sys
from uvm.memory_saver import configure_subprocess
before = dict(os.environ)
probe = "import ctypes; p = ctypes.CDLL(None); print(getattr(p, 'uvm_preload_active', lambda: 0)())"
with configure_subprocess():
    inside = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True)
outside = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True)
assert dict(os.environ) == before
print(inside.stdout.strip(), outside.stdout.strip(), inside.stderr.strip())
"""
    env = {name: "" for name in ("LD_PRELOAD", "UVM_PRELOAD_LIBUVM", "UVM_PRELOAD_CUDART")}
    assert python(code, env=env).stdout.split()[:2] == ["1", "0"]


def test_the_interposer_exports_only_its_own_names(interposer):
    import subprocess
    listed = subprocess.run(["nm", "-D", "--defined-only", interposer["LD_PRELOAD"]], capture_output=True, text=True,
                            check=True).stdout.split("\n")
    names = sorted(line.split()[-1] for line in listed if line.strip())
    assert [n for n in names if not n.startswith(("tms_", "uvm_preload_"))] == ["cudaFree", "cudaMalloc"]
    root = os.path.join(os.path.dirname(__file__), "..", "..")
    header = open(os.path.join(root, "include", "uvm_preload.h")).read()
    reference = open(os.path.join(root, "docs", "c-api.md")).read()
    own = [name for name in names if name.startswith("uvm_preload_")]
    assert len(own) >= 9 and all(f"{name}(" in header and f"`{name}(" in reference for name in own)


# A process preloading the interposer with nothing of uvm's named (LD_PRELOAD and TMS_INIT_* only, as
# slime starts its train actors): what it says before and after the program loads a CUDA runtime.
NOTHING_NAMED = r"""
import ctypes, json, sys
process = ctypes.CDLL(None)
process.uvm_preload_load_error.restype = ctypes.c_char_p
process.uvm_preload_libuvm_path.restype = ctypes.c_char_p
answers = {"active": process.uvm_preload_active(), "before": (process.uvm_preload_load_error() or b"").decode()}
pointer = ctypes.c_void_p()
ctypes.CDLL(sys.argv[1], mode=ctypes.RTLD_GLOBAL)  # the runtime, loaded by path as torch loads it
answers["after"] = process.uvm_preload_load_error()
answers["libuvm"] = process.uvm_preload_libuvm_path().decode()
print(json.dumps(answers))
"""


def test_an_interposer_preloaded_with_nothing_named_opens_the_libuvm_of_the_runtime_the_process_loads(interposer, tmp_path):
    """Issue 75: slime's train actors preload the library found two folders above
    torch_memory_saver.__file__, with no UVM_PRELOAD_LIBUVM or UVM_PRELOAD_CUDART. The wheel's layout
    holds the interposer above one folder per CUDA major; it opened a libuvm.so beside itself at load
    (none there) and every region allocation failed. It opens, once the process has a runtime, the
    libuvm of that runtime's major, which then uses that runtime."""
    found = python("from uvm import _lib, _runtime; _lib.library(); r = _runtime.mapped(); print(r.path, r.major)")
    runtime, major = found.stdout.split()
    shutil.copy2(interposer["LD_PRELOAD"], tmp_path / "torch_memory_saver_hook_mode_preload.abi3.so")
    for each in (12, 13):
        (tmp_path / f"cuda{each}").mkdir()
        (tmp_path / f"cuda{each}" / "libuvm.so").symlink_to(interposer["UVM_PRELOAD_LIBUVM"])
    env = {"LD_PRELOAD": str(tmp_path / "torch_memory_saver_hook_mode_preload.abi3.so"), "UVM_PRELOAD_LIBUVM": "",
           "UVM_PRELOAD_CUDART": "", "TMS_INIT_ENABLE": "1", "TMS_INIT_ENABLE_CPU_BACKUP": "1"}
    import subprocess
    import sys
    done = subprocess.run([sys.executable, "-c", NOTHING_NAMED, runtime], capture_output=True, text=True, timeout=60,
                          env={**os.environ, **env}, check=True)
    answers = json.loads(done.stdout)
    assert answers["active"] == 1
    assert "no CUDA runtime is loaded in this process yet" in answers["before"], answers
    assert answers["after"] is None, answers
    assert answers["libuvm"] == str(tmp_path / f"cuda{major}" / "libuvm.so"), answers
