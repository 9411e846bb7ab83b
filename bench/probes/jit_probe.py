"""What a cold JIT build of libuvm spends its time on, on this machine (issue 29): the compiler's own
start, the shared headers, each unity unit compiled alone and all of them at once, the link, and the
whole build through uvm._build; then variants of the units (fewer of them, -O1, -pipe), each
timed as the build runs them, taking turns. Prints a table and writes JSON to $OUT/jit_probe.json.

    PYTHONPATH=python_shim python3 bench/probes/jit_probe.py [--rounds 3]
"""
import argparse
import concurrent.futures
import json
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "python_shim"))
from uvm import _build as b  # noqa: E402

SHARED_HEADERS = "#include <cuda_runtime_api.h>\n#include <map>\n#include <mutex>\n#include <string>\n#include <vector>\n"


def wall(command: list[str]) -> float:
    start = time.perf_counter()
    subprocess.run(command, check=True, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    return time.perf_counter() - start


class Units:
    """The build's unity units in `scratch`, compiled as the build does, with `flags` changed."""

    def __init__(self, scratch: Path, jobs: int):
        self.root, self.home, self.cxx = b.source_root(), b.cuda_home(), b.compiler()
        self.listed = b.SourceList(self.root)
        self.include = ["-I", str(self.root / "include"), "-isystem", str(self.home / "include")]
        self.scratch = scratch
        self.groups = b.unity_groups(self.listed.sources, jobs)
        self.units = []
        for index, group in enumerate(self.groups):
            unit = scratch / f"unity_{index}.cpp"
            unit.write_text("".join(f'#include "{source}"\n' for source in group))
            self.units.append(unit)

    def command(self, unit: Path, flags: list[str]) -> list[str]:
        return [self.cxx, *flags, *self.include, "-c", str(unit), "-o", str(unit.with_suffix(".o"))]

    def each_alone(self, flags: list[str]) -> list[float]:
        return [wall(self.command(unit, flags)) for unit in self.units]

    def all_at_once(self, flags: list[str]) -> tuple[float, list[float]]:
        start = time.perf_counter()
        with concurrent.futures.ThreadPoolExecutor(max_workers=len(self.units)) as pool:
            walls = list(pool.map(lambda unit: wall(self.command(unit, flags)), self.units))
        return time.perf_counter() - start, walls

    def link(self) -> float:
        return wall([self.cxx, "-shared", "-o", str(self.scratch / "libuvm.so"),
                     *[str(unit.with_suffix(".o")) for unit in self.units],
                     f"-Wl,--version-script={self.root / 'alloc' / 'exports.map'}",
                     "-L", str(b.cudart_dir(self.home)), "-lcudart"])


def cold_build() -> float:
    """uvm._build.build() from an empty cache, in a fresh process (as bench/jit_bench.py times it)."""
    with tempfile.TemporaryDirectory() as cache:
        code = "import time, uvm._build as b\nt = time.perf_counter(); b.build(); print(time.perf_counter() - t)"
        env = {**os.environ, "UVM_CACHE_DIR": cache, "PYTHONPATH": str(ROOT / "python_shim")}
        out = subprocess.run([sys.executable, "-c", code], env=env, check=True, capture_output=True, text=True)
        return float(out.stdout.split()[-1])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    cpus = b.usable_cpus()
    result = {"machine": platform.node(), "cpus": cpus, "cpu": platform.processor() or platform.machine(),
              "compiler": subprocess.run([b.compiler(), "--version"], capture_output=True, text=True).stdout.split("\n")[0]}
    with tempfile.TemporaryDirectory() as scratch_dir:
        scratch = Path(scratch_dir)
        units = Units(scratch, cpus)
        flags = units.listed.flags
        empty = scratch / "empty.cpp"
        empty.write_text("int uvm_probe;\n")
        headers = scratch / "headers.cpp"
        headers.write_text(SHARED_HEADERS)
        result["compiler_start_s"] = min(wall(units.command(empty, flags)) for _ in range(3))
        result["shared_headers_s"] = min(wall(units.command(headers, flags)) for _ in range(3))
        result["units"] = [[str(s.relative_to(units.root)) for s in group] for group in units.groups]
        result["each_unit_alone_s"] = units.each_alone(flags)
        variants = {"as built": flags, "-O1": [f for f in flags if f != "-O2"] + ["-O1"], "-pipe": flags + ["-pipe"]}
        half = Units(Path(tempfile.mkdtemp(dir=scratch)), max(cpus // 2, 1))
        rows = {name: [] for name in [*variants, f"{len(half.units)} units", "link", "build()"]}
        per_unit_at_once = []
        for _ in range(args.rounds):  # the ways take turns, so that drift hits them all
            for name, variant in variants.items():
                elapsed, walls = units.all_at_once(variant)
                rows[name].append(elapsed)
                if name == "as built":
                    per_unit_at_once.append(walls)
            rows[f"{len(half.units)} units"].append(half.all_at_once(flags)[0])
            rows["link"].append(units.link())
            rows["build()"].append(cold_build())
        result["all_units_at_once_s"] = rows
        result["each_unit_at_once_s"] = per_unit_at_once
    print(f"{result['cpus']} CPUs ({result['cpu']}), {result['compiler']}")
    print(f"compiler start {result['compiler_start_s']:.3f} s; shared headers {result['shared_headers_s']:.3f} s")
    alone = result["each_unit_alone_s"]
    print(f"{len(alone)} units, each alone: {min(alone):.2f}-{max(alone):.2f} s (sum {sum(alone):.1f} s)")
    slowest = [max(walls) for walls in per_unit_at_once]
    print(f"the slowest unit while all run at once: {', '.join(f'{s:.2f}' for s in slowest)} s")
    for name, values in rows.items():
        print(f"  {name:12s} median {statistics.median(values):.2f} s  ({', '.join(f'{v:.2f}' for v in values)})")
    out = Path(os.environ.get("OUT", ROOT / "bench-out"))
    out.mkdir(parents=True, exist_ok=True)
    (out / "jit_probe.json").write_text(json.dumps(result, indent=1))


if __name__ == "__main__":
    main()
