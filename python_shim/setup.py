"""Carries the C++ sources (sources.txt and the folders it names, with include/) inside the package
as uvm/_csrc, so that an installed uvm compiles the same library as the checkout, and the
benchmarks, so that `python -m uvm bench` works there too."""
import shutil
from pathlib import Path

from setuptools import setup
from setuptools.command.build_py import build_py

HERE = Path(__file__).resolve().parent


class BuildWithSources(build_py):
    def run(self):
        super().run()
        target = Path(self.build_lib) / "uvm" / "_csrc"
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


def _listed_folders(listing: Path) -> set:
    """The top-level folders of the sources sources.txt lists."""
    lines = (line.strip() for line in listing.read_text().splitlines())
    return {line.split("/")[0] for line in lines if line.endswith(".cpp")}


setup(cmdclass={"build_py": BuildWithSources})
