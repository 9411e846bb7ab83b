"""The JIT build: cache, timeout from any thread, locks across processes, recovery."""
import os
import re
import shutil
import signal
import stat
import subprocess
import sys
import time
from pathlib import Path

import pytest
from conftest import ROOT, SHIM, UVM_PATH, builds, python

sys.path.insert(0, str(UVM_PATH))

LOAD = "import uvm; lib = uvm.library(); print(lib.uvm_version().decode())"


def fake_compiler(tmp_path: Path, body: str) -> Path:
    script = tmp_path / "fake-c++"
    script.write_text("#!/bin/sh\n" + body + "\n")
    script.chmod(script.stat().st_mode | stat.S_IXUSR)
    return script


def running(pid: int) -> bool:
    """Whether process `pid` exists and has not ended (a zombie waiting to be reaped has ended)."""
    try:
        with open(f"/proc/{pid}/stat") as stat:
            return stat.read().rsplit(")", 1)[1].split()[0] != "Z"
    except (FileNotFoundError, ProcessLookupError):
        return False


def test_build_then_cache_hit(cache):
    directory, env = cache
    assert python(LOAD, env).stdout.strip() == "0.1.0"
    assert builds(directory) == 1
    assert python(LOAD, env).stdout.strip() == "0.1.0"
    assert builds(directory) == 1  # second process: no build (how fast a hit is: bench, not here)


def test_hanging_compiler_times_out_from_a_worker_thread(cache, tmp_path):
    directory, env = cache
    env["UVM_CXX"] = str(fake_compiler(tmp_path, "sleep 60"))
    code = """
import threading, time, uvm
result = {}
def worker():
    started = time.monotonic()
    try:
        with uvm._compile_timeout(2):
            uvm.compile_allocator()
    except uvm.UnifiedMemoryCompileTimeoutError as error:
        result['error'] = str(error)
    result['elapsed'] = time.monotonic() - started
thread = threading.Thread(target=worker); thread.start(); thread.join()
print(result['elapsed']); print(result.get('error')); print(uvm._compilation_state.name)
uvm.compile_allocator()  # attempted once: a no-op now
print(uvm._compilation_state.name)
"""
    elapsed, error, state, state_after = python(code, env).stdout.strip().splitlines()
    assert float(elapsed) < 60  # not the compiler's 60 s: the timeout ended it (no tighter bound: a loaded host)
    assert "building libuvm.so did not finish within 2 s" in error and "was killed" in error
    assert state == state_after == "FAILURE"


def test_env_timeout_kills_the_compiler(cache, tmp_path):
    directory, env = cache
    pid_file = tmp_path / "compiler.pid"
    env["UVM_CXX"] = str(fake_compiler(tmp_path, f"echo $$ > {pid_file}; sleep 60"))
    env["UVM_COMPILE_TIMEOUT_S"] = "1"
    result = python("import uvm\ntry:\n    uvm.library()\nexcept uvm.UnifiedMemoryCompileTimeoutError as e:\n"
                    "    print('timeout', e)", env)
    assert result.stdout.startswith("timeout")
    assert not running(int(pid_file.read_text())), "the compiler was left running"


def test_missing_compiler_is_a_recorded_failure(cache):
    directory, env = cache
    env["UVM_CXX"] = "/nonexistent/c++"
    out = python("import uvm; uvm.compile_allocator(); print(uvm._compilation_state.name); "
                 "print(uvm._compilation_error)", env).stdout
    assert out.startswith("FAILURE")
    assert "C++ compiler '/nonexistent/c++' not found" in out


def test_bad_timeout_value_is_named(cache):
    directory, env = cache
    env["UVM_COMPILE_TIMEOUT_S"] = "soon"
    out = python("import uvm\ntry:\n    uvm.library()\nexcept uvm.UnifiedMemoryUnsupportedError as e:\n"
                 "    print(e)", env).stdout
    assert "UVM_COMPILE_TIMEOUT_S='soon' is not a number" in out


def test_eight_processes_build_once(cache):
    directory, env = cache
    full_env = {**os.environ, "PYTHONPATH": str(UVM_PATH), **env}
    children = [subprocess.Popen([sys.executable, "-c", LOAD], env=full_env, stdout=subprocess.PIPE,
                                 stderr=subprocess.PIPE, text=True) for _ in range(8)]
    outputs = [child.communicate(timeout=300) for child in children]
    assert [child.returncode for child in children] == [0] * 8, outputs
    assert all(out.strip() == "0.1.0" for out, _ in outputs)
    assert builds(directory) == 1


def test_a_killed_builder_leaves_no_lock_behind(cache, tmp_path):
    directory, env = cache
    started = tmp_path / "started"
    real = subprocess.run(["sh", "-c", "command -v c++"], capture_output=True, text=True).stdout.strip()
    env_slow = {**env, "UVM_CXX": str(fake_compiler(tmp_path, f'touch {started}; sleep 60; exec {real} "$@"'))}
    full_env = {**os.environ, "PYTHONPATH": str(UVM_PATH), **env_slow}
    builder = subprocess.Popen([sys.executable, "-c", LOAD], env=full_env, start_new_session=True)
    deadline = time.monotonic() + 60
    while not started.exists():  # it holds the lock once its compiler runs
        assert time.monotonic() < deadline
        time.sleep(0.05)
    os.killpg(builder.pid, signal.SIGKILL)
    builder.wait()
    assert python(LOAD, env, timeout=120).stdout.strip() == "0.1.0"
    assert builds(directory) == 1


def test_a_killed_builder_leaves_no_compiler_running_and_no_scratch_folder(cache, tmp_path):
    directory, env = cache
    started, finished = tmp_path / "started", tmp_path / "finished"
    env["UVM_CXX"] = str(fake_compiler(tmp_path, f"echo $$ > {started}; sleep 4; touch {finished}; exit 1"))
    builder = subprocess.Popen([sys.executable, "-c", LOAD], env={**os.environ, "PYTHONPATH": str(UVM_PATH), **env})
    deadline = time.monotonic() + 60
    while not started.exists() or not started.read_text().strip():
        assert time.monotonic() < deadline
        time.sleep(0.05)
    builder.kill()  # the builder alone, as an OOM killer or a job scheduler would
    builder.wait()
    # Until the compiler and the scratch folder are gone, however long that takes: a compiler that
    # outlived the builder ends by writing `finished`, so no sleep decides the answer.
    compiler = int(started.read_text())
    while running(compiler) or list(directory.glob("*/.build-*")):
        assert time.monotonic() < deadline + 60, "the compiler or the scratch folder outlived the builder"
        time.sleep(0.05)
    assert not finished.exists(), "a compiler outlived the builder"


def test_nan_or_infinite_timeouts_are_refused_by_name(cache):
    directory, env = cache
    for value in ("nan", "inf", "-inf", "0"):
        env["UVM_COMPILE_TIMEOUT_S"] = value
        out = python("import uvm\ntry:\n    uvm.library()\nexcept uvm.UnifiedMemoryUnsupportedError as e:\n"
                     "    print(e)", env).stdout
        assert f"UVM_COMPILE_TIMEOUT_S={value!r} must be a finite number of seconds > 0" in out, out
    assert builds(directory) == 0


def test_a_compiler_message_that_is_not_utf8_is_shown(cache, tmp_path):
    directory, env = cache
    env["UVM_CXX"] = str(fake_compiler(tmp_path, "printf 'fatal: caf\\351 \\377 broken\\n'; exit 1"))
    out = python("import uvm; uvm.compile_allocator(); print(uvm._compilation_error)", env).stdout
    assert "failed (exit 1)" in out and "fatal: caf" in out and "broken" in out, out


def test_a_compiler_that_succeeds_but_writes_nothing_is_a_clear_failure(cache, tmp_path):
    directory, env = cache
    env["UVM_CXX"] = str(fake_compiler(tmp_path, "exit 0"))
    out = python("import uvm; uvm.compile_allocator(); print(uvm._compilation_error)", env).stdout
    assert "exited 0 but wrote no" in out and ".o" in out, out


def test_a_cache_other_users_can_write_is_never_loaded(cache):
    directory, env = cache
    python(LOAD, env)
    key_dir = next(directory.glob("*/libuvm.so")).parent
    key_dir.chmod(0o777)  # anyone could have replaced the library
    result = python("import warnings, uvm\nwith warnings.catch_warnings(record=True) as w:\n"
                    "    warnings.simplefilter('always')\n    lib = uvm.library()\n"
                    "print(uvm._so_path)\nprint(w[0].message if w else '')", env)
    so_path, warning = result.stdout.splitlines()[:2]
    assert not so_path.startswith(str(key_dir)), so_path
    assert "is writable by other users" in warning, warning
    assert builds(directory) == 1  # the rebuild happened in a private folder, not in the shared one


@pytest.mark.skipif(os.getuid() != 0, reason="planting a file owned by another user needs root")
def test_a_library_owned_by_another_user_is_never_loaded(cache):
    directory, env = cache
    python(LOAD, env)
    library = next(directory.glob("*/libuvm.so"))
    os.chown(library, 12345, 12345)
    python(LOAD, env)
    assert builds(directory) == 2  # rebuilt over it, not loaded
    assert library.stat().st_uid == os.getuid()


def test_a_library_planted_in_the_shared_temp_dir_is_never_loaded(cache, tmp_path):
    """The old fallback, /tmp/uvm-cache-<uid>, was a fixed name another user could prepare: a planted
    library with a matching checksum had its constructor run in the caller's process."""
    directory, env = cache
    shared_tmp = tmp_path / "tmp"
    shared_tmp.mkdir()
    blocker = tmp_path / "a-file"
    blocker.write_text("not a directory")
    env.update({"UVM_CACHE_DIR": str(blocker / "cache"), "TMPDIR": str(shared_tmp)})
    key = python("import uvm._build as b; print(b.build_key(b.source_root(), b.compiler(), b.cuda_home()))",
                 env).stdout.strip()
    marker = tmp_path / "constructor-ran"
    planted_dir = shared_tmp / f"uvm-cache-{os.getuid()}" / key
    planted_dir.mkdir(parents=True)
    source = tmp_path / "planted.c"
    source.write_text('#include <stdio.h>\n__attribute__((constructor)) static void run(void) '
                      f'{{ fopen("{marker}", "w"); }}\n')
    subprocess.run(["cc", "-shared", "-fPIC", "-o", str(planted_dir / "libuvm.so"), str(source)], check=True)
    import hashlib
    digest = hashlib.sha256((planted_dir / "libuvm.so").read_bytes()).hexdigest()
    (planted_dir / "libuvm.sha256").write_text(digest + "\n")
    out = python("import warnings, uvm\nwarnings.simplefilter('ignore')\nprint(uvm.library().uvm_version().decode())",
                 env).stdout
    assert out.strip() == "0.1.0"
    assert not marker.exists(), "the planted library was loaded"


def test_a_valid_build_in_a_cache_we_cannot_write_is_used_as_it_is(cache):
    directory, env = cache
    python(LOAD, env)
    code = ("import uvm, uvm._build as b\n"
            "def refuse(chosen, key):\n    raise AssertionError('asked to write to the cache')\n"
            "b.writable_cache_dir = refuse\n"
            "print(uvm.library().uvm_version().decode())")
    assert python(code, env).stdout.strip() == "0.1.0"
    assert builds(directory) == 1


def test_a_corrupt_cached_library_is_rebuilt(cache):
    directory, env = cache
    python(LOAD, env)
    library = next(directory.glob("*/libuvm.so"))
    library.write_bytes(library.read_bytes()[:1000])  # truncated
    assert python(LOAD, env).stdout.strip() == "0.1.0"
    assert builds(directory) == 2


def test_an_unwritable_cache_falls_back_with_a_warning(cache, tmp_path):
    directory, env = cache
    blocker = tmp_path / "a-file"
    blocker.write_text("not a directory")
    env["UVM_CACHE_DIR"] = str(blocker / "cache")
    result = python("import os, stat, warnings, uvm\nwith warnings.catch_warnings(record=True) as w:\n"
                    "    warnings.simplefilter('always')\n    uvm.library()\nprint(w[0].message)\n"
                    "print(oct(stat.S_IMODE(os.stat(os.path.dirname(os.path.dirname(uvm._so_path))).st_mode)))", env)
    message, mode = result.stdout.strip().splitlines()
    assert "is not writable" in message and "uvm-cache-" in message and "private to this process" in message
    assert mode == "0o700"


def test_a_prebuilt_library_skips_the_compiler(cache):
    directory, env = cache
    python(LOAD, env)
    library = next(directory.glob("*/libuvm.so"))
    env.update({"UVM_LIBRARY": str(library), "UVM_CXX": "/nonexistent/c++",
                "UVM_CACHE_DIR": str(directory / "unused")})
    assert python(LOAD + "; print(uvm._so_path)", env).stdout.split() == ["0.1.0", str(library)]
    missing = python("import uvm\ntry:\n    uvm.library()\nexcept uvm.UnifiedMemoryUnsupportedError as e:\n"
                     "    print(e)", {**env, "UVM_LIBRARY": "/nope/libuvm.so"}).stdout
    assert "UVM_LIBRARY='/nope/libuvm.so' does not exist" in missing


def test_unity_groups_share_the_cost_and_keep_the_order():
    from uvm import _build
    sources = [Path(f"s{i}.cpp") for i in range(44)]
    costs = {s: (i * 37) % 11 + 1 for i, s in enumerate(sources)}  # uneven, as the real files are
    for jobs in (1, 2, 3, 16, 44, 100):
        groups = _build.unity_groups(sources, jobs, cost=costs.__getitem__)
        assert sorted(s for g in groups for s in g) == sorted(sources)  # each file once
        assert all(g == sorted(g, key=sources.index) for g in groups)  # sources.txt's order in each
        assert len(groups) == min(jobs, len(sources))
        loads = [sum(costs[s] for s in g) for g in groups]
        # Costliest first to the lightest unit: no unit passes the even share by more than one file.
        assert max(loads) <= sum(costs.values()) / len(groups) + max(costs.values())
    assert _build.unity_groups(sources, 0, cost=costs.__getitem__) == [sources]
    # One big file and five small ones in two units: the big one alone, not three files each.
    few = [Path(f"f{i}.cpp") for i in range(6)]
    assert _build.unity_groups(few, 2, cost=lambda p: 5 if p.name == "f0.cpp" else 1) == [few[:1], few[1:]]


def test_all_sources_build_as_one_unit_on_one_cpu(cache):
    """One CPU: every source in one translation unit, so no two files may clash (names in anonymous
    namespaces, macros)."""
    directory, env = cache
    code = "import os; os.sched_setaffinity(0, {min(os.sched_getaffinity(0))}); " + LOAD
    assert python(code, env, timeout=300).stdout.strip() == "0.1.0"
    assert builds(directory) == 1


# The order of sources.txt: each part may use those before it (share/: sharing with other processes,
# above alloc/; offload/ is three: the GPU coder, the media where bytes wait, the moves).
ROOMS = ("alloc", "share", "hints", "offload/coder", "offload/media", "offload/moves")


def test_rooms_depend_one_way():
    """docs/design.md, "Rooms": a room includes no header of a room after it and names none of its
    types, not even in a comment or a forward declaration (offload keeps its part of a registry
    record behind alloc's RoomPart)."""
    def room(path):
        relative = path.relative_to(ROOT).as_posix()
        found = [index for index, name in enumerate(ROOMS) if relative.startswith(name + "/")]
        return found[-1] if found else -1

    # Definitions only: a forward declaration in an earlier room is the knowledge this forbids.
    defined = re.compile(r"^\s*(?:(?:class|struct|enum class|enum)\s+([A-Z]\w+)[^;{]*\{|using\s+([A-Z]\w+)\s*=)", re.M)
    types = [set() for _ in ROOMS]
    for index, name in enumerate(ROOMS):
        for header in (ROOT / name).rglob("*.hpp"):
            types[index] |= {a or b for a, b in defined.findall(header.read_text())}
    wrong = []
    for index, name in enumerate(ROOMS):
        later = set().union(*types[index + 1:]) - types[index]
        for source in sorted((ROOT / name).rglob("*.[ch]pp")):
            text = source.read_text()
            for included in re.findall(r'#include "([^"]+)"', text):
                target = (source.parent / included).resolve()
                if target.exists() and room(target) > index:
                    wrong.append(f"{source.relative_to(ROOT)} includes {target.relative_to(ROOT)}")
            for type_name in sorted(later):
                if re.search(rf"\b{type_name}\b", text):
                    wrong.append(f"{source.relative_to(ROOT)} names {type_name}, a type of a later room")
    assert not wrong, "\n".join(wrong)
    assert all(types), "no types found: the pattern no longer reads the headers"


def test_a_compile_error_names_the_file_it_is_in(tmp_path):
    from uvm import _build
    root = tmp_path / "tree"
    checkout = ROOT
    for name in ("alloc", "share", "hints", "offload", "preload", "include"):
        shutil.copytree(checkout / name, root / name)
    shutil.copy(checkout / _build.SOURCE_LIST, root)
    broken = root / "offload" / "moves" / "residency.cpp"
    broken.write_text(broken.read_text() + "\nthis is not C++;\n")
    with pytest.raises(_build.BuildError, match=r"offload/moves/residency\.cpp"):
        _build.compile_library(root, _build.compiler(), _build.cuda_home(), tmp_path, timeout=300)


def test_a_cache_hit_hashes_no_file_and_any_edit_changes_the_key(tmp_path, monkeypatch):
    """The key is remembered under the files' stat fingerprint: a second call reads no file's bytes,
    and an edit that keeps the size and the mtime still changes the key (ctime)."""
    from uvm import _build as b
    root = tmp_path / "tree"
    (root / "alloc").mkdir(parents=True)
    (root / "include").mkdir()
    (root / "sources.txt").write_text("std c++17\nalloc/a.cpp\n")
    source = root / "alloc" / "a.cpp"
    source.write_text("int a = 1;\n")
    (root / "include" / "uvm.h").write_text("/* header */\n")
    monkeypatch.setenv("UVM_CACHE_DIR", str(tmp_path / "cache"))
    cxx, home = b.compiler(), b.cuda_home()
    first = b.build_key(root, cxx, home)
    with monkeypatch.context() as patched:
        def refuse(path):
            raise AssertionError(f"read {path} on a cache hit")
        patched.setattr(Path, "read_bytes", refuse)
        assert b.build_key(root, cxx, home) == first
    before = source.stat()
    source.write_text("int a = 2;\n")  # same size
    os.utime(source, ns=(before.st_atime_ns, before.st_mtime_ns))  # same mtime
    edited = b.build_key(root, cxx, home)
    assert edited != first
    source.write_text("int a = 1;\n")
    assert b.build_key(root, cxx, home) == first  # the content decides the key, not the stat
    for memo in (tmp_path / "cache" / "keys").iterdir():
        memo.write_text("not a key\n")  # a damaged memo is not believed
    assert b.build_key(root, cxx, home) == first


def test_the_oldest_python_claimed_is_the_oldest_the_code_and_tests_run_on():
    """pyproject's floor and classifiers agree, and no branch in the shim is left for a Python below
    the floor (uvm claimed 3.9 while it used 3.11's process_group and add_note untested)."""
    import ast
    from conftest import ROOT
    text = (ROOT / "pyproject.toml").read_text()
    floor = re.search(r'requires-python = ">=3\.(\d+)"', text)
    assert floor, "requires-python is not a plain >=3.N"
    oldest = int(floor.group(1))
    claimed = sorted(int(minor) for minor in re.findall(r'"Programming Language :: Python :: 3\.(\d+)"', text))
    assert claimed and claimed[0] == oldest, (oldest, claimed)
    assert sys.version_info >= (3, oldest), f"the tests run on {sys.version_info[:2]}, below the floor 3.{oldest}"
    for source in (ROOT / "python_shim" / "uvm").rglob("*.py"):
        for node in ast.walk(ast.parse(source.read_text())):
            if isinstance(node, ast.Compare) and ast.unparse(node.left) == "sys.version_info":
                version = ast.literal_eval(node.comparators[0])
                assert tuple(version) > (3, oldest), f"{source.name}: a branch for Python {version}: {ast.unparse(node)}"
