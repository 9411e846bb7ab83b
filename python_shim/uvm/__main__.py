"""uvm doctor (or python -m uvm doctor) — what uvm sees here, and whether a pool can be created (exit 0)
or why not.
uvm --version — the release.
python -m uvm bench [args] — the offload/onload benchmark (bench/offload_bench.py; --help).
python -m uvm bench rl [args] — the sleep/wake cycle benchmark (bench/rl_bench.py; --help).
python -m uvm bench all [--quick] [--out DIR] — both, one after the other (bench/bench_all.py).
python -m uvm bench stream [args] — a model larger than its GPU budget, streamed (bench/stream_bench.py).
python -m uvm bench vllm [args] — vLLM's sleep mode on vLLM's allocator and on uvm's (bench/vllm_bench.py)."""
from __future__ import annotations

import ctypes
import os
import pathlib
import sys

from . import _build, _errors, _lib, _runtime, _state, _switch


def doctor() -> int:
    """Prints what uvm found, one line each; a problem is printed once, with what to do."""
    print(f"uvm {__import__('uvm').__version__} (distribution uvm-cuda), python {sys.version.split()[0]}")
    problems: list[str] = []
    _print_installation(problems)
    lib, option_refused = None, None
    try:
        lib = _lib.library()
        print(f"library: {_lib._so_path}")
        runtime = _lib.runtime_used or _runtime.mapped()
        if runtime is not None:
            print(f"CUDA runtime: {runtime.path} (CUDA {runtime.major}, {runtime.found_by}; "
                  f"cudaRuntimeGetVersion {_dotted(_runtime.version(runtime.path))})")
    except _errors.UnifiedMemoryUnsupportedError as error:
        problems.append(str(error))
    if lib is not None:
        option_refused = _print_options(lib)
        if option_refused:
            problems.append(option_refused)
        count = lib.uvm_device_count()
        if count == 0:
            problems.append(lib.uvm_last_error().decode(errors="replace"))
        for device in range(count):
            caps = _lib.DeviceCaps()
            lib.uvm_device_capabilities(device, ctypes.byref(caps))
            limit = ctypes.c_size_t()
            lib.uvm_get_limit(device, ctypes.byref(limit))
            stats = _lib.Stats()
            lib.uvm_get_stats(device, ctypes.byref(stats))
            print(f"device {device}: {caps.total_memory >> 20} MiB, managedMemory={caps.managed_memory}, "
                  f"concurrentManagedAccess={caps.concurrent_managed_access}, "
                  f"pageableMemoryAccess={caps.pageable_memory_access}, discard={caps.discard_supported}, "
                  f"limit {limit.value >> 20} MiB, live {stats.live_bytes >> 20} MiB, "
                  f"on host {stats.host_resident_bytes >> 20} MiB")
            _print_residency(lib, device)
            if not caps.concurrent_managed_access:
                problems.append(f"device {device} lacks concurrentManagedAccess: prefetch and advice "
                                "are unavailable there")
        if not option_refused:
            print(staging_line())  # host memory, shared by every device
    try:
        import torch
        print(f"torch {torch.__version__} (CUDA {torch.version.cuda}), MemPool: "
              f"{hasattr(torch.cuda, 'MemPool')}, cuda available: {torch.cuda.is_available()}")
    except ImportError:
        print("torch: not installed")
    if lib is not None:  # a library that cannot load cannot make a pool either: said once above
        _state.compile_allocator()
        print(f"compile state: {_state._compilation_state.name}")
        if _state._compilation_state is _state.CompilationState.SUCCESS:
            print(f"block hook: {_state.block_hook_status()}")
        else:
            problems.insert(0, f"a pool cannot be created: {_state._compilation_error}")
    for problem in dict.fromkeys(problems):
        print(f"problem: {problem}")
    ready = lib is not None and _state._compilation_state is _state.CompilationState.SUCCESS and not option_refused
    print("ok: uvm.create_unified_mempool() will work" if ready else f"not ok: {problems[0]}")
    return 0 if ready else 1


def _print_installation(problems: list[str]) -> None:
    """Where the package, its shipped builds, a toolkit and a compiler are, and what is switched."""
    manifest = _build.shipped_manifest()
    if manifest is not None:
        majors = ", ".join(f"CUDA {_dotted(entry['cuda'])}" for entry in manifest["libraries"].values()) or "none"
        hooks = ", ".join(manifest["torch_hooks"]) or "none"
        print(f"installed: {_build.SHIPPED.parent}; prebuilt libuvm.so for {majors}; block hooks for torch {hooks}")
    else:
        print(f"source tree: {_build.SHIPPED.parent} (libuvm.so is compiled at first use, and cached)")
    for label, find in (("CUDA toolkit", _build.cuda_home), ("compiler", _build.compiler)):
        try:
            found = find()
            print(f"{label}: {found}" + (f" (CUDA {_dotted(_build.cuda_version(found))})" if label == "CUDA toolkit" else ""))
        except _build.BuildError as error:
            needed = manifest is None
            print(f"{label}: none ({'needed here: ' if needed else 'not needed: '}{error})")
            if needed:
                problems.append(str(error))
    print(f"cache dir: {os.environ.get('UVM_CACHE_DIR') or '~/.cache/uvm'}; "
          f"timeout {os.environ.get('UVM_COMPILE_TIMEOUT_S') or _build.DEFAULT_TIMEOUT_S} s")
    owners = _owners_of_uvm()
    if len(owners) > 1:
        others = [owner for owner in owners if owner.lower().replace("_", "-") != "uvm-cuda"]
        overwritten = _overwritten_files()
        problems.append(
            f"several installed distributions provide the `uvm` import: {', '.join(owners)}"
            + (f"; files of uvm-cuda were overwritten since it was installed: {', '.join(overwritten[:5])}"
               if overwritten else "")
            + f". Uninstalling {' and '.join(others)} alone would delete files they share with uvm-cuda: run "
            f"`pip uninstall -y {' '.join(others)} uvm-cuda && pip install uvm-cuda` (and keep "
            f"{' and '.join(others)} out of this environment)")
    value = os.environ.get(_switch.ENV)
    why_off = f"{_switch.ENV} unset" if value is None else f"{_switch.ENV}={value!r}"
    try:
        asked = _switch.switched()
    except ValueError as error:
        problems.append(str(error))
        asked = {}
        why_off += ", not understood"
    active = _switch.active()
    if not asked:
        print(f"switch: off ({why_off}): torch_memory_saver, Megatron's unified_memory and vLLM's allocator are "
              "as installed")
    for module, name in asked.items():
        original = _switch.original_location(module)
        state = "on" if module in active else "asked for, but uvm_switch.pth did not run in this process"
        gives = (f"`{module}.CuMemAllocator` is uvm's (uvm.vllm), the module vLLM's" if name == "vllm"
                 else f"`import {module}` gives uvm's")
        print(f"switch {name}: {state}: {gives}; the original is {'at ' + original if original else 'not installed'}")


def _dotted(version) -> str:
    """CUDA's version number as people write it: 12010 -> "12.1", 13000 -> "13.0"; as given otherwise."""
    try:
        number = int(version)
    except (TypeError, ValueError):
        return str(version)
    return f"{number // 1000}.{number % 1000 // 10}" if number >= 1000 else str(version)


def _overwritten_files() -> list[str]:
    """uvm-cuda's installed files whose contents no longer match its RECORD (another distribution
    wrote them since)."""
    import base64
    import hashlib
    import importlib.metadata
    try:
        files = importlib.metadata.distribution("uvm-cuda").files or []
    except Exception:  # noqa: BLE001 - not installed from a wheel, or broken metadata
        return []
    changed = []
    for file in files:
        if file.hash is None or file.hash.mode != "sha256":
            continue
        try:
            digest = hashlib.sha256(file.locate().read_bytes()).digest()
        except OSError:
            changed.append(str(file))
            continue
        if base64.urlsafe_b64encode(digest).rstrip(b"=").decode() != file.hash.value:
            changed.append(str(file))
    return changed


def _owners_of_uvm() -> list[str]:
    """The installed distributions whose files include the top-level `uvm` package."""
    import importlib.metadata
    try:
        return sorted(set(importlib.metadata.packages_distributions().get("uvm", [])))
    except Exception:  # noqa: BLE001 - a broken metadata file must not break the doctor
        return []


def _print_options(lib) -> str | None:
    """Prints uvm's table of environment variables (uvm.h, "Options") as the library read them;
    returns the library's message if it refuses one of them."""
    print("options (uvm.h, Options):")
    for index in range(lib.uvm_option_count()):
        info = _lib.OptionInfo()
        lib.uvm_get_option(index, ctypes.byref(info))
        shown = info.value.decode() if info.value else f"unset ({info.default_value.decode() or 'off'})"
        print(f"  {info.name.decode():<21} {shown:<28} {info.meaning.decode()}")
    if lib.uvm_check_options() != _lib.UVM_OK:
        return lib.uvm_last_error().decode(errors="replace")
    return None


def _print_residency(lib, device: int) -> None:
    """What uvm moved where on `device`, per tag: the numbers cudaMemGetInfo lacks."""
    names = [None] + [""] + [lib.uvm_tag_name(i).decode() for i in range(lib.uvm_tag_count())]
    for name in names:
        r = _lib.Residency()
        lib.uvm_get_residency(device, None if name is None else name.encode(), ctypes.byref(r))
        if name is not None and r.allocations == 0:
            continue
        label = "all tags" if name is None else f"tag {name!r}" if name else "untagged"
        print(f"  {label}: {r.allocations} allocations, {r.live_bytes >> 20} MiB: on device "
              f"{r.device_bytes >> 20} MiB, on host {r.host_bytes >> 20} MiB (staged {r.staged_bytes >> 20} "
              f"MiB), discarded {r.discarded_bytes >> 20} MiB")


def staging_line() -> str:
    """The staging memory held, by kind, in one line."""
    import uvm
    s = uvm.staging()
    kinds = ", ".join(f"{label} {s[key] >> 20} MiB" for key, label in
                      (("registered_bytes", "registered"), ("host_alloc_bytes", "cudaHostAlloc"),
                       ("pageable_bytes", "pageable")) if s[key])
    pinning = f", {s['pinning_bytes'] >> 20} MiB still being pinned" if s["pinning_bytes"] else ""
    return (f"staging memory (UVM_PINNED={s['kind']}): {s['capacity_bytes'] >> 20} MiB held in {s['blocks']} "
            f"block(s){' (' + kinds + ')' if kinds else ''}{pinning}, {s['staged_bytes'] >> 20} MiB in use")


USAGE = """usage: uvm doctor                    what uvm sees here; exit 0 if a pool can be created
       uvm --version                 the release
       (`python -m uvm ...` is the same command)
       python -m uvm bench [--help]    the offload/onload benchmark (needs torch and a GPU)
       python -m uvm bench rl [--help] the RL sleep/wake cycle benchmark, uvm against its peers
       python -m uvm bench all [--quick] [--out DIR]  both: every row of the two tables in one run
       python -m uvm bench stream [--help]  streaming a model larger than its GPU budget
       python -m uvm bench vllm [--help]    vLLM's sleep mode, vLLM's allocator beside uvm's"""


def bench(argv: list[str]) -> int:
    """Runs bench/offload_bench.py (or, for `bench rl`, bench/rl_bench.py; for `bench all`,
    bench/bench_all.py; for `bench stream`, bench/stream_bench.py) from the source tree, or the copy installed with the package. --help works
    without torch (it prints the script's own description)."""
    import ast
    import runpy
    name = "offload_bench.py"
    runners = {"rl": "rl_bench.py", "all": "bench_all.py", "stream": "stream_bench.py", "vllm": "vllm_bench.py"}
    if argv[:1] and argv[0] in runners:
        name, argv = runners[argv[0]], argv[1:]
    here = pathlib.Path(__file__).resolve().parent
    found = [s for s in (here.parents[1] / "bench" / name, here / "_csrc" / "bench" / name) if s.is_file()]
    if not found:
        print(f"python -m uvm bench: bench/{name} is not in this installation", file=sys.stderr)
        return 2
    script = found[0]
    try:
        if name != "bench_all.py":  # its children import torch, each in a process of its own
            import torch  # noqa: F401
    except ImportError:
        if {"-h", "--help"} & set(argv):
            print(ast.get_docstring(ast.parse(script.read_text())))
            return 0
        print("python -m uvm bench: the benchmark needs torch with CUDA, and torch is not installed",
              file=sys.stderr)
        return 2
    sys.argv = [str(script), *argv]
    try:
        runpy.run_path(str(script), run_name="__main__")
    except SystemExit as exit_:
        return exit_.code if isinstance(exit_.code, int) else (0 if exit_.code is None else 1)
    return 0


def main(argv: list[str]) -> int:
    if argv[:1] in (["--version"], ["-V"]):
        print(f"uvm {__import__('uvm').__version__}")
        return 0
    if argv[:1] == ["doctor"]:
        return doctor()
    if argv[:1] == ["bench"]:
        return bench(argv[1:])
    if argv[:1] in (["-h"], ["--help"], ["help"]):
        print(USAGE)
        return 0
    if argv:
        print(f"uvm: unknown command {argv[0]!r}", file=sys.stderr)
    print(USAGE, file=sys.stderr)
    return 2


def console() -> None:
    """The `uvm` command the wheel installs."""
    sys.exit(main(sys.argv[1:]))


if __name__ == "__main__":
    console()
