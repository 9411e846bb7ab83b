"""Carries the C++ sources (sources.txt and the folders it names, with include/) inside the package
as uvm/_csrc, and compiles libuvm.so from them into uvm/_prebuilt, so that `import uvm` in an
installed package loads a library without a compiler (the JIT build stays for source trees, and
for an installed package whose shipped library does not match: uvm/_build.py, shipped_library).
Without a CUDA toolkit or a compiler here, the package ships the sources alone and compiles on
first use, saying so; UVM_REQUIRE_PREBUILT=1 makes that an error. Also carries the benchmarks, so
that `python -m uvm bench` works there too."""
import os
import shutil
import sys
from pathlib import Path

from setuptools import setup
from setuptools.command.bdist_wheel import bdist_wheel
from setuptools.command.build_py import build_py
from setuptools.dist import Distribution

HERE = Path(__file__).resolve().parent


class BuildWithSources(build_py):
    def run(self):
        super().run()
        package = Path(self.build_lib).resolve() / "uvm"
        target = package / "_csrc"
        listing = HERE.parent / "sources.txt"
        if not listing.is_file():
            raise SystemExit(f"uvm: {listing} is missing; build from a uvm checkout")
        target.mkdir(parents=True, exist_ok=True)
        shutil.copy2(listing, target / listing.name)
        for directory in sorted(_listed_folders(listing) | {"include"}):
            shutil.copytree(HERE.parent / directory, target / directory, dirs_exist_ok=True)
        (target / "bench").mkdir(parents=True, exist_ok=True)
        for script in ("offload_bench.py", "rl_bench.py", "bench_all.py", "stream_bench.py"):
            shutil.copy2(HERE.parent / "bench" / script, target / "bench" / script)
        _ship_library(package)


def _ship_library(package: Path) -> None:
    """libuvm.so compiled from the package's own copy of the sources (the digest it records is of
    what ships), by the same code as the JIT build."""
    sys.path.insert(0, str(package.parent))
    try:
        from uvm import _build, _errors
        try:
            _build.cuda_home(), _build.compiler()
        except _errors.BuildError as error:  # nothing to build with here: the sources alone ship
            if os.environ.get("UVM_REQUIRE_PREBUILT") == "1":
                raise SystemExit(f"uvm: cannot build libuvm.so (UVM_REQUIRE_PREBUILT=1): {error}") from None
            print(f"uvm: WARNING: libuvm.so not built at install time ({error}); it will be compiled on "
                  "first use", file=sys.stderr)
            return
        try:
            built = _build.ship_library(package / "_csrc", package / "_prebuilt", timeout=1800)
        except _errors.BuildError as error:  # a real failure: never ship a package that would hide it
            raise SystemExit(f"uvm: building libuvm.so failed: {error}") from None
        print(f"uvm: built {built}")
    finally:
        sys.path.remove(str(package.parent))
        for name in [name for name in sys.modules if name == "uvm" or name.startswith("uvm.")]:
            del sys.modules[name]


class NativeDistribution(Distribution):
    def has_ext_modules(self):
        return True  # a platform wheel: it carries a compiled library


class PlatformWheel(bdist_wheel):
    def get_tag(self):
        _, _, platform = super().get_tag()
        return "py3", "none", platform  # any Python 3: the library is loaded with ctypes, not imported


def _listed_folders(listing: Path) -> set:
    """The top-level folders of the sources sources.txt lists (libuvm's, and the interposer's on
    `preload` lines)."""
    lines = (line.strip() for line in listing.read_text().splitlines())
    return {line.split()[-1].split("/")[0] for line in lines if line.endswith(".cpp")}


setup(cmdclass={"build_py": BuildWithSources, "bdist_wheel": PlatformWheel}, distclass=NativeDistribution)
