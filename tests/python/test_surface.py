"""The seed's public surface: same names, shapes and semantics; import without torch."""
import inspect
import json
import re
import os
from pathlib import Path
import sys

import pytest
from conftest import SHIM, UVM_PATH, python

sys.path.insert(0, str(UVM_PATH))
import uvm  # noqa: E402

try:
    import torch
except ImportError:
    torch = None
needs_torch = pytest.mark.skipif(torch is None, reason="torch is not installed here")


def test_import_does_not_import_torch():
    out = python("import sys, uvm; print('torch' in sys.modules)").stdout.strip()
    assert out == "False"


def test_seed_names_and_shapes():
    assert [s.name for s in uvm.CompilationState] == ["UNATTEMPTED", "FAILURE", "SUCCESS"]
    assert issubclass(uvm.UnifiedMemoryUnsupportedError, Exception)
    assert issubclass(uvm.UnifiedMemoryCompileTimeoutError, uvm.UnifiedMemoryUnsupportedError)
    for name in ("_compilation_state", "_compilation_error", "_so_path", "_ctypes_lib", "_ctypes_lock",
                 "_alloc", "_mod"):
        getattr(uvm, name)  # exists
    keyword_only = inspect.Parameter.KEYWORD_ONLY
    expected = {
        "prefetch_managed_tensor": ["tensor", "device", "stream"],
        "advise_managed_tensor_preferred_location": ["tensor", "device"],
        "advise_managed_tensor_accessed_by": ["tensor", "device"],
        "prefetch_managed_module_parameters": ["module", "device", "include_buffers", "stream"],
        "advise_managed_module_parameters_preferred_location": ["module", "device", "include_buffers"],
    }
    for name, params in expected.items():
        signature = inspect.signature(getattr(uvm, name))
        assert list(signature.parameters) == params, name
        assert signature.parameters["device"].kind == keyword_only, name
    assert callable(uvm.compile_allocator) and callable(uvm.create_unified_mempool)
    assert callable(uvm._get_ctypes_lib)
    with uvm._compile_timeout(5):
        pass
    with pytest.raises(ValueError):
        with uvm._compile_timeout(0):
            pass


def test_ctypes_library_declares_every_entry():
    lib = uvm._get_ctypes_lib()
    assert uvm._ctypes_lib is lib
    assert lib.uvm_prefetch.argtypes is not None and lib.uvm_malloc.restype is not None
    header = (SHIM.parent / "include" / "uvm.h").read_text()
    import re
    declared = set(re.findall(r"UVM_API [^;(]*?\b(uvm_\w+)\(", header))
    assert declared == set(uvm._lib.SIGNATURES), declared ^ set(uvm._lib.SIGNATURES)


def test_the_pool_is_made_or_refused_with_the_reason():
    code = ("import uvm\ntry:\n    uvm.create_unified_mempool()\n    print('made')\n"
            "except uvm.UnifiedMemoryUnsupportedError as e:\n    print(uvm._compilation_state.name, '|', e)")
    out = python(code).stdout
    if torch is None:
        assert out.startswith("FAILURE | unified memory is unavailable: torch is not installed"), out
    elif not torch.cuda.is_available():
        assert "no CUDA device or driver is visible to torch" in out, out
    else:
        assert out.strip() == "made", out


@needs_torch
def test_expandable_segments_alone_no_longer_blocks_the_build():
    """Whether a pool works with expandable_segments:True is decided when the pool is made (the GPU
    test proves it does with torch 2.11); compile_allocator itself no longer refuses the setting."""
    code = "import uvm; uvm.compile_allocator(); print(uvm._compilation_error)"
    out = python(code, {"PYTORCH_CUDA_ALLOC_CONF": "expandable_segments:True"}).stdout
    assert "expandable_segments" not in out, out


# A torch that is "not installed": importing it fails as a missing package does.
NO_TORCH = "import sys; sys.modules['torch'] = None\n"


def test_bad_limits_and_tags_are_refused_before_reaching_c():
    for value, error in ((2 ** 64, "ValueError"), (0, "ValueError"), (-1, "ValueError"), ("x", "TypeError"),
                         (1.5, "TypeError"), (True, "TypeError")):
        out = python(f"import uvm\ntry:\n    uvm.set_limit({value!r}, device=0)\nexcept Exception as e:\n"
                     "    print(type(e).__name__, e)").stdout
        assert out.startswith(error) and "limit_bytes" in out, (value, out)
    out = python("import uvm\ntry:\n    with uvm.tag(5): pass\nexcept TypeError as e:\n    print(e)").stdout
    assert "a tag is a str" in out and "not int" in out


def test_moves_by_tag_device_or_none_need_no_torch():
    code = NO_TORCH + """import uvm
print('tag', uvm.offload('never-used'), uvm.onload('never-used'), uvm.discard('never-used'))
for call in ('uvm.offload(None)', 'uvm.where(None)', 'uvm.offload(3.5)', 'uvm.where([1])'):
    try:
        eval(call)
    except TypeError as e:
        print(call, '->', e)
try:
    uvm.offload(0)
    print('device ok')
except (uvm.UnifiedMemoryUnsupportedError, ValueError) as e:
    print('device ->', e)
"""
    lines = python(code).stdout.splitlines()
    assert lines[0] == "tag 0 0 0"
    assert "not None" in lines[1] and "not None" in lines[2]
    assert "needs torch, which is not installed" in lines[3] and "needs torch" in lines[4]
    assert lines[5] == "device ok" or "no usable CUDA device" in lines[5], lines[5]


def test_stream_without_torch_says_so_and_checks_its_budget_first():
    code = NO_TORCH + """import uvm
for budget in (0, 1 << 30):
    try:
        uvm.stream(object(), budget_bytes=budget)
    except (TypeError, ValueError) as e:
        print(type(e).__name__, e)
"""
    lines = python(code).stdout.splitlines()
    assert lines[0] == "ValueError uvm.stream: budget_bytes must be a positive int, not 0"
    assert lines[1].startswith("TypeError uvm.stream needs torch, which is not installed"), lines[1]


def test_stream_keeps_the_first_layers_that_fit_beside_a_window_of_four():
    """No GPU needed: which layers uvm.stream keeps on the GPU, by their sizes and the budget."""
    code = NO_TORCH + """from uvm.streaming import Streamed
def kept(sizes, budget):
    s = object.__new__(Streamed)
    s.layers, s.layer_bytes, s.layer_budget = list(sizes), list(sizes), budget
    return s._layers_to_keep()
print(kept([8] * 8, 48))          # 6 layers of room: 4 for the window, 2 kept
print(kept([8] * 8, 24))          # less than a window: all rotate
print(kept([8] * 8, 64))          # all fit: all kept
print(kept([8, 8, 16, 8, 8], 47)) # the window is 4 of the largest (64): none
print(kept([1, 1, 3] + [1] * 12, 16))  # window 12, 4 left: 1, 1, then 3 does not fit: stop there
"""
    assert python(code).stdout.splitlines() == ["[0, 1]", "[]", "[0, 1, 2, 3, 4, 5, 6, 7]", "[]", "[0, 1]"]


def test_the_command_line_helps_and_says_what_is_missing():
    helped = python("import sys, uvm.__main__ as m; sys.exit(m.main(['--help']))", check=False)
    assert helped.returncode == 0 and "uvm doctor" in helped.stdout and "uvm --version" in helped.stdout
    bench_help = python(NO_TORCH + "import sys, uvm.__main__ as m; sys.exit(m.main(['bench', '--help']))",
                        check=False)
    assert bench_help.returncode == 0 and "Offload/onload benchmark" in bench_help.stdout, bench_help.stderr
    no_torch = python(NO_TORCH + "import sys, uvm.__main__ as m; sys.exit(m.main(['bench']))", check=False)
    assert no_torch.returncode == 2 and "needs torch" in no_torch.stderr and "Traceback" not in no_torch.stderr
    stream_help = python(NO_TORCH + "import sys, uvm.__main__ as m; sys.exit(m.main(['bench', 'stream', '--help']))",
                         check=False)
    assert stream_help.returncode == 0 and "Streaming benchmark" in stream_help.stdout, stream_help.stderr


def test_bench_all_runs_both_benchmarks_in_processes_of_their_own_and_keeps_the_first_failure():
    code = f"""import json, os, sys
sys.path.insert(0, {str(SHIM.parent / 'bench')!r})
import bench_all as m
calls = []
def call(argv, env):
    calls.append((argv[1:], env["PYTHONPATH"].split(os.pathsep)[0]))
    return [0, 3][len(calls) - 1]
m.subprocess.call = call
status = m.main(['--quick', '--out', '/tmp/x'])
print(json.dumps({{"status": status, "calls": calls, "full": m.commands('o', False)}}))
"""
    result = json.loads(python(code).stdout.splitlines()[-1])
    assert result["status"] == 3  # the RL bench failed, the offload bench did not
    (offload, shim_a), (rl, shim_b) = result["calls"]
    assert offload == ["-m", "uvm", "bench", "--sizes-mib", "4096", "--cycles", "2", "--out", "/tmp/x/offload"]
    assert rl == ["-m", "uvm", "bench", "rl", "--cycles", "2", "--out", "/tmp/x/rl"]
    assert shim_a == shim_b == str(UVM_PATH)  # the children import this uvm
    assert result["full"] == [["--out", os.path.join("o", "offload")], ["rl", "--out", os.path.join("o", "rl")]]
    helped = python(NO_TORCH + "import sys, uvm.__main__ as m; sys.exit(m.main(['bench', 'all', '--help']))",
                    check=False)
    assert helped.returncode == 0 and "--quick" in helped.stdout and "Every row of both benchmarks" in helped.stdout


@needs_torch
def test_bench_progress_is_a_bar_on_a_terminal_and_plain_lines_in_a_log():
    code = """import io, sys
sys.argv = ['x']
sys.path.insert(0, %r)
import offload_bench as b
log = io.StringIO()
p = b.Progress(3, stream=log)
for _ in range(3): p()
p.close()
print(repr(log.getvalue()))
""" % str(SHIM.parent / "bench")
    out = python(code).stdout.strip()
    assert "\\r" not in out and out == repr("cycle 1/3\ncycle 2/3\ncycle 3/3\n")


def test_bench_tables_have_small_tensor_and_pool_rows_against_pinned():
    code = """import sys, types
sys.argv = ['x']
sys.path.insert(0, %r)
try:
    import torch
except ImportError:  # the tables need no torch: a stand-in with what the module's definitions name
    torch = types.ModuleType("torch")
    torch.nn = types.SimpleNamespace(Module=object)
    sys.modules["torch"] = torch
import offload_bench as b
def row(shape, method, off, on):
    return {"shape": shape, "size_mib": 2048, "params": 4096 if shape == "small" else 1027, "method": method,
            "offload_gbps": off, "onload_gbps": on, "reclaimed": None if method == "pinned memcpy" else True,
            "graph_ok": None if method == "pinned memcpy" else True, "first_offload_gbps": None}
rows = [row("transformer", "uvm auto", 50.0, 44.0), row("transformer", "uvm pool", 25.0, 22.0),
        row("transformer", "pinned memcpy", 50.0, 55.0), row("small", "uvm auto", 40.0, 27.5),
        row("small", "uvm pool", 30.0, 20.0), row("small", "pinned memcpy", 50.0, 55.0),
        dict(row("transformer", "uvm staged (no claim)", 50.0, 48.0), bytes=int(48e9), onload_s=[1.0, 0.96, 1.2],
             reclaimed=None)]
old = dict(rows[0]); del old["shape"]  # results written before shapes existed read as transformer
print(b.markdown(rows))
print("\\n".join(b.goal_lines(rows)))
print(b.markdown([old]).splitlines()[-1])
""" % str(SHIM.parent / "bench")
    out = python(code).stdout
    assert "| 2048 MiB small | 4096 | uvm auto | 40.0 | 27.5 | 80% | 50% |" in out, out
    assert "| 2048 MiB | 1027 | uvm pool | 25.0 | 22.0 | 50% | 40% |" in out, out
    assert "uvm.offload(pool) 25.0 / 22.0 GB/s against by tensors 50.0 / 44.0" in out, out
    assert "small tensors, 4096 x 512 KiB, uvm pool: offload 30.0 GB/s (goal >= 45), onload 20.0" in out, out
    assert out.strip().splitlines()[-1].startswith("| 2048 MiB | 1027 | uvm auto |"), out
    # 40.0, 48.0 and 50.0 GB/s: a spread of 10 GB/s, 21 % of the 48.0 median
    assert ("2048 MiB transformer, onload with no claim: 40.0–50.0 GB/s, median 48.0 (goal >= 48), "
            "spread 21% of the median (goal <= 10%)") in out, out
    assert "| 2048 MiB | 1027 | uvm staged (no claim) | 50.0 | 48.0 | 100% | 87% | n/a |" in out, out


def test_rl_bench_goal_lines_judge_the_drop_in_against_native_peer_pinned_and_the_link():
    code = """import sys, types
sys.argv = ['x']
sys.path.insert(0, %r)
try:
    import torch
except ImportError:  # the goal lines need no torch: a stand-in with what the module's definitions name
    torch = types.ModuleType("torch")
    torch.nn = types.SimpleNamespace(Module=object)
    sys.modules["torch"] = torch
import rl_bench as b
def row(method, pattern, sleep, wake, claim=0.0, gbps=None):
    steady = {"sleep_s": sleep, "claim_s": claim, "wake_s": wake, "cycle_s": sleep + claim + wake}
    return {"method": method, "pattern": pattern, "steady": steady, "first": steady,
            "sleep_gbps": gbps or 4.0 / sleep, "wake_gbps": 4.0 / wake}
rows = [row("uvm releasable", "full", 0.080, 0.090), row("uvm memory_saver", "full", 0.083, 0.099),
        row("torch_memory_saver", "full", 0.095, 0.110), row("pinned memcpy", "full", 0.076, 0.080),
        row("uvm memory_saver (no retain)", "full", 0.2, 0.1, gbps=36.0),
        row("uvm memory_saver (preload)", "big", 0.08, 0.1, 0.05), row("torch_memory_saver (preload)", "big", 0.1, 0.2, 0.05)]
print("\\n".join(b.goal_lines(rows)))
""" % str(SHIM.parent / "bench")
    out = python(code).stdout
    assert "goal full: uvm memory_saver (torch) sleep 0.083 s within 5 % of uvm releasable's 0.080 s: 1.04x, met" in out, out
    assert "goal full: uvm memory_saver (torch) wake 0.099 s within 5 % of uvm releasable's 0.090 s: 1.10x, NOT met" in out, out
    # 0.205 / 0.182 = 1.13x ahead of the peer: met; 0.182 against pinned memcpy's 0.156 = 1.17x: NOT met
    assert "goal full: uvm memory_saver (torch) cycle 1.10x faster than torch_memory_saver (torch): 1.13x, met" in out, out
    assert "goal full: uvm releasable cycle within 15 % of pinned memcpy's 0.156 s: 1.09x, met" in out, out
    assert "goal full: uvm memory_saver cycle within 15 % of pinned memcpy's 0.156 s: 1.17x, NOT met" in out, out
    assert "goal full: uvm memory_saver (no retain) sleep at 35 GB/s: 36.0 GB/s, met" in out, out
    # 0.35 / 0.23 = 1.52x against the peer in preload mode; no native row in big: no same-as-native line
    assert "goal big: uvm memory_saver (preload) cycle 1.25x faster than torch_memory_saver (preload): 1.52x, met" in out, out
    assert "goal big: uvm memory_saver (preload) sleep" not in out, out


def test_rl_bench_shows_each_calls_spread_and_the_sleeps_first_call_beside_the_peers():
    """A median of few cycles hides a call that slows from some cycle on: each call's line gives its
    fastest and slowest steady cycle, and the drop-in's sleep goal names its first call's seconds
    beside torch_memory_saver's of the same run."""
    code = """import sys, types
sys.argv = ['x']
sys.path.insert(0, %r)
try:
    import torch
except ImportError:
    torch = types.ModuleType("torch")
    torch.nn = types.SimpleNamespace(Module=object)
    sys.modules["torch"] = torch
import rl_bench as b
def result(method, first_calls):  # cycle 0 is the first; the rest are steady
    cycles = [{"sleep_s": 0.1 + kv, "claim_s": 0.0, "wake_s": 0.09, "cycle_s": 0.19 + kv, "freed_visible_bytes": 1,
               "identical": True, "returned_s": {"pause kv_cache": kv, "pause weights": 0.076}} for kv in first_calls]
    return {"method": method, "pattern": "big", "weight_bytes": 4e9, "cycles": cycles}
native = {"method": "uvm releasable", "pattern": "big", "weight_bytes": 4e9, "cycles": [
    {"sleep_s": 0.077, "claim_s": 0.0, "wake_s": 0.09, "cycle_s": 0.167, "freed_visible_bytes": 1, "identical": True,
     "returned_s": {"offload weights": 0.076}}] * 3}
rows = [b.summarize(r) for r in (native, result("uvm memory_saver", [0.9, 0.001, 0.030, 0.040]),
                                 result("torch_memory_saver", [0.5, 0.0005, 0.020, 0.021]))]
print(b.markdown(rows, {"device": "d", "driver": "v", "torch": "t", "torch_cuda": "c", "torch_memory_saver": "p"},
                 {"weight_bytes": 4e9, "sleep_bytes": 5e9, "tensors": 1}))
print("\\n".join(b.goal_lines(rows)))
""" % str(SHIM.parent / "bench")
    out = python(code).stdout
    # steady cycles 1-3 only: the first cycle's 0.9 s is not in the range
    assert "- uvm memory_saver: pause kv_cache 0.0300 (0.0010-0.0400), pause weights 0.0760 (0.0760-0.0760)" in out, out
    assert ("goal big: uvm memory_saver (torch) sleep 0.130 s within 5 % of uvm releasable's 0.077 s: 1.69x, NOT met "
            "(its first call, pause kv_cache, 0.030 s; torch_memory_saver's 0.020 s)") in out, out


def test_wake_floor_bounds_a_wake_by_its_map_stall_and_finds_releases_with_nothing_to_copy():
    """A wake whose third map stalls 30 ms: only the 1 GB mapped before it can move meanwhile, so
    at a 50 GB/s link the floor is 30.2 ms + 2 GB / 50 GB/s = 70.2 ms; a release with no copy
    beside it is the call's own wait, one under copies is hidden."""
    sys.path.insert(0, str(SHIM.parent / "bench" / "probes"))
    import wake_floor as w

    def ev(name, ts_ms, dur_ms, call, tid=1, nbytes=0, gbps=0.0):
        return {"name": name, "ph": "X", "ts": ts_ms * 1e3, "dur": dur_ms * 1e3, "tid": tid,
                "args": {"call": call, "bytes": nbytes, "GB/s": gbps}}
    wake = [{"name": "uvm_resume", "ph": "X", "ts": 0, "dur": 72e3, "tid": 1, "args": {}},
            ev("map", 0.0, 0.1, "uvm_resume"), ev("map", 0.1, 0.1, "uvm_resume"), ev("map", 0.2, 30.0, "uvm_resume"),
            ev("copy", 0.3, 20.0, "uvm_resume", tid=1000001, nbytes=10**9, gbps=50.0),
            ev("copy", 31.0, 40.0, "uvm_resume", tid=1000001, nbytes=2 * 10**9, gbps=50.0)]
    sleep = [{"name": "uvm_pause", "ph": "X", "ts": 100e3, "dur": 18e3, "tid": 1, "args": {}},
             ev("release", 100.5, 17.0, "uvm_pause"),
             {"name": "uvm_pause", "ph": "X", "ts": 120e3, "dur": 80e3, "tid": 1, "args": {}},
             ev("copy", 120.0, 70.0, "uvm_pause", tid=1000001, nbytes=35 * 10**8, gbps=50.0),
             ev("release", 130.0, 10.0, "uvm_pause"), ev("release", 195.0, 2.0, "uvm_pause")]
    report = w.report(wake + sleep, skip_first=0)
    assert report["link_gbps"] == 50.0
    assert report["wake"]["floor_s"] == pytest.approx(0.0702)  # the stall ends at +30.2 ms
    assert report["wake"]["seconds"] == pytest.approx(0.072)
    assert report["wake"]["bytes_before"] == 10**9
    calls = report["sleep_calls"]
    assert calls["uvm_pause (nothing to copy)"]["release_alone_s"] == pytest.approx(0.017)
    assert calls["uvm_pause (copies)"]["release_s"] == pytest.approx(0.012)
    assert calls["uvm_pause (copies)"]["release_alone_s"] == pytest.approx(0.002)  # the one after the copies
    text = "\n".join(w.lines("uvm memory_saver", "full", report))
    assert "full uvm memory_saver: wake 72.0 ms, floor 70.2 ms (1.03x): a map stalls 30.0 ms" in text, text


def test_range_arrays_hold_each_pointer_and_size_as_uvm_range_does():
    """uvm.torch._range_array packs (ptr, size) pairs as 64-bit integers under a uvm_range array:
    the layout must match the struct field for field, extreme values included."""
    import ctypes
    spans = [(0x7F00_0000_0000, 512), (1, 2**64 - 1), (2**64 - 1, 0)]
    ranges = uvm.torch._range_array(spans)
    assert ctypes.sizeof(ranges) == len(spans) * ctypes.sizeof(uvm._lib.Range)
    assert [(r.ptr, r.size) for r in ranges] == spans
    assert len(uvm.torch._range_array([])) == 0


@needs_torch
def test_tensor_guards():
    assert uvm.prefetch_managed_tensor(None, device=0) is None
    with pytest.raises(TypeError, match="must be a torch.Tensor, not list"):
        uvm.prefetch_managed_tensor([1, 2], device=0)
    assert uvm.prefetch_managed_tensor(torch.empty(0), device=0) is None
    with pytest.raises(ValueError, match="is a cpu tensor"):
        uvm.advise_managed_tensor_preferred_location(torch.ones(4), device=0)
    with pytest.raises(ValueError, match="is a cpu tensor"):
        uvm.prefetch_managed_module_parameters(torch.nn.Linear(2, 2), device=0)


def test_stats_without_a_device_say_so():
    lib = uvm.library()
    if lib.uvm_device_count() > 0:
        pytest.skip("a CUDA device is present: the no-device path is for CPU machines")
    with pytest.raises(uvm.UnifiedMemoryUnsupportedError, match="no usable CUDA device or driver"):
        uvm.stats(0)


def test_doctor_exits_nonzero_with_the_reason_when_no_pool_can_be_made():
    result = python("import sys, uvm.__main__ as m; sys.exit(m.main(['doctor']))", check=False)
    if torch is not None and torch.cuda.is_available():
        assert result.returncode == 0, result.stdout
        assert "ok: uvm.create_unified_mempool() will work" in result.stdout
    else:
        assert result.returncode == 1
        assert "not ok: a pool cannot be created:" in result.stdout


def test_one_version_everywhere():
    """uvm.h's UVM_VERSION_* numbers are the release: meson reads them (no number in meson.build), the
    wheel's metadata (setup.py) and uvm.__version__ read them, and no other file states one."""
    import importlib.metadata
    import re
    root = SHIM.parent
    header = (root / "include" / "uvm.h").read_text()
    numbers = [re.search(rf"#define UVM_VERSION_{part} (\d+)", header).group(1) for part in ("MAJOR", "MINOR", "PATCH")]
    release = ".".join(numbers)
    assert uvm.__version__ == release
    assert "get_define('UVM_VERSION_MAJOR'" in (root / "meson.build").read_text()
    assert not re.search(r"^\s*version\s*:\s*'", (root / "meson.build").read_text(), re.MULTILINE)
    assert 'dynamic = ["version"]' in (root / "pyproject.toml").read_text()
    assert not re.search(r"__version__\s*=\s*[\"']", (Path(uvm.__file__)).read_text())
    try:
        installed = importlib.metadata.version("uvm-cuda")
    except importlib.metadata.PackageNotFoundError:
        installed = None  # the source tree, not installed
    assert installed in (None, release)


def test_the_build_module_only_builds_and_the_modules_import_without_a_cycle():
    """_build imports nothing of uvm's but its exceptions; the package's imports form no cycle."""
    import ast
    package = Path(uvm.__file__).parent
    imports = {}
    for path in package.glob("*.py"):
        names = set()
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ImportFrom) and node.level == 1:
                names |= {node.module} if node.module else {alias.name for alias in node.names}
        imports[path.stem] = names
    assert imports["_build"] == {"_errors"}
    assert imports["_errors"] == set()

    def reaches(start, goal, seen=()):
        return any(n == goal or (n not in seen and reaches(n, goal, seen + (n,))) for n in imports.get(start, ()))
    cycles = [name for name in imports if reaches(name, name)]
    assert not cycles, imports


def test_every_source_is_listed_once_in_the_one_list_meson_and_the_jit_read():
    from uvm import _build
    root = _build.source_root()
    listed = _build.SourceList(root)
    assert len(listed.sources) == len(set(listed.sources))
    on_disk = {p for folder in ("alloc", "share", "hints", "offload") for p in (root / folder).rglob("*.cpp")}
    assert set(listed.sources) == on_disk
    assert set(listed.preload_sources) == set((root / "preload").rglob("*.cpp"))
    assert "-std=c++17" in listed.flags and "-fvisibility=hidden" in listed.flags
    assert "fs.read('sources.txt')" in (SHIM.parent / "meson.build").read_text()


def _header() -> str:
    """uvm.h without its comments."""
    text = (SHIM.parent / "include" / "uvm.h").read_text()
    return re.sub(r"/\*.*?\*/", " ", text, flags=re.S)


def _ctype(c_type: str, pointer_level: int = 0):
    """The ctypes type uvm.h's C type reads as, for a mirror: structs by their mirror class."""
    import ctypes
    from uvm import _lib
    mirrors = {"uvm_range": _lib.Range, "uvm_allocation": _lib.Allocation, "uvm_stats": _lib.Stats,
               "uvm_device_caps": _lib.DeviceCaps, "uvm_residency": _lib.Residency,
               "uvm_staging_info": _lib.StagingInfo, "uvm_move_phase": _lib.MovePhase,
               "uvm_move_report": _lib.MoveReport, "uvm_option_info": _lib.OptionInfo,
               "uvm_kept_copies": _lib.KeptCopies, "uvm_share_handle": _lib.ShareHandle,
               "uvm_allocation_state": _lib.AllocationState}
    scalars = {"size_t": ctypes.c_size_t, "int": ctypes.c_int, "int64_t": ctypes.c_int64,
               "uint64_t": ctypes.c_uint64, "uint32_t": ctypes.c_uint32, "double": ctypes.c_double,
               "unsigned char": ctypes.c_ubyte,
               "cudaStream_t": ctypes.c_void_p, "cudaEvent_t": ctypes.c_void_p}
    enums = set(re.findall(r"typedef enum (\w+)", _header()))
    base = c_type.replace("const", "").strip()
    if base == "char" and pointer_level >= 1:  # a string, or an array of them
        found = ctypes.c_char_p
        for _ in range(pointer_level - 1):
            found = ctypes.POINTER(found)
        return found
    if base == "void":
        return None if pointer_level == 0 else (ctypes.c_void_p if pointer_level == 1 else ctypes.POINTER(ctypes.c_void_p))
    found = ctypes.c_int if base in enums else scalars.get(base) or mirrors[base]
    for _ in range(pointer_level):
        found = ctypes.POINTER(found)
    return found


def _split_declaration(text: str) -> tuple[str, int, str]:
    """'const uvm_range* ranges' -> ('const uvm_range', 1, 'ranges')."""
    text = " ".join(text.split())
    name = re.search(r"(\w+)(\[\w+\])?$", text)
    c_type = text[:name.start()]
    return c_type.replace("*", "").strip(), c_type.count("*"), name.group(0)


def test_ctypes_mirrors_match_uvm_h_field_by_field():
    """Every struct, enum value, sentinel and entry _lib.py mirrors reads as uvm.h declares it: a
    field out of step would make ctypes read or write the wrong bytes."""
    from uvm import _lib
    header = _header()
    for name, body in re.findall(r"typedef struct (\w+) \{(.*?)\} \1;", header, flags=re.S):
        mirror = _ctype(name)
        declared = []
        for line in filter(None, (part.strip() for part in body.split(";"))):
            c_type, pointers, field = _split_declaration(line)
            array = re.match(r"(\w+)\[(\w+)\]", field)
            if array:
                length = int(re.search(rf"#define {array.group(2)} (\d+)", header).group(1))
                declared.append((array.group(1), _ctype(c_type, pointers) * length))
            else:
                declared.append((field, _ctype(c_type, pointers)))
        assert [tuple(field) for field in mirror._fields_] == declared, name
    for enum_name, body in re.findall(r"typedef enum (\w+) \{(.*?)\} \1;", header, flags=re.S):
        values = dict(re.findall(r"(UVM_\w+) = (\d+)", body))
        if enum_name == "uvm_status":
            assert {n: int(v) for n, v in values.items()} == {n: getattr(_lib, n) for n in values}
        if enum_name == "uvm_strategy":
            assert {n.removeprefix("UVM_STRATEGY_").lower(): int(v) for n, v in values.items()} == _lib.STRATEGIES
        if enum_name == "uvm_backup":
            assert {n.removeprefix("UVM_BACKUP_").lower(): int(v) for n, v in values.items()} == _lib.BACKUPS
        if enum_name == "uvm_pinned_kind":
            assert sorted(int(v) for v in values.values()) == sorted(_lib.PINNED_KINDS)
    for sentinel in ("UVM_LOCATION_CPU", "UVM_LOCATION_NONE", "UVM_ANY_DEVICE", "UVM_MOVE_PHASES"):
        assert int(re.search(rf"#define {sentinel} \(?(-?\d+)\)?", header).group(1)) == getattr(_lib, sentinel)
    for restype, name, arguments in re.findall(r"UVM_API ([\w\s*]+?)\s*\b(uvm_\w+)\(([^)]*)\);", header):
        c_type, pointers = restype.replace("*", "").strip(), restype.count("*")
        arguments = [] if arguments.strip() == "void" else [_split_declaration(a) for a in arguments.split(",")]
        expected = (_ctype(c_type, pointers), [_ctype(t, p) for t, p, _ in arguments])
        assert _lib.SIGNATURES[name] == (expected[0], expected[1]), name


@pytest.mark.parametrize("given, cpu, expected", [
    (3, False, 3), (None, False, 0), ("cuda:2", False, 2), ("cpu", True, -1), (-1, True, -1),
])
def test_one_device_normaliser(given, cpu, expected, monkeypatch):
    from uvm import _lib
    monkeypatch.setitem(sys.modules, "torch", None)  # without torch, None is device 0
    assert _lib.device_ordinal(given, cpu=cpu) == expected


def test_the_current_device_where_torch_sees_no_gpu_is_refused_naming_why(monkeypatch):
    import types
    from uvm import _lib
    from uvm._errors import UnifiedMemoryUnsupportedError

    def not_compiled():
        raise AssertionError("Torch not compiled with CUDA enabled")

    cpu_only = types.SimpleNamespace(__version__="2.11.0+cpu",
                                     cuda=types.SimpleNamespace(is_available=lambda: False, current_device=not_compiled))
    monkeypatch.setitem(sys.modules, "torch", cpu_only)
    with pytest.raises(UnifiedMemoryUnsupportedError, match=r"this torch \(2.11.0\+cpu\) sees none"):
        _lib.device_ordinal(None)
    assert _lib.device_ordinal("cuda:1") == 1  # named devices need no torch


@pytest.mark.parametrize("given, cpu, error", [
    ("cpu", False, ValueError), ("gpu", True, ValueError), ("cuda:x", False, ValueError), (True, False, TypeError),
])
def test_device_arguments_refused_by_name(given, cpu, error):
    from uvm import _lib
    with pytest.raises(error, match="device"):
        _lib.device_ordinal(given, cpu=cpu)


def test_staging_reports_its_memory_by_kind_and_the_kind_asked_for():
    """No GPU needed: nothing held yet, the kind env UVM_PINNED asks for, the C layout; doctor says it."""
    code = ("import ctypes, uvm\nprint(sorted(uvm.staging().items()))\nprint(ctypes.sizeof(uvm._lib.StagingInfo))")
    for env, kind in ((None, "register"), ("pageable", "pageable"), ("hostalloc", "hostalloc")):
        out = python(code, {} if env is None else {"UVM_PINNED": env}).stdout.split("\n")
        assert out[0] == str(sorted({"capacity_bytes": 0, "staged_bytes": 0, "registered_bytes": 0,
                                     "host_alloc_bytes": 0, "pageable_bytes": 0, "pinning_bytes": 0,
                                     "blocks": 0, "kind": kind}.items())), (env, out)
        assert out[1] == "64", out  # 7 size_t and an int, padded (tests/abi/header_c99.c asserts it in C)
    doctor = python("import sys, uvm.__main__ as m; sys.exit(m.main(['doctor']))", {"UVM_PINNED": "pageable"},
                    check=False)
    assert "staging memory (UVM_PINNED=pageable): 0 MiB held in 0 block(s), 0 MiB in use" in doctor.stdout, doctor.stdout
    assert re.search(r"^  UVM_PINNED +pageable +register, hostalloc or pageable", doctor.stdout, re.M), doctor.stdout


def test_an_option_not_understood_is_refused_by_name_and_doctor_says_so():
    """No GPU needed: one policy for every variable in uvm.h's table (uvm_get_option lists it)."""
    refused = "UVM_PINNED='bogus' is not understood; expected register, hostalloc or pageable"
    out = python("import uvm\ntry:\n    uvm.staging()\nexcept ValueError as e:\n    print(e)", {"UVM_PINNED": "bogus"})
    assert out.stdout.startswith("uvm_get_staging_info(): " + refused), out.stdout
    doctor = python("import sys, uvm.__main__ as m; sys.exit(m.main(['doctor']))", {"UVM_PINNED": "bogus"},
                    check=False)
    assert doctor.returncode == 1, doctor.stdout
    assert f"problem: uvm_check_options(): {refused}" in doctor.stdout, doctor.stdout
    assert re.search(r"^  UVM_ONLOAD_STREAMS +unset \(4\) +1-8: streams", doctor.stdout, re.M), doctor.stdout
    assert "staging memory (UVM_PINNED" not in doctor.stdout


def test_last_move_is_empty_before_any_move_and_flush_is_harmless(tmp_path):
    """No GPU needed: a thread that moved nothing has no report; the trace flush without UVM_TRACE
    does nothing, and with it (and no move) writes no file."""
    code = ("import uvm\nprint(uvm.last_move(), uvm.last_move(device=0))\nuvm.trace_flush()\n"
            "import ctypes\nprint(ctypes.sizeof(uvm._lib.MoveReport), ctypes.sizeof(uvm._lib.MovePhase))")
    out = python(code, {"UVM_TRACE": str(tmp_path / "trace-%p.json")}).stdout.split("\n")
    assert out[0] == "[] []", out
    # uvm.h's layout on LP64 (tests/abi/header_c99.c asserts the same sizes in C):
    # 8 + 4 + 4 + 8 + 8 + 8 + 8, then 8 phases of 8 + 8 + 4 (+4 padding) + 8 + 8
    assert out[1] == f"{48 + 8 * 40} 40", out
    assert list(tmp_path.iterdir()) == []
    with pytest.raises(TypeError, match="not a bool"):
        uvm.last_move(device=True)


def test_node_bench_takes_the_slowest_rank_and_sets_each_row_beside_the_ceiling():
    """bench/node_bench.py: the node's time for a phase is its slowest rank's, the aggregate counts
    every rank's bytes, the first cycle stands apart from the steady median, and a row's share of the
    ceiling is against pinned memcpy with the same number of GPUs."""
    sys.path.insert(0, str(SHIM.parent / "bench"))
    import node_bench as n

    def result(method, seconds_by_rank):
        return {"method": method, "ranks": [
            {"rank": r, "device": "GPU", "bytes": 8 * 10**9,
             "cycles": [{"cycle": c, "pause_s": s[c], "resume_s": s[c] / 2, "identical": True} for c in range(len(s))]}
            for r, s in enumerate(seconds_by_rank)]}

    ceiling = n.summarize(result("pinned memcpy", [[0.2, 0.1, 0.1, 0.1], [0.2, 0.1, 0.1, 0.12]]))
    assert ceiling["steady_pause_s"] == 0.1 and ceiling["first_pause_s"] == 0.2
    assert abs(ceiling["steady_pause_gbps"] - 160.0) < 1e-9  # 16 GB over the slower rank's 0.1 s (median of 0.1, 0.1, 0.12)
    ours = n.summarize(result("uvm memory_saver", [[1.0, 0.125, 0.125, 0.125], [0.5, 0.125, 0.125, 0.125]]))
    assert ours["first_pause_s"] == 1.0 and abs(ours["steady_pause_gbps"] - 128.0) < 1e-9
    table = n.markdown([ours, ceiling], {"device": "GPU"}, 8, 4)
    assert "and 4 GiB of KV cache with none" in table
    row = next(line for line in table.splitlines() if line.startswith("| uvm memory_saver | 2 |"))
    assert "| 80% | 80% |" in row and "| 8.00× |" in row and row.endswith("| yes |")


def test_a_torch_built_for_a_cuda_major_uvm_has_no_build_for_is_refused_first_saying_what_to_install(tmp_path):
    """A torch built for CUDA 11 made uvm load or compile a build for another major, then fail about a
    second runtime in the process (issue 73). The check reads torch/version.py, importing nothing."""
    from conftest import python
    fake_torch = tmp_path / "torch"
    fake_torch.mkdir()
    (fake_torch / "__init__.py").write_text("raise ImportError('this stand-in torch is only read')\n")
    (fake_torch / "version.py").write_text("__version__ = '2.0.1+cu118'\ncuda: str = '11.8'\n")
    code = ("import uvm, uvm._lib as lib\n"
            "try:\n    lib.build_library()\nexcept uvm.UnifiedMemoryUnsupportedError as e:\n    print('REFUSED', e)\n")
    result = python(code, env={"PYTHONPATH": f"{tmp_path}:{UVM_PATH}", "UVM_CACHE_DIR": str(tmp_path / "cache")})
    assert "REFUSED this process uses CUDA 11" in result.stdout, result.stdout + result.stderr
    assert "install a torch built for CUDA 12 or 13" in result.stdout
    assert not (tmp_path / "cache").exists() or not any((tmp_path / "cache").rglob("*.so"))  # nothing compiled


def test_an_unknown_command_is_named_before_the_usage():
    from conftest import python
    result = python("import sys, uvm.__main__ as cli\nsys.exit(cli.main(['bogus']))", check=False)
    assert result.returncode == 2
    assert result.stderr.startswith("uvm: unknown command 'bogus'\nusage: uvm doctor"), result.stderr


def test_cuda_versions_are_printed_as_people_write_them():
    from uvm.__main__ import _dotted
    assert [_dotted(v) for v in (12010, "13000", 12080, 13020, "unknown", None)] == ["12.1", "13.0", "12.8", "13.2",
                                                                                  "unknown", "None"]


def test_thread_settings_hold_inside_and_come_back_after_even_on_a_raise():
    """uvm.tag, and the backup, compression and exportable settings regions and pools use, through one
    helper (_lib.thread_setting): the library's thread setting inside, the one before after."""
    from conftest import python
    code = """
import uvm
from uvm import _lib
from uvm.sharing import exportable
lib = uvm.library()
with uvm.tag("outer"):
    with uvm.tag("inner"), exportable(), _lib.thread_setting("compression", 1):
        print(lib.uvm_get_thread_tag(), lib.uvm_get_thread_exportable(), lib.uvm_get_thread_compression())
    print(lib.uvm_get_thread_tag(), lib.uvm_get_thread_exportable(), lib.uvm_get_thread_compression())
try:
    with exportable(), _lib.thread_setting("compression", 2):
        pass
except ValueError as error:
    print("refused:", "compress is 2" in str(error), lib.uvm_get_thread_exportable())
print(lib.uvm_get_thread_tag())
"""
    lines = python(code).stdout.splitlines()
    assert lines == ["b'inner' 1 1", "b'outer' 0 0", "refused: True 0", "b''"], lines
