"""Builds the uvm-cuda wheel: the Python package (python_shim/uvm) with everything compiled in, so
that users need no compiler, no CUDA toolkit and no CUDA_HOME (docs/design.md, "The wheel").

Into uvm/ go:
- _csrc/: the C++ sources (sources.txt and the folders it names, with include/), for a library
  compiled on the user's machine when the shipped ones do not fit, and the benchmarks;
- _prebuilt/cuda<major>/: libuvm.so and its cudaMalloc interposer, once per CUDA major, each against
  that major's oldest supported runtime headers, with the C++ runtime linked in;
- _prebuilt/torch-<minor>/: the PyTorch block hook, once per supported torch release, against that
  release's c10 headers and libraries (scripts/torch_headers.py fetches them: 3 MB of each wheel);
- _prebuilt/manifest.json: what was built from which sources.
And uvm_switch.pth and uvm_switch.py, beside the package: the switch that moves stacks onto uvm.

A build that cannot make all of that fails and says what is missing. The toolkits: the one here
($CUDA_HOME, $CUDA_PATH, /usr/local/cuda) for its major, UVM_WHEEL_CUDA12 / UVM_WHEEL_CUDA13 (a
toolkit layout with include/ and lib64/libcudart.so) for either, else .deps/cuda-12.1 beside the
sources (scripts/fetch_cuda12.sh). The torch headers: UVM_TORCH_HEADERS_DIR, else .deps/torch beside
the sources, else ~/.cache/uvm/torch-headers, fetched there when missing.
UVM_WHEEL_PARTIAL=1 builds what can be built, prints plainly what it left out, and labels the version
+partial (uvm_cuda-X.Y.Z+partial-...whl).
"""
import json
import os
import platform
import re
import shutil
import sys
from pathlib import Path

from setuptools import setup
from setuptools.command.bdist_wheel import bdist_wheel
from setuptools.command.build_py import build_py
from setuptools.dist import Distribution

HERE = Path(__file__).resolve().parent
BENCHMARKS = ("offload_bench.py", "rl_bench.py", "bench_all.py", "stream_bench.py", "vllm_bench.py")
TIMEOUT_S = 1800


def version() -> str:
    """The release, from include/uvm.h's UVM_VERSION_MAJOR/MINOR/PATCH: the one place it is written.
    UVM_WHEEL_PARTIAL=1 adds the local label +partial: a wheel that may lack its libraries is never
    mistaken for the release (and the package index refuses local labels)."""
    header = (HERE / "include" / "uvm.h").read_text()
    parts = [re.search(rf"#define UVM_VERSION_{part} (\d+)", header) for part in ("MAJOR", "MINOR", "PATCH")]
    if not all(parts):
        raise SystemExit(f"uvm: {HERE / 'include' / 'uvm.h'} lacks a UVM_VERSION_* number")
    release = ".".join(part.group(1) for part in parts)
    return release + "+partial" if os.environ.get("UVM_WHEEL_PARTIAL") == "1" else release


class BuildWithLibraries(build_py):
    def run(self):
        super().run()
        build_lib = Path(self.build_lib).resolve()
        package = build_lib / "uvm"
        _copy_sources(package / "_csrc")
        shutil.copy2(HERE / "python_shim" / "uvm_switch.pth", build_lib / "uvm_switch.pth")
        _build_everything(package)


def _copy_sources(target: Path) -> None:
    listing = HERE / "sources.txt"
    if not listing.is_file():
        raise SystemExit(f"uvm: {listing} is missing; build from a uvm checkout or its sdist")
    target.mkdir(parents=True, exist_ok=True)
    shutil.copy2(listing, target / listing.name)
    for directory in sorted(_listed_folders(listing) | {"include"}):
        shutil.copytree(HERE / directory, target / directory, dirs_exist_ok=True)
    (target / "bench").mkdir(parents=True, exist_ok=True)
    for script in BENCHMARKS:
        shutil.copy2(HERE / "bench" / script, target / "bench" / script)


def _listed_folders(listing: Path) -> set:
    """The top-level folders of the sources sources.txt lists (libuvm's, and the interposer's on
    `preload` lines)."""
    lines = (line.strip() for line in listing.read_text().splitlines())
    return {line.split()[-1].split("/")[0] for line in lines if line.endswith(".cpp")}


def _build_everything(package: Path) -> None:
    """Compiles into package/_prebuilt with the package's own _build.py (the code the JIT uses)."""
    partial = os.environ.get("UVM_WHEEL_PARTIAL") == "1"
    sys.path.insert(0, str(package.parent))
    try:
        from uvm import _build, _errors
        left_out = []
        try:
            cxx = _build.compiler()
        except _errors.BuildError as error:
            _fail_or_note(partial, left_out, f"no C++ compiler: {error}")
            cxx = None
        toolkits = _toolkits(_build, _errors, left_out, partial) if cxx else {}
        # The torch headers first: a build with no network says so before it compiles for a minute.
        headers = _torch_headers(left_out, partial) if toolkits else {}
        out = package / "_prebuilt"
        out.mkdir(parents=True, exist_ok=True)
        try:
            libraries = _build.ship_libraries(package / "_csrc", out, toolkits, TIMEOUT_S) if toolkits else {}
            hooks = _build.ship_torch_hooks(headers, out, Path(toolkits[max(toolkits)]) / "include",
                                            TIMEOUT_S) if headers else {}
        except _errors.BuildError as error:  # a real failure: never ship a package that would hide it
            raise SystemExit(f"uvm: building the wheel's libraries failed: {error}") from None
        if not libraries:
            shutil.rmtree(out)  # nothing shipped: the library is compiled at first use
        else:
            _build.write_manifest(out, package / "_csrc", libraries, hooks)
        majors = ", ".join(f"CUDA {entry['cuda']}" for entry in libraries.values()) or "none"
        print(f"uvm: built libuvm.so for {majors}; block hooks for torch {', '.join(hooks) or 'none'}")
        for note in left_out:
            print(f"uvm: WARNING: left out of this wheel: {note}", file=sys.stderr)
    finally:
        sys.path.remove(str(package.parent))
        for name in [name for name in sys.modules if name == "uvm" or name.startswith("uvm.")]:
            del sys.modules[name]


def _fail_or_note(partial: bool, left_out: list, problem: str) -> None:
    if not partial:
        raise SystemExit(f"uvm: cannot build the wheel: {problem}. Fix that, or set UVM_WHEEL_PARTIAL=1 "
                         "to build a wheel without it (it then says what it left out)")
    left_out.append(problem)


def _toolkits(_build, _errors, left_out: list, partial: bool) -> dict:
    """{CUDA major: toolkit} for every major the wheel carries a libuvm.so for (12 and 13)."""
    found = {}
    for major in (12, 13):
        chosen = os.environ.get(f"UVM_WHEEL_CUDA{major}")
        if chosen:
            found[major] = Path(chosen)
    try:
        here = _build.cuda_home()
        found.setdefault(int(_build.cuda_version(here)) // 1000, here)
    except _errors.BuildError:
        pass
    # CUDA 12's oldest supported headers: a library built against them loads with any 12.x runtime.
    found.setdefault(12, HERE / ".deps" / "cuda-12.1")
    for major in (12, 13):
        home = found.get(major)
        if home is None or not (Path(home) / "include" / "cuda_runtime_api.h").is_file():
            _fail_or_note(partial, left_out, f"no CUDA {major} toolkit ({home or 'none found'}; set UVM_WHEEL_CUDA{major} "
                          "to one (a folder with include/ and lib64/libcudart.so), or for CUDA 12's headers run "
                          "`bash scripts/fetch_cuda12.sh` (in the checkout and the sdist; it needs the package index)")
            found.pop(major, None)
        elif str(_build.cuda_version(Path(home)))[:2] != str(major):
            raise SystemExit(f"uvm: the toolkit for CUDA {major} at {home} is CUDA {_build.cuda_version(Path(home))}")
    return found


def _torch_headers(left_out: list, partial: bool) -> dict:
    """{torch minor: folder of its c10 headers and libraries} for every supported release, fetched
    where missing (scripts/torch_headers.py)."""
    sys.path.insert(0, str(HERE / "scripts"))
    try:
        import torch_headers
        dest = Path(os.environ.get("UVM_TORCH_HEADERS_DIR") or (HERE / ".deps" / "torch" if (HERE / ".git").exists()
                    else Path.home() / ".cache" / "uvm" / "torch-headers"))
        releases = {}
        for minor in torch_headers.SUPPORTED:
            try:
                releases[minor] = torch_headers.fetch(minor, dest)
            except torch_headers.FetchError as error:
                _fail_or_note(partial, left_out, f"the block hook for torch {minor} ({error})")
    finally:
        sys.path.remove(str(HERE / "scripts"))
    return releases


class NativeDistribution(Distribution):
    def has_ext_modules(self):
        return True  # a platform wheel: it carries compiled libraries


class PlatformWheel(bdist_wheel):
    def get_tag(self):
        return "py3", "none", _manylinux_tag(Path(self.bdist_dir))  # libraries loaded by ctypes, any Python 3


def _manylinux_tag(tree: Path) -> str:
    """manylinux_<glibc>_<arch>, from the newest GLIBC_x.y symbol version the shipped libraries need
    (as auditwheel reads it): the wheel installs where that glibc is."""
    newest = (2, 17)
    for library in tree.rglob("*.so"):  # the versions a library needs are strings of its .dynstr
        for major, minor in re.findall(rb"GLIBC_(\d+)\.(\d+)", library.read_bytes()):
            newest = max(newest, (int(major), int(minor)))
    return f"manylinux_{newest[0]}_{newest[1]}_{platform.machine()}"


setup(version=version(), cmdclass={"build_py": BuildWithLibraries, "bdist_wheel": PlatformWheel},
      distclass=NativeDistribution, options={"build": {"build_base": ".build-wheel"}})
