"""Carries the C++ sources (alloc/, hints/, include/) inside the package as uvm/_csrc, so that an
installed uvm compiles the same library as the checkout, and the offload benchmark, so that
`python -m uvm bench` works there too."""
import shutil
from pathlib import Path

from setuptools import setup
from setuptools.command.build_py import build_py

HERE = Path(__file__).resolve().parent


class BuildWithSources(build_py):
    def run(self):
        super().run()
        target = Path(self.build_lib) / "uvm" / "_csrc"
        for directory in ("alloc", "hints", "include"):
            source = HERE.parent / directory
            if not source.is_dir():
                raise SystemExit(f"uvm: {source} is missing; build from a uvm checkout")
            shutil.copytree(source, target / directory, dirs_exist_ok=True)
        (target / "bench").mkdir(parents=True, exist_ok=True)
        for script in ("offload_bench.py", "rl_bench.py"):
            shutil.copy2(HERE.parent / "bench" / script, target / "bench" / script)


setup(cmdclass={"build_py": BuildWithSources})
