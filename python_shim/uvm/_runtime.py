"""The CUDA runtime this process uses, found the way pip's torch finds it: no CUDA_HOME, no toolkit.

libuvm.so links the runtime by soname (libcudart.so.12 or .13); the wheel carries one build per
CUDA major, and the one loaded must match the runtime the process runs, or the process would hold
two runtimes. In order:
1. a runtime the process already mapped (torch imported first: its own);
2. UVM_CUDA_RUNTIME, a libcudart.so.<major> file, when set;
3. torch's, when torch is installed but not imported: its CUDA major is read from torch/version.py
   without importing torch, and its runtime is the one NVIDIA's wheels put in site-packages
   (nvidia/cuda_runtime/lib for CUDA 12, nvidia/cu13/lib for 13);
4. any NVIDIA runtime wheel on sys.path, in sys.path's order;
5. the system's: LD_LIBRARY_PATH and the distribution's library folders, then a toolkit's
   lib64 ($CUDA_HOME, $CUDA_PATH, /usr/local/cuda).
Opening the chosen file before libuvm.so makes libuvm's DT_NEEDED name resolve to it.
"""
from __future__ import annotations

import ctypes
import glob
import importlib.util
import os
import re
import sys
from dataclasses import dataclass
from pathlib import Path

from ._errors import UnifiedMemoryUnsupportedError

MAJORS = (13, 12)  # the majors a wheel carries a build for, newest first


@dataclass(frozen=True)
class Runtime:
    path: str       # the libcudart file
    major: int      # its soname's major
    found_by: str   # which rule found it, for messages and `uvm doctor`


def mapped() -> Runtime | None:
    """The CUDA runtime this process has already loaded, if any."""
    try:
        with open("/proc/self/maps") as maps:
            for line in maps:
                path = line.split(None, 5)[-1].strip()
                major = _soname_major(path)
                if major is not None and os.path.isfile(path):
                    return Runtime(path, major, "already loaded in this process")
    except OSError:
        pass
    return None


def _soname_major(path: str) -> int | None:
    match = re.search(r"/libcudart\.so\.(\d+)(?:\.[\d.]*)?$", path)
    return int(match.group(1)) if match else None


def torch_cuda_major() -> int | None:
    """The CUDA major the installed torch was built for (torch/version.py's `cuda`), read without
    importing torch; None without torch or for a CPU build."""
    spec = importlib.util.find_spec("torch") if "torch" not in sys.modules else None
    torch = sys.modules.get("torch")
    if torch is not None:
        version = getattr(getattr(torch, "version", None), "cuda", None)
        return int(version.split(".")[0]) if version else None
    if spec is None or not spec.submodule_search_locations:
        return None
    for location in spec.submodule_search_locations:
        try:
            text = (Path(location) / "version.py").read_text()
        except OSError:
            continue
        match = re.search(r"^cuda\s*(?::[^=]*)?=\s*['\"](\d+)\.", text, re.MULTILINE)
        return int(match.group(1)) if match else None
    return None


def wheel_runtimes(paths: list[str] | None = None) -> list[Runtime]:
    """The runtimes NVIDIA's pip wheels installed on sys.path, in sys.path's order (PYTHONPATH's
    first, as for any import), one per major."""
    found: dict[int, Runtime] = {}
    for entry in paths if paths is not None else sys.path:
        for candidate in sorted(glob.glob(os.path.join(entry or ".", "nvidia", "*", "lib", "libcudart.so.*"))):
            major = _soname_major(candidate)
            if major is not None and major not in found:
                found[major] = Runtime(os.path.realpath(candidate), major, f"NVIDIA's wheel in {entry}")
    return list(found.values())


def system_runtimes() -> list[Runtime]:
    """Runtimes in the directories the dynamic loader searches (LD_LIBRARY_PATH, the distribution's
    library folders) and a toolkit's lib64, found by file name: opening one to see would load it."""
    folders = [(entry, "LD_LIBRARY_PATH") for entry in os.environ.get("LD_LIBRARY_PATH", "").split(":") if entry]
    folders += [(entry, "the system's libraries") for entry in ("/usr/lib/x86_64-linux-gnu", "/usr/lib64", "/usr/lib")]
    for home in filter(None, [os.environ.get("CUDA_HOME"), os.environ.get("CUDA_PATH"), "/usr/local/cuda"]):
        folders.append((os.path.join(home, "lib64"), f"the CUDA toolkit in {home}"))
    found: dict[int, Runtime] = {}
    for folder, label in folders:
        for library in sorted(glob.glob(os.path.join(folder, "libcudart.so.*"))):
            major = _soname_major(library)
            if major is not None and major not in found:
                found[major] = Runtime(os.path.realpath(library), major, label)
    return [found[major] for major in sorted(found, reverse=True)]


def check_supported_major() -> None:
    """Raises UnifiedMemoryUnsupportedError, saying what to install, when this process uses (or its
    torch was built for) a CUDA major uvm has no build for: loading or compiling uvm beside it would
    bring a second runtime into the process, and fail later with a message about that."""
    loaded = mapped()
    major, source = (loaded.major, f"the CUDA runtime this process loaded ({loaded.path})") if loaded else (
        torch_cuda_major(), "the CUDA runtime the installed torch was built for")
    if major is None or major in MAJORS:
        return
    raise UnifiedMemoryUnsupportedError(
        f"this process uses CUDA {major}: {source}; uvm supports CUDA "
        f"{' and '.join(map(str, sorted(MAJORS)))} only: install a torch built for CUDA 12 or 13 (the wheels on "
        "PyPI, or PyTorch's cu12x/cu13x indexes), or run without torch beside a CUDA 12 or 13 runtime")


def choose(available_majors: set[int]) -> Runtime | None:
    """The runtime libuvm.so must be loaded beside, among builds for `available_majors` (None: none
    found). A runtime already mapped is the answer even if no build matches it (the caller says so)."""
    loaded = mapped()
    if loaded is not None:
        return loaded
    chosen = os.environ.get("UVM_CUDA_RUNTIME")
    if chosen:
        major = _soname_major(os.path.realpath(chosen)) or _soname_major(chosen)
        if major is None or not os.path.isfile(chosen):
            raise UnifiedMemoryUnsupportedError(f"UVM_CUDA_RUNTIME={chosen!r} is not a libcudart.so.<major> file")
        return Runtime(os.path.realpath(chosen), major, "UVM_CUDA_RUNTIME")
    wheels = wheel_runtimes()
    wanted = torch_cuda_major()
    if wanted is not None:
        for runtime in wheels + system_runtimes():
            if runtime.major == wanted:
                return Runtime(runtime.path, runtime.major, f"torch's CUDA {wanted} runtime ({runtime.found_by})")
    for runtime in wheels + system_runtimes():
        if runtime.major in available_majors:
            return runtime
    return None


def load(runtime: Runtime) -> None:
    """Opens the runtime's file, so that libuvm.so's libcudart.so.N resolves to it."""
    ctypes.CDLL(runtime.path, mode=ctypes.RTLD_GLOBAL)


def version(runtime_path: str) -> int:
    """cudaRuntimeGetVersion of the runtime at `runtime_path` (e.g. 13020), 0 if it cannot say."""
    try:
        library = ctypes.CDLL(runtime_path)
        number = ctypes.c_int()
        return number.value if library.cudaRuntimeGetVersion(ctypes.byref(number)) == 0 else 0
    except (OSError, AttributeError):
        return 0


def all_mapped() -> dict[int, set[str]]:
    """Every CUDA runtime file this process has mapped, by major."""
    found: dict[int, set[str]] = {}
    try:
        with open("/proc/self/maps") as maps:
            for line in maps:
                path = line.split(None, 5)[-1].strip()
                major = _soname_major(path)
                if major is not None:
                    found.setdefault(major, set()).add(path)
    except OSError:
        pass
    return found


def check_one_runtime(library: str) -> None:
    """After `library` (a libuvm.so) was loaded: the process holds one CUDA runtime major, or the
    library and torch would each talk to another runtime (two sets of streams and events that
    cannot be mixed). Raises UnifiedMemoryUnsupportedError naming them otherwise."""
    found = all_mapped()
    if len(found) > 1:
        listed = "; ".join(f"CUDA {major}: {', '.join(sorted(paths))}" for major, paths in sorted(found.items()))
        raise UnifiedMemoryUnsupportedError(f"{library} brought a second CUDA runtime into this process ({listed}): load the "
                           "libuvm.so built for the runtime torch uses (uvm picks it when it can see that runtime)")
