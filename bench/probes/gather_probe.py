"""Where the shim's time goes when it finds a module's tensor ranges (issue 15, small tensors).

Times, for a module of N small CUDA parameters (plain torch memory: only attributes are read), each
step the shim takes per tensor and each way of building the ctypes range array, the best of several
rounds; with --before DIR (an older tree, e.g. from `git archive`) also that tree's whole shim path,
alternating with this one's. Run on a GPU machine:
python3 bench/probes/gather_probe.py [N] [--before DIR] [--json FILE]
"""
import argparse
import array
import importlib.util
import json
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "python_shim"))
import uvm.torch  # noqa: E402
from uvm import _lib  # noqa: E402

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # bench/
from offload_bench import ranges_by_device  # noqa: E402  (the shim's gather, as a move runs it)


def best_ms(fn, rounds: int = 7) -> float:
    times = []
    for _ in range(rounds):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return min(times) * 1e3


def load_shim(tree: str, name: str):
    """The uvm.torch module of another tree's shim, imported as package `name` beside this one."""
    package = Path(tree) / "python_shim" / "uvm"
    spec = importlib.util.spec_from_file_location(name, package / "__init__.py",
                                                  submodule_search_locations=[str(package)])
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)
    return importlib.import_module(f"{name}.torch")


def shim_path(shim, model):
    """What a move by tensors does in Python before its C call: find the ranges, build the arrays."""
    for named in ranges_by_device(shim, model).values():
        spans = list(named)
        if hasattr(shim, "_range_array"):
            shim._range_array(spans)
        else:
            (_lib.Range * len(spans))(*[_lib.Range(p, s) for p, s in spans])
        sum(asked for _, asked in named.values())


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("count", type=int, nargs="?", default=4096)
    parser.add_argument("--before", help="an older tree whose shim path to time alongside")
    parser.add_argument("--pool-mib", type=int, default=0,
                        help="also time finding a uvm pool's segments, the pool holding this many MiB "
                             "as 512 KiB tensors (managed memory: keep it under 25%% of the card)")
    parser.add_argument("--json")
    args = parser.parse_args()
    model = torch.nn.ParameterList(torch.nn.Parameter(torch.zeros(2048, device="cuda", dtype=torch.bfloat16))
                                   for _ in range(args.count))
    tensors = list(model.parameters())
    # Before any storage object is kept: each call then makes (and drops) a Python storage object.
    fresh_storage_ms = round(best_ms(lambda: [t.untyped_storage().nbytes() for t in tensors]), 3)
    storages = [t.untyped_storage() for t in tensors]
    spans = [(t.data_ptr(), t.nbytes) for t in tensors]

    def walk_modules():
        return [t for m in model.modules() for t in m._parameters.values() if t is not None]

    def ctypes_ranges():
        return (_lib.Range * len(spans))(*[_lib.Range(p, s) for p, s in spans])

    def array_ranges():
        flat = array.array("Q", [x for span in spans for x in span])
        return (_lib.Range * len(spans)).from_buffer(flat), flat

    steps = {
        "named_parameters()": lambda: list(model.named_parameters()),
        "parameters()": lambda: list(model.parameters()),
        "modules() + _parameters": walk_modules,
        "is_cuda": lambda: [t.is_cuda for t in tensors],
        "is_contiguous()": lambda: [t.is_contiguous() for t in tensors],
        "nbytes": lambda: [t.nbytes for t in tensors],
        "data_ptr()": lambda: [t.data_ptr() for t in tensors],
        "storage_offset()": lambda: [t.storage_offset() for t in tensors],
        "untyped_storage()": lambda: [t.untyped_storage() for t in tensors],
        "storage.data_ptr()": lambda: [s.data_ptr() for s in storages],
        "storage.nbytes()": lambda: [s.nbytes() for s in storages],
        "get_device()": lambda: [t.get_device() for t in tensors],
        "device.index": lambda: [t.device.index for t in tensors],
        "Range array, ctypes objects": ctypes_ranges,
        "Range array, array.array": array_ranges,
    }
    rows = {name: round(best_ms(fn), 3) for name, fn in steps.items()}
    rows["untyped_storage().nbytes(), no storage object kept"] = fresh_storage_ms
    del storages  # what follows meets storages as a move does: none kept
    rows["_add_move_spans (all)"] = round(best_ms(lambda: uvm.torch._add_move_spans(tensors, ["x"] * len(tensors), {})), 3)
    rows["_ranges_by_device (whole)"] = round(best_ms(lambda: ranges_by_device(uvm.torch, model)), 3)
    shims = {"this tree": uvm.torch}
    if args.before:
        shims["before"] = load_shim(args.before, "uvm_before")
    for round_ in (1, 2):
        for label, shim in shims.items():
            rows[f"shim path, {label}, round {round_}"] = round(best_ms(lambda: shim_path(shim, model)), 3)
    if args.pool_mib:
        pool = uvm.create_unified_mempool()
        with torch.cuda.use_mem_pool(pool):
            held = [torch.empty(512 << 10, dtype=torch.uint8, device="cuda") for _ in range(args.pool_mib * 2)]
        segments = len(pool.snapshot())
        pool_steps = {
            f"pool.snapshot(), {segments} segments": pool.snapshot,
            "torch.cuda.memory_snapshot(pool.id)": lambda: torch.cuda.memory.memory_snapshot(pool.id),
            "_ranges_by_device(pool)": lambda: ranges_by_device(uvm.torch, pool),
            f"_ranges_by_device(tensors of the pool), {len(held)}": lambda: ranges_by_device(uvm.torch, held),
        }
        rows.update({name: round(best_ms(fn), 3) for name, fn in pool_steps.items()})
    props = torch.cuda.get_device_properties(0)
    print(f"{props.name}, torch {torch.__version__}, Python {sys.version.split()[0]}, {args.count} tensors")
    print("| step | ms for all | µs per tensor |\n|---|---|---|")
    for name, ms in rows.items():
        print(f"| {name} | {ms:.2f} | {ms * 1e3 / args.count:.2f} |")
    if args.json:
        Path(args.json).write_text(json.dumps({"device": props.name, "torch": torch.__version__,
                                               "count": args.count, "ms": rows}, indent=1))


if __name__ == "__main__":
    main()
