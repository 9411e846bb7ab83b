"""The wheel users install (setup.py, docs/design.md "The wheel"): what it carries, that it works with
no compiler and no CUDA_HOME, that it picks the libuvm.so of the CUDA runtime a process uses, which
block hook a torch gets and what uvm refuses without one, the switch that moves stacks onto uvm, the
`uvm` command, the sdist it is built from, and a build that cannot build failing loudly.

The wheel is $UVM_TEST_WHEEL (scripts/test_wheel.sh's, in CI) or one built from this tree here.
Tests that need a process of their own run it in a fresh virtualenv holding only the wheel, with a
PATH that has no compiler. No GPU needed."""
import json
import os
import re
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest
from conftest import ROOT

RELEASE = ".".join(re.search(rf"#define UVM_VERSION_{part} (\d+)", (ROOT / "include" / "uvm.h").read_text()).group(1)
                   for part in ("MAJOR", "MINOR", "PATCH"))
SUPPORTED_TORCH = ["2.6", "2.7", "2.8", "2.9", "2.10", "2.11", "2.12", "2.13", "2.14", "2.15"]


def build_wheel(out: Path, env: dict | None = None, source: Path = ROOT) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "pip", "wheel", "-v", "--no-deps", "--no-build-isolation", "-w", str(out),
                           str(source)], capture_output=True, text=True, timeout=900, env={**os.environ, **(env or {})})


@pytest.fixture(scope="module")
def wheel(tmp_path_factory) -> Path:
    given = os.environ.get("UVM_TEST_WHEEL")
    if given:
        return Path(given)
    out = tmp_path_factory.mktemp("wheel")
    made = build_wheel(out)
    assert made.returncode == 0, made.stdout[-3000:] + made.stderr[-3000:]
    [built] = out.glob("uvm_cuda-*.whl")
    return built


@pytest.fixture(scope="module")
def venv(wheel, tmp_path_factory) -> Path:
    """A fresh virtualenv with the wheel installed and nothing else (its python)."""
    folder = tmp_path_factory.mktemp("venv")
    base = getattr(sys, "_base_executable", sys.executable)
    subprocess.run([base, "-m", "venv", str(folder)], check=True, timeout=300)
    done = subprocess.run([str(folder / "bin" / "python"), "-m", "pip", "install", "-q", "--no-deps", str(wheel)],
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stdout + done.stderr
    return folder / "bin" / "python"


def bare_env(python: Path, **extra) -> dict:
    """An environment with no compiler and no toolkit named: PATH holds only the virtualenv's bin."""
    return {"HOME": str(python.parents[2]), "PATH": str(python.parent), "UVM_CXX": "/nonexistent/c++",
            "LANG": "C.UTF-8", **extra}


def run(python: Path, code: str, env: dict | None = None, cwd: Path | None = None) -> subprocess.CompletedProcess:
    return subprocess.run([str(python), "-c", code], capture_output=True, text=True, timeout=300,
                          env=env if env is not None else bare_env(python), cwd=cwd or python.parents[2])


def test_the_wheel_carries_both_cuda_builds_every_torch_hook_and_the_switch(wheel):
    assert wheel.name == f"uvm_cuda-{RELEASE}-py3-none-manylinux_2_34_x86_64.whl"
    with zipfile.ZipFile(wheel) as archive:
        names = set(archive.namelist())
        manifest = json.loads(archive.read("uvm/_prebuilt/manifest.json"))
        metadata = archive.read(f"uvm_cuda-{RELEASE}.dist-info/METADATA").decode()
        entry_points = archive.read(f"uvm_cuda-{RELEASE}.dist-info/entry_points.txt").decode()
        switch = archive.read("uvm_switch.pth").decode()
    for major in ("12", "13"):
        assert {f"uvm/_prebuilt/cuda{major}/libuvm.so", f"uvm/_prebuilt/cuda{major}/libuvm_preload.so"} <= names
    assert manifest["libraries"]["12"]["cuda"] == "12010"  # the oldest 12.x headers: loads with any 12 runtime
    assert manifest["libraries"]["13"]["cuda"].startswith("13")
    assert list(manifest["torch_hooks"]) == SUPPORTED_TORCH
    assert manifest["torch_hooks"]["2.6"]["cxx11_abi"] is False  # torch 2.6's PyPI wheels use the old ABI
    assert all(manifest["torch_hooks"][minor]["cxx11_abi"] for minor in SUPPORTED_TORCH[1:])
    assert {f"uvm/_prebuilt/torch-{minor}/libuvm_torch_blocks.so" for minor in SUPPORTED_TORCH} <= names
    assert {"uvm/py.typed", "uvm/_csrc/include/uvm.h", "uvm/_csrc/sources.txt", f"uvm_cuda-{RELEASE}.dist-info/licenses/LICENSE"} <= names
    assert "License-Expression: Apache-2.0" in metadata and f"Version: {RELEASE}" in metadata
    assert "uvm = uvm.__main__:console" in entry_points
    assert "UVM_SWITCH" in switch and switch.count("\n") == 1  # one line, run at every interpreter start


def test_the_tag_is_the_newest_glibc_the_libraries_need(wheel, tmp_path):
    with zipfile.ZipFile(wheel) as archive:
        archive.extractall(tmp_path)
    needed = set()
    for library in tmp_path.rglob("*.so"):
        data = library.read_bytes()
        needed |= {(int(a), int(b)) for a, b in re.findall(rb"GLIBC_(\d+)\.(\d+)", data)}
        assert b"libstdc++.so" not in data or "torch-" in str(library), f"{library} needs the system's libstdc++"
        assert b"GLIBCXX_3.4.2" not in data or "torch-" in str(library), library
    assert max(needed) == (2, 34)


def test_it_loads_its_own_build_with_no_compiler_and_says_where_its_runtime_came_from(venv):
    shown = run(venv, "import uvm, uvm._lib as l; uvm.library(); print(uvm.__version__); print(uvm._so_path); "
                      "print(l.runtime_used.major, l.runtime_used.found_by)")
    assert shown.returncode == 0, shown.stderr
    version, path, runtime = shown.stdout.splitlines()
    assert version == RELEASE
    # The toolkit's runtime is the one found here (no torch, no NVIDIA wheel): its major, whichever.
    header = next(Path(home) / "include" / "cuda_runtime_api.h" for home in
                  (os.environ.get("CUDA_HOME"), os.environ.get("CUDA_PATH"), "/usr/local/cuda")
                  if home and (Path(home) / "include" / "cuda_runtime_api.h").is_file())
    major = int(re.search(r"#define\s+CUDART_VERSION\s+(\d+)", header.read_text()).group(1)) // 1000
    assert path.endswith(f"/uvm/_prebuilt/cuda{major}/libuvm.so") and str(venv.parents[1]) in path
    assert runtime.startswith(f"{major} "), runtime


def test_a_cuda_12_runtime_gets_the_cuda_12_build(venv, tmp_path):
    runtime_wheel = sorted((ROOT / ".deps" / "wheels").glob("nvidia_cuda_runtime_cu12-*.whl"))
    if not runtime_wheel:
        fetched = subprocess.run([sys.executable, "-m", "pip", "download", "-q", "--no-deps", "--only-binary=:all:",
                                  "--platform", "manylinux2014_x86_64", "-d", str(tmp_path), "nvidia-cuda-runtime-cu12"],
                                 capture_output=True, text=True, timeout=300)
        runtime_wheel = sorted(tmp_path.glob("nvidia_cuda_runtime_cu12-*.whl"))
        if not runtime_wheel:
            pytest.skip(f"no nvidia-cuda-runtime-cu12 wheel in .deps/wheels and none downloadable: {fetched.stderr[-300:]}")
    site = tmp_path / "site"
    done = subprocess.run([str(venv), "-m", "pip", "install", "-q", "--no-deps", "--target", str(site), str(runtime_wheel[0])],
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    shown = run(venv, "import uvm, uvm._lib as l; uvm.library(); print(uvm._so_path); print(l.runtime_used.path)",
                bare_env(venv, PYTHONPATH=str(site)))
    assert shown.returncode == 0, shown.stderr
    path, runtime = shown.stdout.splitlines()
    assert path.endswith("/uvm/_prebuilt/cuda12/libuvm.so")
    assert runtime.startswith(str(site)) and runtime.endswith("libcudart.so.12")


HOOK_FOR = """
import uvm._build as b
for version, abi in (("2.11.0+cu130", True), ("2.14.1", True), ("2.6.0+cu124", False), ("2.6.0", True),
                     ("2.16.0.dev20261101", True)):
    hook, why = b.shipped_torch_hook(version, abi)
    print(repr((version, hook and hook.parent.name, why)))
"""


def test_each_supported_torch_gets_its_hook_and_others_are_told_why_not(venv):
    shown = run(venv, HOOK_FOR)
    assert shown.returncode == 0, shown.stderr
    answers = {version: (folder, why) for version, folder, why in map(eval, shown.stdout.splitlines())}
    assert answers["2.11.0+cu130"] == ("torch-2.11", "")
    assert answers["2.14.1"] == ("torch-2.14", "")
    assert answers["2.6.0+cu124"] == ("torch-2.6", "")
    assert answers["2.6.0"][0] is None and "pre-cxx11" in answers["2.6.0"][1]
    assert answers["2.16.0.dev20261101"][0] is None and "2.6, 2.7" in answers["2.16.0.dev20261101"][1]


REFUSALS = """
import uvm, uvm._state as s, uvm.torch as t
s._compilation_state = s.CompilationState.SUCCESS  # as after a build where no hook could be had
s._blocks_unavailable = "no hook for this torch (the test's reason)"
for name, call in (("releasable", lambda: uvm.create_releasable_mempool()),
                   ("staged", lambda: uvm.offload("weights", strategy="staged")),
                   ("disk", lambda: uvm.offload("weights", strategy="disk")),
                   ("saver", lambda: uvm.memory_saver.torch_memory_saver.region().__enter__())):
    try:
        call()
        print(name, "NOT REFUSED")
    except uvm.UnifiedMemoryUnsupportedError as error:
        print(name, "refused:", error)
print("auto moves by migrating:", s.moves_must_migrate())
"""


def test_without_a_hook_what_could_lose_bytes_is_refused_naming_why(venv):
    import_torch_free = "import sys; sys.modules['torch'] = None\n"  # torch must not be needed to refuse
    shown = run(venv, import_torch_free + "import uvm.memory_saver\n" + REFUSALS)
    assert shown.returncode == 0, shown.stderr
    lines = shown.stdout.splitlines()
    for name in ("releasable", "staged", "disk", "saver"):
        [line] = [line for line in lines if line.startswith(name + " ")]
        assert "refused:" in line and "needs uvm's PyTorch block hook" in line and "the test's reason" in line, line
        assert "hook_mode 'preload' needs no hook" in line
    assert "auto moves by migrating: True" in lines


STAND_INS = {
    "torch_memory_saver/__init__.py": "ORIGINAL = True\n",
    "torch_memory_saver/testing_utils.py": "HELPER = 'the original helper'\n",
    "megatron/__init__.py": "", "megatron/core/__init__.py": "", "megatron/core/inference/__init__.py": "",
    "megatron/core/inference/unified_memory.py": "ORIGINAL = True\n",
}
SWITCH_CHECK = """
import multiprocessing, subprocess, sys
def which():
    import torch_memory_saver
    from megatron.core.inference import unified_memory
    tms = "original" if getattr(torch_memory_saver, "ORIGINAL", False) else type(torch_memory_saver.torch_memory_saver).__module__
    return tms, "original" if getattr(unified_memory, "ORIGINAL", False) else unified_memory.__name__
def child(queue):
    queue.put(which())
if __name__ == "__main__":
    print("parent", *which())
    import torch_memory_saver.testing_utils as helpers
    print("helper", "original" if hasattr(helpers, "HELPER") else helpers.__name__ + " from " + helpers.__file__.split("/uvm/")[-1])
    context = multiprocessing.get_context("spawn")
    queue = context.Queue()
    process = context.Process(target=child, args=(queue,))
    process.start()
    print("spawned", *queue.get())
    process.join()
    code = "import torch_memory_saver as t; print('subprocess', getattr(t, 'ORIGINAL', False) and 'original' or type(t.torch_memory_saver).__module__)"
    print(subprocess.run([sys.executable, "-c", code], capture_output=True, text=True).stdout.strip())
"""


@pytest.fixture
def originals(tmp_path) -> Path:
    """Stand-ins for the real torch_memory_saver (with a pure-Python helper module) and Megatron."""
    for name, text in STAND_INS.items():
        (tmp_path / name).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / name).write_text(text)
    (tmp_path / "check.py").write_text(SWITCH_CHECK)
    return tmp_path


@pytest.mark.parametrize("value, saver, megatron", [
    ("1", "uvm.memory_saver", "uvm"), ("all", "uvm.memory_saver", "uvm"),
    ("torch_memory_saver", "uvm.memory_saver", "original"), ("megatron", "original", "uvm"),
    ("0", "original", "original"), ("", "original", "original"), ("off", "original", "original"),
    ("False", "original", "original"), ("no", "original", "original"), ("on", "uvm.memory_saver", "uvm")])
def test_the_switch_reaches_every_process_and_off_gives_the_originals_back(venv, originals, value, saver, megatron):
    result = subprocess.run([str(venv), str(originals / "check.py")], capture_output=True, text=True, timeout=300,
                            env=bare_env(venv, PYTHONPATH=str(originals), UVM_SWITCH=value), cwd=originals)
    assert result.returncode == 0, result.stderr
    assert "uvm: switch off" not in result.stderr  # every spelling of off is understood, silently
    lines = result.stdout.splitlines()
    # Under the switch the original's submodules are uvm's too (uvm.tms_layout): none of its code runs.
    helper = "torch_memory_saver.testing_utils from tms_layout/testing_utils.py" if saver != "original" else "original"
    assert lines == [f"parent {saver} {megatron}", f"helper {helper}", f"spawned {saver} {megatron}",
                     f"subprocess {saver}"]


def test_a_bad_switch_value_switches_nothing_and_says_so(venv, originals):
    result = subprocess.run([str(venv), str(originals / "check.py")], capture_output=True, text=True, timeout=300,
                            env=bare_env(venv, PYTHONPATH=str(originals), UVM_SWITCH="sglang"), cwd=originals)
    assert result.returncode == 0 and result.stdout.splitlines()[0] == "parent original original"
    assert "uvm: switch off: UVM_SWITCH='sglang' names ['sglang']" in result.stderr
    one = run(venv, "pass", bare_env(venv, UVM_SWITCH="sglang"))  # one process says it once, .pth run twice or not
    assert one.stderr.count("uvm: switch off") == 1, one.stderr
    doctor = subprocess.run([str(venv.parent / "uvm"), "doctor"], capture_output=True, text=True, timeout=300,
                            env=bare_env(venv, UVM_SWITCH="sglang"))
    assert "switch: off (UVM_SWITCH='sglang', not understood)" in doctor.stdout, doctor.stdout


def test_the_switch_without_the_original_installed_still_gives_uvms(venv):
    shown = run(venv, "import torch_memory_saver as t, torch_memory_saver.hooks.mode_preload as m, uvm.tms_layout as l; "
                "print(type(t.torch_memory_saver).__module__, t.__path__ == l.__path__, m.configure_subprocess.__module__)",
                bare_env(venv, UVM_SWITCH="1"))
    assert shown.returncode == 0, shown.stderr
    assert shown.stdout.strip() == "uvm.memory_saver True torch_memory_saver.hooks.mode_preload"


def test_a_switched_start_loads_only_the_switch_until_a_switched_name_is_imported(venv):
    """Issue 75: every Python start with UVM_SWITCH set imported the whole uvm package (51 modules:
    the library's bindings, subprocess, concurrent.futures, logging...), 50 ms against 8 ms unset, in
    every worker, Ray actor and pip call. A switched start loads uvm_switch and nothing else of its
    own; uvm comes with the first switched import."""
    code = "import sys; print(' '.join(sorted(sys.modules)))"
    plain = run(venv, code, bare_env(venv))
    switched = run(venv, code, bare_env(venv, UVM_SWITCH="1"))
    assert plain.returncode == 0 and switched.returncode == 0, plain.stderr + switched.stderr
    assert set(switched.stdout.split()) - set(plain.stdout.split()) == {"uvm_switch"}, switched.stdout
    imported = run(venv, "import torch_memory_saver, sys; print('uvm.memory_saver' in sys.modules)",
                   bare_env(venv, UVM_SWITCH="1"))
    assert imported.stdout.strip() == "True", imported.stderr


TMS_NAMES = [f"torch_memory_saver_hook_mode_preload{suffix}.abi3.so" for suffix in ("_cu13", "_cu12", "")]
SLIME_STYLE = """
import ctypes, os, sys
process = ctypes.CDLL(None)
process.uvm_preload_libuvm_path.restype = ctypes.c_char_p
import uvm
uvm.library()  # the libuvm the preloaded interposer opened, beside the runtime the process loads
print(process.uvm_preload_active(), process.uvm_preload_libuvm_path().decode(), uvm._so_path)
"""


def test_two_folders_above_the_switched_module_lies_uvms_interposer_under_the_originals_names(venv):
    """Issue 75: slime starts its train actors preloading the library it finds two folders above
    torch_memory_saver.__file__ (under the name ending _cu13, _cu12 or neither), with TMS_INIT_* and
    nothing of uvm's. Under the switch the module had no __file__: slime's driver stopped with
    AttributeError. The wheel ships uvm's interposer there, and preloaded with only that, it opens
    the libuvm of the runtime the process loads."""
    shown = run(venv, "import os, torch_memory_saver as t; print(t.__file__); print(os.path.dirname(os.path.dirname(t.__file__)))",
                bare_env(venv, UVM_SWITCH="1"))
    assert shown.returncode == 0, shown.stderr
    package_file, folder = shown.stdout.splitlines()
    assert folder.endswith("/uvm/_prebuilt") and str(venv.parents[1]) in folder, folder
    assert Path(package_file).is_file() and "uvm.memory_saver" in Path(package_file).read_text()
    for name in TMS_NAMES:
        assert b"uvm_preload_active" in (Path(folder) / name).read_bytes(), f"{name} is not uvm's interposer"
    preloaded = run(venv, SLIME_STYLE, bare_env(venv, UVM_SWITCH="1", LD_PRELOAD=str(Path(folder) / TMS_NAMES[0]),
                                                TMS_INIT_ENABLE="1", TMS_INIT_ENABLE_CPU_BACKUP="1"))
    assert preloaded.returncode == 0, preloaded.stderr
    active, opened, loaded = preloaded.stdout.split()
    assert active == "1" and opened == loaded and re.search(r"/uvm/_prebuilt/cuda1[23]/libuvm\.so$", opened), preloaded.stdout
    # Miles (a fork of slime) asks torch_memory_saver.utils.get_binary_path_from_package instead: uvm's
    # interposer beside its libuvm.so, preloaded the same way with nothing else named.
    found = run(venv, "from torch_memory_saver.utils import get_binary_path_from_package as g; "
                "print(g('torch_memory_saver_hook_mode_preload'))", bare_env(venv, UVM_SWITCH="1"))
    assert found.returncode == 0, found.stderr
    miles = run(venv, SLIME_STYLE, bare_env(venv, UVM_SWITCH="1", LD_PRELOAD=found.stdout.strip(), TMS_INIT_ENABLE="1",
                                            TMS_INIT_ENABLE_CPU_BACKUP="1"))
    assert miles.returncode == 0, miles.stderr
    active, opened, loaded = miles.stdout.split()
    assert active == "1" and opened == loaded and opened == str(Path(found.stdout.strip()).with_name("libuvm.so"))
    unswitched = run(venv, "import torch_memory_saver", bare_env(venv))
    assert unswitched.returncode != 0 and "No module named 'torch_memory_saver'" in unswitched.stderr


def test_another_distribution_of_the_uvm_import_is_named_with_the_one_safe_way_out(wheel, tmp_path):
    """Issue 75: the package index's `uvm` (another project) installs uvm/__init__.py, uvm/__main__.py
    and bin/uvm too. The doctor said "uninstall all but uvm-cuda", which deletes the files the two
    share. It names what was overwritten (against uvm-cuda's RECORD) and the one safe way out."""
    folder = tmp_path / "venv"
    subprocess.run([getattr(sys, "_base_executable", sys.executable), "-m", "venv", str(folder)], check=True, timeout=300)
    python = folder / "bin" / "python"
    done = subprocess.run([str(python), "-m", "pip", "install", "-q", "--no-deps", str(wheel)], capture_output=True,
                          text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    [site] = (folder / "lib").glob("python3*/site-packages")
    other = site / "uvm-2.0.dist-info"  # the other project, installed after uvm-cuda: it wrote a shared file
    other.mkdir()
    (other / "METADATA").write_text("Metadata-Version: 2.1\nName: uvm\nVersion: 2.0\n")
    (other / "RECORD").write_text("uvm/__init__.py,,\nuvm/py.typed,,\nuvm-2.0.dist-info/METADATA,,\n"
                                  "uvm-2.0.dist-info/RECORD,,\n")
    (site / "uvm" / "py.typed").write_text("the other project's\n")  # (its __init__.py would stop the doctor)
    doctor = subprocess.run([str(folder / "bin" / "uvm"), "doctor"], capture_output=True, text=True, timeout=300,
                            env=bare_env(python))
    out = doctor.stdout + doctor.stderr
    assert "several installed distributions provide the `uvm` import: uvm, uvm-cuda" in out, out
    assert "files of uvm-cuda were overwritten since it was installed: uvm/py.typed" in out, out
    assert "pip uninstall -y uvm uvm-cuda && pip install uvm-cuda" in out, out


def test_the_uvm_command_gives_its_version_and_the_doctor_says_what_is_installed_and_switched(venv, originals):
    command = venv.parent / "uvm"
    version = subprocess.run([str(command), "--version"], capture_output=True, text=True, env=bare_env(venv), timeout=60)
    assert version.returncode == 0 and version.stdout.strip() == f"uvm {RELEASE}"
    doctor = subprocess.run([str(command), "doctor"], capture_output=True, text=True, timeout=300,
                            env=bare_env(venv, PYTHONPATH=str(originals), UVM_SWITCH="torch_memory_saver"))
    out = doctor.stdout
    assert f"uvm {RELEASE} (distribution uvm-cuda)" in out
    assert "prebuilt libuvm.so for CUDA 12.1, CUDA 13.0; block hooks for torch 2.6, 2.7" in out
    assert "compiler: none (not needed:" in out
    assert (f"switch torch_memory_saver: on: `import torch_memory_saver` gives uvm's; the original is at "
            f"{originals / 'torch_memory_saver' / '__init__.py'}") in out
    problems = [line for line in out.splitlines() if line.startswith("problem: ")]
    assert len(problems) == len(set(problems)), out  # each said once


def test_the_sdist_carries_the_sources_and_builds_the_same_wheel(wheel, tmp_path):
    made = subprocess.run([sys.executable, "-m", "build", "--sdist", "--no-isolation", "--outdir", str(tmp_path), str(ROOT)],
                          capture_output=True, text=True, timeout=300)
    assert made.returncode == 0, made.stdout[-2000:] + made.stderr[-2000:]
    [sdist] = tmp_path.glob("uvm_cuda-*.tar.gz")
    listed = subprocess.run(["tar", "tzf", str(sdist)], capture_output=True, text=True, check=True).stdout.split()
    top = f"uvm_cuda-{RELEASE}/"
    for name in ("sources.txt", "include/uvm.h", "alloc/malloc.cpp", "preload/interposer.cpp", "LICENSE", "setup.py",
                 "scripts/torch_headers.py", "python_shim/uvm_switch.pth", "python_shim/uvm/_torch_blocks.cpp"):
        assert top + name in listed, name
    built = build_wheel(tmp_path / "from-sdist", {"UVM_WHEEL_CUDA12": str(ROOT / ".deps" / "cuda-12.1"),
                                                  "UVM_TORCH_HEADERS_DIR": str(ROOT / ".deps" / "torch")}, sdist)
    assert built.returncode == 0, built.stdout[-3000:] + built.stderr[-3000:]
    [again] = (tmp_path / "from-sdist").glob("uvm_cuda-*.whl")
    assert again.name == wheel.name

    def contents(path):
        with zipfile.ZipFile(path) as archive:
            manifest = json.loads(archive.read("uvm/_prebuilt/manifest.json"))
            return sorted(n for n in archive.namelist() if not n.endswith("RECORD")), manifest
    names, manifest = contents(again)
    expected_names, expected = contents(wheel)
    assert names == expected_names
    strip = lambda m: {part: {k: {f: v for f, v in e.items() if f != "sha256"} for k, e in m[part].items()}
                       for part in ("libraries", "torch_hooks")}
    assert manifest["sources"] == expected["sources"] and strip(manifest) == strip(expected)


def test_a_build_without_a_compiler_fails_saying_what_is_missing_or_says_what_it_left_out(tmp_path):
    failed = build_wheel(tmp_path / "none", {"UVM_CXX": "/nonexistent/c++"})
    assert failed.returncode != 0 and not list((tmp_path / "none").glob("*.whl"))
    assert "uvm: cannot build the wheel: no C++ compiler" in failed.stdout + failed.stderr
    assert "UVM_WHEEL_PARTIAL=1" in failed.stdout + failed.stderr
    partial = build_wheel(tmp_path / "partial", {"UVM_CXX": "/nonexistent/c++", "UVM_WHEEL_PARTIAL": "1"})
    assert partial.returncode == 0, partial.stderr[-2000:]
    assert "uvm: WARNING: left out of this wheel: no C++ compiler" in partial.stdout + partial.stderr
    [built] = (tmp_path / "partial").glob("*.whl")
    assert built.name.startswith(f"uvm_cuda-{RELEASE}+partial-"), built.name  # never taken for the release
    with zipfile.ZipFile(built) as archive:
        assert not [name for name in archive.namelist() if name.startswith("uvm/_prebuilt/")]


def test_a_build_that_cannot_reach_the_package_index_says_so_before_compiling_and_names_the_way_out(tmp_path):
    """Issue 75: with no network the build compiled for 48 s, then died with `<urlopen error ...>`
    naming no release, URL or way out. An index that cannot be reached (UVM_PYPI_URL) and no torch
    headers at hand: the build stops before compiling, naming the release, the URL and what to do."""
    import shutil
    empty = tmp_path / "headers"
    empty.mkdir()
    compiled = tmp_path / "compiled.log"
    wrapper = tmp_path / "c++"  # the compiler, recording each compile (not its version queries)
    wrapper.write_text(f'#!/bin/sh\ncase "$*" in *-shared*) echo "$*" >> {compiled};; esac\n'
                       f'exec {shutil.which("c++") or shutil.which("g++")} "$@"\n')
    wrapper.chmod(0o755)
    failed = build_wheel(tmp_path / "out", {"UVM_PYPI_URL": "http://127.0.0.1:9", "UVM_TORCH_HEADERS_DIR": str(empty),
                                            "UVM_CXX": str(wrapper)})
    output = failed.stdout + failed.stderr
    assert failed.returncode != 0 and not list((tmp_path / "out").glob("*.whl"))
    assert "torch 2.6.0: its headers are not in" in output and "http://127.0.0.1:9/pypi/torch/json" in output, output[-3000:]
    assert "python scripts/torch_headers.py DIR" in output and "UVM_TORCH_HEADERS_DIR=DIR" in output
    assert not compiled.exists(), f"it compiled before failing: {compiled.read_text()[:500]}"


LOAD_HOOK = """
import ctypes, sys
ctypes.CDLL(sys.argv[1])  # resolves libc10.so and libc10_cuda.so by soname, as in a torch process
print("loaded")
"""


def _release_libraries(minor: str) -> Path | None:
    folder = ROOT / ".deps" / "torch" / minor
    return folder if (folder / "lib" / "libc10_cuda.so").is_file() else None


def _runtime_dir(cuda_major: int) -> Path | None:
    # CUDA 12.8's runtime: torch 2.10's libc10_cuda needs 12.5's cudaGetDriverEntryPointByVersion.
    for folder in ([ROOT / ".deps" / "cuda-12.8" / "lib64"] if cuda_major == 12 else
                   [Path("/usr/local/cuda/lib64"), Path("/usr/local/cuda/targets/x86_64-linux/lib")]):
        if (folder / f"libcudart.so.{cuda_major}").exists():
            return folder
    return None


def _load_beside(wheel_dir: Path, hook_minor: str, torch_minor: str) -> subprocess.CompletedProcess:
    libraries = _release_libraries(torch_minor)
    cuda_major = 12 if b"libcudart.so.12" in (libraries / "lib" / "libc10_cuda.so").read_bytes() else 13
    runtime = _runtime_dir(cuda_major)
    if runtime is None:
        pytest.skip(f"no CUDA {cuda_major} runtime here for torch {torch_minor}'s libc10_cuda.so")
    hook = wheel_dir / "uvm" / "_prebuilt" / f"torch-{hook_minor}" / "libuvm_torch_blocks.so"
    return subprocess.run([sys.executable, "-c", LOAD_HOOK, str(hook)], capture_output=True, text=True, timeout=60,
                          env={**os.environ, "LD_LIBRARY_PATH": f"{libraries / 'lib'}:{runtime}"})


@pytest.fixture(scope="module")
def unpacked(wheel, tmp_path_factory) -> Path:
    folder = tmp_path_factory.mktemp("unpacked")
    with zipfile.ZipFile(wheel) as archive:
        archive.extractall(folder)
    return folder


@pytest.mark.parametrize("minor", SUPPORTED_TORCH)
def test_each_hook_loads_beside_its_own_torch_releases_c10_with_every_symbol_resolved(unpacked, minor):
    """The ends of the supported range (2.6 and 2.15) and every release between, each beside the
    libc10.so and libc10_cuda.so of that release's own wheel (scripts/torch_headers.py): what the GPU
    machine, which has one torch, cannot show."""
    if _release_libraries(minor) is None:
        pytest.skip(f"torch {minor}'s libraries are not in .deps/torch (python scripts/torch_headers.py)")
    loaded = _load_beside(unpacked, minor, minor)
    assert loaded.returncode == 0 and loaded.stdout.strip() == "loaded", loaded.stderr


def test_a_hook_beside_another_releases_c10_does_not_load(unpacked):
    """2.6's hook (the pre-cxx11 ABI) beside 2.15's libc10: the check above can fail."""
    if _release_libraries("2.6") is None or _release_libraries("2.15") is None:
        pytest.skip("torch 2.6's or 2.15's libraries are not in .deps/torch")
    loaded = _load_beside(unpacked, "2.6", "2.15")
    assert loaded.returncode != 0 and "undefined symbol" in loaded.stderr, loaded.stdout + loaded.stderr


SECOND_RUNTIME = """
import ctypes, sys, uvm
ctypes.CDLL(sys.argv[1])  # the CUDA 13 runtime, as torch would have loaded it
try:
    uvm.library()
    print("loaded")
except uvm.UnifiedMemoryUnsupportedError as error:
    print("refused:", error)
"""


def test_a_library_that_brings_a_second_cuda_runtime_is_refused_naming_both(venv, unpacked):
    """UVM_LIBRARY forces the CUDA 12 build into a process that already holds CUDA 13's runtime."""
    runtime13, runtime12 = _runtime_dir(13), _runtime_dir(12)
    if runtime13 is None or runtime12 is None:
        pytest.skip("needs a CUDA 13 runtime and .deps/cuda-12.8's CUDA 12 one (scripts/fetch_cuda12.sh)")
    library = unpacked / "uvm" / "_prebuilt" / "cuda12" / "libuvm.so"
    shown = subprocess.run([str(venv), "-c", SECOND_RUNTIME, str(runtime13 / "libcudart.so.13")], capture_output=True,
                           text=True, timeout=120, env=bare_env(venv, UVM_LIBRARY=str(library), LD_LIBRARY_PATH=str(runtime12)))
    assert shown.returncode == 0, shown.stderr
    said = shown.stdout.strip()
    assert said.startswith("refused:") and "brought a second CUDA runtime" in said, said
    assert "CUDA 12:" in said and "CUDA 13:" in said


def test_vllm_finds_uvms_plugin_and_the_switch_gives_it_uvms_allocator(venv, tmp_path):
    """The installed wheel: its vllm.general_plugins entry point is what vLLM's plugin loader finds, and
    its .pth puts uvm's allocator in a stand-in vLLM of the real one's shape (tests/python/test_vllm.py)."""
    from test_vllm import stand_in
    folder = stand_in(tmp_path)
    code = ("from importlib.metadata import entry_points; print([e.value for e in entry_points(group='vllm.general_plugins')]); "
            "import vllm.plugins; vllm.plugins.load_general_plugins(); "
            "from vllm.device_allocator import get_mem_allocator_instance as g; print(type(g()).__module__)")
    on = run(venv, code, bare_env(venv, PYTHONPATH=str(folder), UVM_SWITCH="vllm"))
    assert on.returncode == 0, on.stderr
    assert on.stdout.splitlines() == ["['uvm.vllm_plugin:register']", "uvm.vllm"]
    off = run(venv, code, bare_env(venv, PYTHONPATH=str(folder)))
    assert off.stdout.splitlines() == ["['uvm.vllm_plugin:register']", "vllm.device_allocator.cumem"], off.stderr
    doctor = subprocess.run([str(venv.parent / "uvm"), "doctor"], capture_output=True, text=True, timeout=300,
                            env=bare_env(venv, PYTHONPATH=str(folder), UVM_SWITCH="vllm"))
    assert ("switch vllm: on: `vllm.device_allocator.cumem.CuMemAllocator` is uvm's (uvm.vllm), the module vLLM's; "
            f"the original is at {folder / 'vllm' / 'device_allocator' / 'cumem.py'}") in doctor.stdout, doctor.stdout
