"""Compiling libuvm.so from the C++ sources, once per (sources, compiler, flags, CUDA) key, and
the hook that reports PyTorch's blocks to it (_torch_blocks.cpp), once per torch.

- The compiler runs in child processes with a real timeout that works from any thread; on timeout
  the whole process group is killed.
- Results are cached in UVM_CACHE_DIR (default ~/.cache/uvm) under a hash of everything that goes
  into the build. Builders take an flock, so N processes build once, and the kernel drops the lock
  of a builder that dies, so a stale lock never hangs anyone. The library is built in a temporary
  directory and renamed into place; a sidecar checksum catches a truncated or corrupt copy.
"""
from __future__ import annotations

import concurrent.futures
import contextlib
import contextvars
import fcntl
import hashlib
import math
import os
import re
import shutil
import signal
import stat
import subprocess
import sys
import tempfile
import threading
import time
import warnings
from pathlib import Path

from ._errors import BuildError, BuildTimeout

DEFAULT_TIMEOUT_S = 60.0
SOURCE_LIST = "sources.txt"  # the sources and flags, read by meson.build too
_timeout_override: contextvars.ContextVar[float | None] = contextvars.ContextVar("uvm_compile_timeout",
                                                                                 default=None)


@contextlib.contextmanager
def compile_timeout_override(timeout_s: float):
    """Builds started inside this block (in this thread or task) give up after `timeout_s` seconds.
    Unlike a SIGALRM timer it works in any thread."""
    if not timeout_s > 0:
        raise ValueError(f"timeout_s must be > 0, got {timeout_s!r}")
    token = _timeout_override.set(float(timeout_s))
    try:
        yield
    finally:
        _timeout_override.reset(token)


def source_root() -> Path:
    """The C++ sources: inside the installed package, else the checkout above python_shim/."""
    packaged = Path(__file__).resolve().parent / "_csrc"
    if (packaged / SOURCE_LIST).is_file():
        return packaged
    checkout = Path(__file__).resolve().parents[2]
    if (checkout / SOURCE_LIST).is_file():
        return checkout
    raise BuildError(f"uvm's C++ sources are missing (looked in {packaged} and {checkout})")


def cuda_home() -> Path:
    for candidate in (os.environ.get("CUDA_HOME"), os.environ.get("CUDA_PATH"), "/usr/local/cuda"):
        if candidate and (Path(candidate) / "include" / "cuda_runtime_api.h").is_file():
            return Path(candidate)
    raise BuildError("no CUDA toolkit found: set CUDA_HOME to a CUDA 12.x or 13.x toolkit "
                     "(cuda_runtime_api.h and libcudart.so are needed)")


def cuda_version(home: Path) -> str:
    header = (home / "include" / "cuda_runtime_api.h").read_text(errors="replace")
    match = re.search(r"#define\s+CUDART_VERSION\s+(\d+)", header)
    return match.group(1) if match else "unknown"


def cudart_dir(home: Path) -> Path:
    for sub in ("lib64", "targets/x86_64-linux/lib", "targets/sbsa-linux/lib", "lib"):
        if (home / sub / "libcudart.so").exists():
            return home / sub
    raise BuildError(f"libcudart.so not found under {home}")


def compiler() -> str:
    chosen = os.environ.get("UVM_CXX") or os.environ.get("CXX") or "c++"
    path = shutil.which(chosen)
    if path is None:
        raise BuildError(f"C++ compiler {chosen!r} not found (set UVM_CXX to one)")
    return path


def compile_timeout() -> float:
    """The timeout of a build started now: compile_timeout_override's, else UVM_COMPILE_TIMEOUT_S's,
    else DEFAULT_TIMEOUT_S."""
    if _timeout_override.get() is not None:
        return _timeout_override.get()
    text = os.environ.get("UVM_COMPILE_TIMEOUT_S")
    if not text:
        return DEFAULT_TIMEOUT_S
    try:
        value = float(text)
    except ValueError:
        raise BuildError(f"UVM_COMPILE_TIMEOUT_S={text!r} is not a number of seconds") from None
    if not (math.isfinite(value) and value > 0):
        raise BuildError(f"UVM_COMPILE_TIMEOUT_S={text!r} must be a finite number of seconds > 0")
    return value


class SourceList:
    """sources.txt: the sources (in order) and the compiler flags, as meson.build reads them."""

    def __init__(self, root: Path):
        self.sources: list[Path] = []
        self.preload_sources: list[Path] = []  # libuvm_preload.so's
        self.flags: list[str] = []
        for number, raw in enumerate((root / SOURCE_LIST).read_text().splitlines(), 1):
            line = raw.strip()
            if not line or line.startswith("#"):
                continue
            word, _, rest = line.partition(" ")
            if word == "std":
                self.flags.insert(0, f"-std={rest.strip()}")
            elif word == "flags":
                self.flags += rest.split()
            elif word == "preload" and (root / rest.strip()).is_file():
                self.preload_sources.append(root / rest.strip())
            elif (root / line).is_file():
                self.sources.append(root / line)
            else:
                raise BuildError(f"{root / SOURCE_LIST}:{number}: {line!r} is no source file under {root}")

    def folders(self, root: Path) -> list[Path]:
        """The folders whose files go into the library: those of the sources, and include/."""
        return sorted({source.parent for source in self.sources + self.preload_sources} | {root / "include"})


def build_key(root: Path, cxx: str, home: Path) -> str:
    """The cache key of the library: a hash of every file that goes into it (sources.txt, and the
    files of the sources' folders and include/), the compiler and the CUDA version. Reading and
    hashing the ~100 files was most of a cache hit, so the key is remembered under the files' stat
    fingerprint (size, mtime, ctime, inode: any write changes ctime) and hashed again only when one
    of them differs."""
    listed = SourceList(root)
    stats = {root / SOURCE_LIST: (root / SOURCE_LIST).stat()}
    for folder in listed.folders(root):
        _stat_files(folder, stats)
    files = [root / SOURCE_LIST] + sorted(path for path in stats if path != root / SOURCE_LIST)
    identity = [cxx, _compiler_identity(cxx), cuda_version(home)]
    fingerprint = hashlib.sha256(repr([str(root), identity] + [
        (str(path), info.st_size, info.st_mtime_ns, info.st_ctime_ns, info.st_ino) for path, info in stats.items()
    ]).encode())
    memo = configured_cache_dir() / "keys" / fingerprint.hexdigest()[:32]
    remembered = _read_memo(memo)
    if remembered is not None:
        return remembered
    digest = _content_digest(root, files)
    for part in identity:
        digest.update(part.encode())
    key = digest.hexdigest()[:24]
    _write_memo(memo, key)
    return key


def _content_digest(root: Path, files: list[Path]):
    """A sha256 over each file's path under `root` and its bytes, in the order given."""
    digest = hashlib.sha256()
    for path in files:
        digest.update(str(path.relative_to(root)).encode())
        digest.update(path.read_bytes())
    return digest


def sources_digest(root: Path) -> str:
    """A hash of the files that go into the library (sources.txt, the sources' folders, include/),
    without the compiler: what a shipped library records it was built from."""
    stats = {root / SOURCE_LIST: None}
    for folder in SourceList(root).folders(root):
        _stat_files(folder, stats)
    files = [root / SOURCE_LIST] + sorted(path for path in stats if path != root / SOURCE_LIST)
    return _content_digest(root, files).hexdigest()


def _stat_files(folder: Path, into: dict) -> None:
    """Every file under `folder`, with its stat: one system call a file (rglob and is_file take two)."""
    with os.scandir(folder) as entries:
        for entry in entries:
            if entry.is_dir(follow_symlinks=False):
                _stat_files(Path(entry.path), into)
            elif entry.is_file():
                into[Path(entry.path)] = entry.stat()


def _read_memo(memo: Path) -> str | None:
    """A remembered key, if the memo and its folder are ours (as cached libraries must be) and it
    holds one."""
    if untrusted_reason(memo.parent) is not None or untrusted_reason(memo) is not None:
        return None
    try:
        key = memo.read_text().strip()
    except OSError:
        return None
    return key if len(key) == 24 and all(c in "0123456789abcdef" for c in key) else None


def _write_memo(memo: Path, key: str) -> None:
    """Remembers `key` (atomically); a cache that cannot be written just hashes every time."""
    try:
        memo.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
        if untrusted_reason(memo.parent) is not None:
            return
        with tempfile.NamedTemporaryFile("w", dir=memo.parent, prefix=".memo-", delete=False) as temporary:
            temporary.write(key + "\n")
        os.replace(temporary.name, memo)
    except OSError:
        pass


def _compiler_identity(cxx: str) -> str:
    """The compiler's resolved path, size and mtime: an upgrade changes them, and reading them costs
    no process (running `--version` on every cache hit took most of the warm path's time)."""
    real = os.path.realpath(cxx)
    info = os.stat(real)
    return f"{real}:{info.st_size}:{info.st_mtime_ns}"


def run(command: list[str], timeout: float, cwd: Path | None = None, watchdog: "Watchdog | None" = None) -> str:
    """Runs `command` in a process group of its own, or in the watchdog's; kills that group if the
    command outlives `timeout`. Output is decoded leniently: a compiler's non-UTF-8 message must not
    hide behind a UnicodeDecodeError."""
    try:
        child = subprocess.Popen(command, cwd=cwd, stdout=subprocess.PIPE,
                                 stderr=subprocess.STDOUT, **_process_group(watchdog))
    except OSError as error:
        raise BuildError(f"could not run {command[0]}: {error}") from None
    try:
        raw, _ = child.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        if watchdog is not None:
            watchdog.timed_out.set()  # before the kill: the compilers it takes down say "timeout" too
        os.killpg(os.getpgid(child.pid), signal.SIGKILL)  # a build has one deadline: all of it stops
        child.communicate()
        raise BuildTimeout(f"{Path(command[0]).name} did not finish within {timeout:g} s and was "
                           f"killed (raise UVM_COMPILE_TIMEOUT_S if the machine is just slow)") from None
    output = raw.decode(errors="replace")
    if child.returncode != 0 and watchdog is not None and watchdog.timed_out.is_set():
        raise BuildTimeout(f"{Path(command[0]).name} was killed: the build ran past its timeout "
                           f"(raise UVM_COMPILE_TIMEOUT_S if the machine is just slow)")
    if child.returncode != 0:
        raise BuildError(f"{' '.join(command[:2])} … failed (exit {child.returncode}):\n{output[-4000:]}")
    return output


def _process_group(watchdog: "Watchdog | None") -> dict:
    """Popen arguments that start a command in the watchdog's process group (so that it dies with
    the builder), else in a new session."""
    if watchdog is None:
        return {"start_new_session": True}
    return {"process_group": watchdog.group}


_WATCHDOG = """
import os, shutil, signal, sys
if sys.stdin.read() != "done":  # end of input without "done": the builder died mid-build
    shutil.rmtree(sys.argv[1], ignore_errors=True)
    os.killpg(os.getpgid(0), signal.SIGKILL)  # the compilers share this process's group
"""


class Watchdog:
    """A small process that leads the process group the compilers of one build run in. If the
    builder dies mid-build (its end of the pipe closes without "done"), it removes the scratch folder
    and kills the whole group: compilers started before the builder died cannot be left running,
    since each joins the group as it is created."""

    def __init__(self, scratch: Path):
        self._process = subprocess.Popen([sys.executable, "-c", _WATCHDOG, str(scratch)], stdin=subprocess.PIPE,
                                         text=True, process_group=0)
        self.group = self._process.pid
        self.timed_out = threading.Event()

    def close(self) -> None:
        try:
            self._process.stdin.write("done")
            self._process.stdin.close()
        except (BrokenPipeError, ValueError):
            pass  # killed with its group on a timeout
        self._process.wait()


def _produced(cxx: str, target: Path) -> Path:
    if not target.is_file():
        raise BuildError(f"{cxx} exited 0 but wrote no {target.name}")
    return target


def usable_cpus() -> int:
    """The CPUs this process may run on (its affinity, which containers and taskset narrow)."""
    try:
        return max(len(os.sched_getaffinity(0)), 1)
    except (AttributeError, OSError):
        return os.cpu_count() or 1


def unity_groups(sources: list[Path], jobs: int, cost=lambda path: path.stat().st_size) -> list[list[Path]]:
    """`sources` shared among `jobs` translation units, one compiler each parsing the shared headers
    once (on 2 cores the files built one compiler each took 8.7 s, two units 4.3 s). The build
    lasts as long as its slowest unit: each file, costliest first (by size), goes to the unit with the
    least so far, and each unit keeps sources.txt's order. With 16 units the slowest took 1.24 s
    where consecutive runs of files took 1.62 (each unit compiled alone on the 2-core machine,
    docs/performance.md)."""
    jobs = max(1, min(jobs, len(sources)))
    groups: list[list[Path]] = [[] for _ in range(jobs)]
    loads = [0] * jobs
    for source in sorted(sources, key=cost, reverse=True):  # stable: ties keep sources.txt's order
        lightest = loads.index(min(loads))
        groups[lightest].append(source)
        loads[lightest] += cost(source)
    position = {source: index for index, source in enumerate(sources)}
    return sorted((sorted(group, key=position.__getitem__) for group in groups if group), key=lambda g: position[g[0]])


# How a shipped library links the C++ runtime: statically, so that it loads beside any libstdc++ (a
# conda environment's older one, RHEL 9's GCC 11; no C++ object crosses its C ABI), with unused
# sections dropped (else std::random_device's arc4random needs glibc 2.36) and the unwinder left in
# the system's libgcc_s (a static one needs glibc 2.35's _dl_find_object): glibc 2.34 is then the
# newest the libraries need (setup.py tags the wheel from it).
STATIC_CXX_RUNTIME = ["-static-libstdc++", "-Wl,--gc-sections"]


def compile_library(root: Path, cxx: str, home: Path, out_dir: Path, timeout: float,
                    watchdog: Watchdog | None = None, link_flags: tuple = ()) -> Path:
    """Compiles the sources as one translation unit per usable CPU (unity runs), in parallel, then
    links libuvm.so in `out_dir` (with `link_flags` added). meson still builds every file alone, so
    a file that leans on a header only its neighbour includes fails there."""
    deadline = time.monotonic() + timeout
    include = ["-I", str(root / "include"), "-isystem", str(home / "include")]
    listed = SourceList(root)

    def compile_group(numbered: tuple[int, list[Path]]) -> Path:
        index, group = numbered
        unit = out_dir / f"unity_{index}.cpp"
        # #include keeps each file's own name in the compiler's messages.
        if any('"' in str(source) or "\n" in str(source) for source in group):
            raise BuildError(f"uvm's sources lie under a path with a quote or a newline: {root}")
        unit.write_text("".join(f'#include "{source}"\n' for source in group))
        target = unit.with_suffix(".o")
        run([cxx, *listed.flags, *include, "-c", str(unit), "-o", str(target)],
            timeout=max(deadline - time.monotonic(), 0.1), watchdog=watchdog)
        return _produced(cxx, target)

    groups = list(enumerate(unity_groups(listed.sources, usable_cpus())))
    with concurrent.futures.ThreadPoolExecutor(max_workers=len(groups)) as pool:
        objects = list(pool.map(compile_group, groups))
    library = out_dir / "libuvm.so"
    run([cxx, "-shared", "-o", str(library), *map(str, objects),
         f"-Wl,--version-script={root / 'alloc' / 'exports.map'}", "-Wl,-soname,libuvm.so.0",
         "-L", str(cudart_dir(home)), "-lcudart", *link_flags],
        timeout=max(deadline - time.monotonic(), 0.1), watchdog=watchdog)
    return _produced(cxx, library)


PRELOAD_NAME = "libuvm_preload.so"
# torch_memory_saver's file names for its interposer, where slime (and the stacks copying its train actors'
# code) look for it: two folders above torch_memory_saver.__file__. The wheel ships uvm's interposer under
# both in _prebuilt/, and the switched module's __file__ is _prebuilt/torch_memory_saver/__init__.py.
TMS_PRELOAD_NAMES = tuple(f"torch_memory_saver_hook_mode_preload{suffix}.abi3.so" for suffix in ("", "_cu12", "_cu13"))
TMS_PACKAGE_FILE = "torch_memory_saver/__init__.py"
TMS_PACKAGE_TEXT = ('"""What the switched torch_memory_saver (UVM_SWITCH) gives as its __file__: two folders up lies uvm\'s\n'
                    'cudaMalloc interposer under torch_memory_saver\'s file names, where slime\'s train actors look for\n'
                    'the library to preload. It opens the libuvm.so of cuda<major>/ for the CUDA runtime the process\n'
                    'loads. The package itself is uvm.memory_saver (uvm_switch.py)."""\n')


def compile_preload(root: Path, cxx: str, home: Path, out_dir: Path, timeout: float,
                    watchdog: Watchdog | None = None, link_flags: tuple = ()) -> Path:
    """Compiles the cudaMalloc interposer (sources.txt's `preload` lines) into `out_dir`. It links
    neither libuvm nor the CUDA runtime: it opens the libuvm.so beside it at load."""
    listed = SourceList(root)
    library = out_dir / PRELOAD_NAME
    run([cxx, *listed.flags, "-I", str(root / "include"), "-isystem", str(home / "include"), "-shared",
         "-o", str(library), *map(str, listed.preload_sources),
         f"-Wl,--version-script={root / 'preload' / 'exports.map'}", "-ldl", *link_flags], timeout=timeout,
        watchdog=watchdog)
    return _produced(cxx, library)


def preload_library(libuvm: Path) -> Path:
    """The interposer beside `libuvm` (the one it opens at load): built now into the JIT cache
    beside a library built there; a shipped or UVM_LIBRARY library must have it beside already."""
    beside = libuvm.with_name(PRELOAD_NAME)
    if beside.is_file():
        return beside
    root, home, cxx = source_root(), cuda_home(), compiler()
    key = build_key(root, cxx, home)
    if libuvm.parent.name != key:
        raise BuildError(f"{beside} is missing: the interposer must lie beside the libuvm.so it opens ({libuvm}); "
                         "build both (meson, or pip install ./python_shim)")
    return _cached_build(PRELOAD_NAME, key, None,
                         lambda scratch, left, watchdog: compile_preload(root, cxx, home, scratch, left, watchdog))


def configured_cache_dir() -> Path:
    return Path(os.environ.get("UVM_CACHE_DIR") or Path.home() / ".cache" / "uvm")


def untrusted_reason(path: Path) -> str | None:
    """Why a cache path may not hold a library this process loads, or None. Like any tool that
    caches executables: it must be ours (or root's) and writable by no one else, or another user
    could plant a library whose constructors would run in this process."""
    try:
        info = path.lstat()
    except OSError as error:
        return f"{path}: {error.strerror}"
    if stat.S_ISLNK(info.st_mode):
        return f"{path} is a symbolic link"
    if info.st_uid not in (os.getuid(), 0):
        return f"{path} belongs to uid {info.st_uid}, not to this user (uid {os.getuid()})"
    if info.st_mode & (stat.S_IWGRP | stat.S_IWOTH):
        return f"{path} is writable by other users (mode {stat.S_IMODE(info.st_mode):o})"
    return None


def writable_cache_dir(chosen: Path, key: str) -> Path:
    """`chosen` if it is ours, writable, and its folder for `key` (if any) is ours too; else a new
    private temporary directory, with a warning (never a fixed path in the shared temporary
    directory, which another user could prepare)."""
    try:
        chosen.mkdir(mode=0o700, parents=True, exist_ok=True)
        reason = untrusted_reason(chosen)
        if reason is None and (chosen / key).exists():
            reason = untrusted_reason(chosen / key)
        if reason is None:
            probe = tempfile.NamedTemporaryFile(dir=chosen, prefix=".write-probe-")
            probe.close()
            return chosen
    except OSError as error:
        reason = f"{chosen} is not writable ({error.strerror})"
    fallback = Path(tempfile.mkdtemp(prefix="uvm-cache-"))
    warnings.warn(f"uvm: cache directory not used: {reason}; building in {fallback} (private to this "
                  "process; set UVM_CACHE_DIR to a directory of your own to keep builds)",
                  RuntimeWarning, stacklevel=4)
    return fallback


def _checksum(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def _cached_library_is_valid(library: Path) -> bool:
    """The library and its checksum sidecar are there, agree, and no other user could have written
    them (nor the folders holding them)."""
    sidecar = library.with_suffix(".sha256")
    for path in (library.parent.parent, library.parent, library, sidecar):
        if untrusted_reason(path) is not None:
            return False
    try:
        return sidecar.read_text().strip() == _checksum(library)
    except OSError:
        return False


SHIPPED = Path(__file__).resolve().with_name("_prebuilt")  # made by setup.py when the wheel is built
SHIPPED_MANIFEST = "manifest.json"
TORCH_HOOK = "libuvm_torch_blocks.so"


def ship_libraries(root: Path, out_dir: Path, toolkits: dict, timeout: float) -> dict:
    """Compiles libuvm.so and its interposer from the sources under `root` once per CUDA major of
    `toolkits` ({12: toolkit path, 13: ...}), each into `out_dir`/cuda<major>/ with the C++ runtime
    linked in. Returns the manifest's "libraries": {major: {"cuda": CUDART_VERSION of the headers,
    "sha256": of libuvm.so}}. setup.py calls this, so that pip users never compile."""
    cxx = compiler()
    shipped = {}
    for major, home in sorted(toolkits.items()):
        target = out_dir / f"cuda{major}"
        target.mkdir(parents=True, exist_ok=True)
        with tempfile.TemporaryDirectory(prefix="uvm-ship-") as scratch:
            watchdog = Watchdog(Path(scratch))
            try:
                built = compile_library(root, cxx, Path(home), Path(scratch), timeout, watchdog, tuple(STATIC_CXX_RUNTIME))
                interposer = compile_preload(root, cxx, Path(home), Path(scratch), timeout, watchdog,
                                             tuple(STATIC_CXX_RUNTIME))
            finally:
                watchdog.close()
            shutil.copy2(built, target / "libuvm.so")
            shutil.copy2(interposer, target / PRELOAD_NAME)
        shipped[str(major)] = {"cuda": cuda_version(Path(home)), "sha256": _checksum(target / "libuvm.so")}
    if toolkits:
        write_tms_layout(out_dir, out_dir / f"cuda{max(toolkits)}" / PRELOAD_NAME)
    return shipped


def write_tms_layout(folder: Path, interposer: Path) -> None:
    """`folder` as slime's lookup expects torch_memory_saver's install: the interposer under the
    original's file names (copies: a wheel holds no links), and torch_memory_saver/__init__.py.
    The interposer reads no CUDA header value that differs between majors, so one serves both."""
    for name in TMS_PRELOAD_NAMES:
        if (folder / name).resolve() != interposer.resolve():
            shutil.copy2(interposer, folder / name)
    (folder / TMS_PACKAGE_FILE).parent.mkdir(parents=True, exist_ok=True)
    (folder / TMS_PACKAGE_FILE).write_text(TMS_PACKAGE_TEXT)


def torch_hook_standard(minor: str) -> str:
    """The C++ standard torch `minor`'s c10 headers need: C++20 from 2.14 on (std::strong_ordering,
    std::bit_width), C++17 before."""
    major, number = (int(part) for part in minor.split(".")[:2])
    return "-std=c++20" if (major, number) >= (2, 14) else "-std=c++17"


def compile_torch_blocks(cxx: str, include_dir: Path, lib_dir: Path, cxx11_abi: bool, standard: str,
                         cuda_include: Path, target: Path, timeout: float, watchdog: Watchdog | None = None,
                         rpath: bool = False) -> Path:
    """Compiles _torch_blocks.cpp against one torch's c10 headers and libraries (libc10,
    libc10_cuda, linked with -z defs: a symbol that torch lacks fails here). The hook finds them at
    load by soname, among the libraries torch already loaded; `rpath` adds lib_dir for a local build."""
    run([cxx, standard, "-O2", "-fPIC", "-shared", f"-D_GLIBCXX_USE_CXX11_ABI={int(cxx11_abi)}",
         "-isystem", str(include_dir), "-isystem", str(cuda_include), str(TORCH_BLOCKS_SOURCE), "-o", str(target),
         "-L", str(lib_dir), "-lc10_cuda", "-lc10", "-Wl,-z,defs", "-Wl,--as-needed",
         *([f"-Wl,-rpath,{lib_dir}"] if rpath else [])], timeout=timeout, watchdog=watchdog)
    return _produced(cxx, target)


def ship_torch_hooks(releases: dict, out_dir: Path, cuda_include: Path, timeout: float) -> dict:
    """The block hook, built once per torch release of `releases` ({minor: folder with include/, lib/
    and release.json, as scripts/torch_headers.py fetches them}) into `out_dir`/torch-<minor>/.
    Returns the manifest's "torch_hooks": {minor: {"release", "cxx11_abi", "sha256"}}."""
    import json
    cxx = compiler()
    hooks = {}
    for minor, folder in sorted(releases.items(), key=lambda item: tuple(map(int, item[0].split(".")))):
        release = json.loads((Path(folder) / "release.json").read_text())
        target = out_dir / f"torch-{minor}" / TORCH_HOOK
        target.parent.mkdir(parents=True, exist_ok=True)
        compile_torch_blocks(cxx, Path(folder) / "include", Path(folder) / "lib", release["cxx11_abi"],
                             torch_hook_standard(minor), cuda_include, target, timeout)
        hooks[minor] = {"release": release["release"], "cxx11_abi": release["cxx11_abi"], "sha256": _checksum(target)}
    return hooks


def write_manifest(out_dir: Path, root: Path, libraries: dict, torch_hooks: dict) -> None:
    """uvm/_prebuilt/manifest.json: the sources' digest, then what was built from them."""
    import json
    (out_dir / SHIPPED_MANIFEST).write_text(json.dumps(
        {"sources": sources_digest(root), "libraries": libraries, "torch_hooks": torch_hooks}, indent=1) + "\n")


def shipped_manifest() -> dict | None:
    """The installed package's manifest, if it has one and its sources are unchanged since."""
    import json
    try:
        manifest = json.loads((SHIPPED / SHIPPED_MANIFEST).read_text())
        if manifest["sources"] != sources_digest(source_root()):
            return None
        manifest["libraries"], manifest["torch_hooks"]  # noqa: B018 - both must be there
        return manifest
    except (OSError, ValueError, KeyError, TypeError, BuildError):
        return None


def shipped_majors() -> set[int]:
    """The CUDA majors the installed package carries a libuvm.so for."""
    manifest = shipped_manifest()
    return {int(major) for major in manifest["libraries"]} if manifest else set()


def shipped_library(major: int) -> Path | None:
    """The library the installed package shipped for CUDA `major`, if it is intact and built from
    the sources beside it; None otherwise (and the library is compiled)."""
    manifest = shipped_manifest()
    entry = manifest["libraries"].get(str(major)) if manifest else None
    library = SHIPPED / f"cuda{major}" / "libuvm.so"
    if entry is None or not library.is_file() or entry["sha256"] != _checksum(library):
        return None
    return library


def shipped_torch_hook(torch_version: str, cxx11_abi: bool) -> tuple[Path | None, str]:
    """The installed package's block hook for this torch ("2.11.0+cu130": its minor), and if there is
    none (or it does not fit), why not."""
    manifest = shipped_manifest()
    if manifest is None:
        return None, "this installation carries no prebuilt hooks (a source tree, or an edited package)"
    minor = ".".join(torch_version.split("+")[0].split(".")[:2])
    hooks = manifest["torch_hooks"]
    entry = hooks.get(minor)
    carried = ", ".join(sorted(hooks, key=lambda m: tuple(map(int, m.split("."))))) or "none"
    if entry is None:
        return None, f"this installation carries prebuilt hooks for torch {carried}, not {torch_version}"
    if bool(entry["cxx11_abi"]) != bool(cxx11_abi):
        return None, (f"its hook for torch {minor} was built for the {'cxx11' if entry['cxx11_abi'] else 'pre-cxx11'} "
                      f"C++ ABI, and this torch uses the other (_GLIBCXX_USE_CXX11_ABI={int(cxx11_abi)})")
    hook = SHIPPED / f"torch-{minor}" / TORCH_HOOK
    if not hook.is_file() or _checksum(hook) != entry["sha256"]:
        return None, f"its hook for torch {minor} ({hook}) is missing or damaged"
    return hook, ""


def build(timeout: float | None = None) -> Path:
    """Path to a built libuvm.so for the current sources: from the cache (a read-only one too), or
    compiled now."""
    prebuilt = os.environ.get("UVM_LIBRARY")
    if prebuilt:
        if not Path(prebuilt).is_file():
            raise BuildError(f"UVM_LIBRARY={prebuilt!r} does not exist")
        return Path(prebuilt)
    root, home, cxx = source_root(), cuda_home(), compiler()
    return _cached_build("libuvm.so", build_key(root, cxx, home), timeout,
                         lambda scratch, left, watchdog: compile_library(root, cxx, home, scratch, left, watchdog))


TORCH_BLOCKS_SOURCE = Path(__file__).resolve().with_name("_torch_blocks.cpp")


def build_torch_blocks(torch_dir: Path, cxx11_abi: bool, timeout: float | None = None) -> Path:
    """Path to the block hook (_torch_blocks.cpp) built against the torch installed at `torch_dir`
    (its include/ and lib/; `cxx11_abi`: torch's _GLIBCXX_USE_CXX11_ABI), from the cache or compiled
    now (about 2 s: torch's headers). For a torch the installation carries no hook for."""
    home, cxx = cuda_home(), compiler()
    version_file = torch_dir / "version.py"
    version_text = version_file.read_text() if version_file.is_file() else ""
    found = re.search(r"^__version__\s*(?::[^=]*)?=\s*['\"](\d+\.\d+)", version_text, re.MULTILINE)
    standard = torch_hook_standard(found.group(1)) if found else "-std=c++17"
    digest = hashlib.sha256()
    for part in (TORCH_BLOCKS_SOURCE.read_bytes(), str(torch_dir).encode(), str(int(cxx11_abi)).encode(),
                 version_text.encode(), standard.encode(),
                 (torch_dir / "include" / "c10" / "cuda" / "CUDACachingAllocator.h").read_bytes(),
                 _compiler_identity(cxx).encode(), cuda_version(home).encode()):
        digest.update(part)

    def compile_hook(scratch: Path, left: float, watchdog: Watchdog) -> Path:
        return compile_torch_blocks(cxx, torch_dir / "include", torch_dir / "lib", cxx11_abi, standard,
                                    home / "include", scratch / TORCH_HOOK, left, watchdog, rpath=True)

    return _cached_build(TORCH_HOOK, "torch-" + digest.hexdigest()[:24], timeout, compile_hook)


def _cached_build(name: str, key: str, timeout: float | None, compile) -> Path:
    """The library `name` built under `key`: from the cache, or made by `compile(scratch folder,
    seconds left, watchdog)` under the cache's lock, checksummed and renamed into place."""
    timeout = compile_timeout() if timeout is None else timeout
    deadline = time.monotonic() + timeout
    cached = configured_cache_dir() / key / name
    if _cached_library_is_valid(cached):
        return cached
    directory = writable_cache_dir(configured_cache_dir(), key)
    library = directory / key / name
    if _cached_library_is_valid(library):
        return library
    library.parent.mkdir(mode=0o700, exist_ok=True)
    with open(directory / f"{key}.lock", "w") as lock:
        _lock_within(lock, deadline - time.monotonic())
        if _cached_library_is_valid(library):  # another process built it while we waited
            return library
        for stale in library.parent.glob(".build-*"):  # left by a builder killed with its watchdog
            shutil.rmtree(stale, ignore_errors=True)
        with tempfile.TemporaryDirectory(dir=library.parent, prefix=".build-") as scratch:
            watchdog = Watchdog(Path(scratch))
            try:
                built = compile(Path(scratch), deadline - time.monotonic(), watchdog)
            except BuildTimeout as error:
                raise BuildTimeout(f"building {name} did not finish within {timeout:g} s: {error}") from None
            finally:
                watchdog.close()
            checksum = _checksum(built)
            os.replace(built, library)
            library.with_suffix(".sha256").write_text(checksum + "\n")
        with open(directory / "builds.log", "a") as log:  # one line per real build, for tests
            log.write(f"{key} {os.getpid()} {time.time():.3f}\n")
    return library


def _lock_within(lock_file, timeout: float) -> None:
    """flock with a deadline (flock itself has none)."""
    deadline = time.monotonic() + timeout
    while True:
        try:
            fcntl.flock(lock_file, fcntl.LOCK_EX | fcntl.LOCK_NB)
            return
        except BlockingIOError:
            if time.monotonic() > deadline:
                raise BuildTimeout(f"waited {timeout:g} s for another process building uvm "
                                   f"(lock {lock_file.name})") from None
            time.sleep(0.02)
