"""Every row of both benchmarks in one run (`python -m uvm bench all`): the offload bench (steady,
first-offload, small-tensor, pool and no-claim rows) into OUT/offload, then the RL cycle bench
(full-GPU and big-free cycles, first cycles, torch_memory_saver where installed) into OUT/rl, each
in a process of its own (the RL bench fills the GPU, which must hold nothing of the offload
bench's). --quick: the 4 GiB model only, and 2 measured cycles each. Exit status: the first
failure's, else 0."""
from __future__ import annotations

import argparse
import os
import pathlib
import subprocess
import sys


def commands(out: str, quick: bool) -> list[list[str]]:
    """The two benchmarks, as arguments to `python -m uvm bench`."""
    offload = ["--sizes-mib", "4096", "--cycles", "2"] if quick else []
    rl = ["rl", "--cycles", "2"] if quick else ["rl"]
    return [offload + ["--out", os.path.join(out, "offload")], rl + ["--out", os.path.join(out, "rl")]]


def main(argv: list[str]) -> int:
    import uvm
    parser = argparse.ArgumentParser(prog="python -m uvm bench all", description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="the 4 GiB model only, 2 measured cycles each")
    parser.add_argument("--out", default=os.environ.get("OUT", "bench-out"))
    args = parser.parse_args(argv)
    env = dict(os.environ)  # the children import this same uvm
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(pathlib.Path(uvm.__file__).resolve().parents[1]),
                                                       env.get("PYTHONPATH")]))
    status = 0
    for command in commands(args.out, args.quick):
        print(f"== python -m uvm bench {' '.join(command)}", flush=True)
        code = subprocess.call([sys.executable, "-m", "uvm", "bench", *command], env=env)
        status = status or code
    return status


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
