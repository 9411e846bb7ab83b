"""Runs Megatron-LM's own suspend/resume tests (tests/unit_tests/inference/engines/test_dynamic_engine.py,
from its repository at the commit scripts/fetch_peers.sh pins) with uvm standing in for Megatron's
unified-memory module and for torch_memory_saver. Nothing of Megatron's is edited; what this driver
does around it, and why:

  * with UVM_PEERS_VIA=switch, the installed wheel's switch (UVM_SWITCH) answers
    megatron.core.inference.unified_memory and torch_memory_saver with uvm's (tests/peers/run_switched.sh);
    else sys.modules aliases them to this tree's uvm before Megatron is imported, as
    tests/peers/megatron_on_uvm.py does; either way it prints which modules answered;
  * flash_attn is uvm's plain-PyTorch reference (tests/peers/flash_attn_reference), which claims the
    2.7.4 contract the tests ask for;
  * the test module's first line imports transformer_engine.pytorch.fp8.check_fp8_support, and
    Transformer Engine cannot reach the GPU machine. Megatron is imported first (so every module of
    it has already decided that TE is absent), then a stand-in for that one function, answering
    "no FP8 support", is visible only while pytest imports the test module, and is removed after.

  * Megatron's suspend/resume tests pass without touching the saver where the KV cache stays (persist)
    or its pointers are not static, and return early, passing, when their module found no
    torch_memory_saver (HAVE_TORCH_MEMORY_SAVER). A passed test counts for uvm only when, during it, a
    pause through uvm's saver left uvm's library holding memory paused and a resume followed
    (SaverUse); the last line says how many did, and the driver fails when none did or the module
    found no saver.

Usage: megatron_tests.py MEGATRON_CHECKOUT [pytest arguments]. Prints pytest's summary line, then
"on uvm: K of N passed tests paused and resumed memory through uvm's saver".
"""
from __future__ import annotations

import ast
import importlib
import os
import sys
import types
from pathlib import Path

import pytest

HERE = Path(__file__).resolve().parent


def alias_uvm() -> None:
    sys.path.insert(0, str(HERE / "flash_attn_reference"))
    if os.environ.get("UVM_PEERS_VIA") == "switch":  # the installed wheel's switch answers both names
        return
    import uvm
    import uvm.memory_saver
    sys.modules["megatron.core.inference.unified_memory"] = uvm
    sys.modules["torch_memory_saver"] = uvm.memory_saver


def report_what_answers() -> None:
    """Prints which modules answer Megatron's two imports (the switch's proof)."""
    from megatron.core.inference import unified_memory
    import torch_memory_saver
    print(f"megatron.core.inference.unified_memory is {unified_memory.__name__} ({unified_memory.__file__}); "
          f"torch_memory_saver.torch_memory_saver is a {type(torch_memory_saver.torch_memory_saver).__module__} object")


class TransformerEngineStandIn:
    """pytest plugin: transformer_engine.pytorch.fp8 exists from configure until collection ends."""

    NAMES = ("transformer_engine", "transformer_engine.pytorch", "transformer_engine.pytorch.fp8")

    def __init__(self, test_file: Path):
        self.test_file = test_file

    def pytest_configure(self, config):
        config.addinivalue_line("markers", "internal: Megatron's mark for tests its CI runs internally")
        # Every Megatron module the test file imports decides HAVE_TE now, while TE is truly absent,
        # and Megatron's cached TE version is settled as "none" before the stand-in appears.
        tree = ast.parse(self.test_file.read_text())
        for node in ast.walk(tree):
            if isinstance(node, ast.ImportFrom) and node.module and node.module.startswith("megatron."):
                importlib.import_module(node.module)
        importlib.import_module("megatron.core.utils").get_te_version()
        for name in self.NAMES:
            sys.modules[name] = types.ModuleType(name)
        sys.modules["transformer_engine.pytorch.fp8"].check_fp8_support = lambda: (
            False, "Transformer Engine is not installed on this machine")

    def pytest_collection_finish(self, session):
        for name in self.NAMES:
            sys.modules.pop(name, None)


class SaverUse:
    """pytest plugin: which passed tests paused and resumed memory through uvm's saver."""

    def __init__(self):
        self.current: str | None = None
        self.paused: set[str] = set()
        self.resumed: set[str] = set()
        self.passed: list[str] = []
        self.problems: list[str] = []

    def pytest_collection_finish(self, session):
        for module in {item.module for item in session.items}:
            if getattr(module, "HAVE_TORCH_MEMORY_SAVER", True) is not True:
                self.problems.append(f"{module.__name__} found no torch_memory_saver: its tests pass without one")
        import torch_memory_saver
        saver = torch_memory_saver.torch_memory_saver
        owner = sys.modules[type(saver).__module__]
        if not owner.__name__.startswith("uvm."):
            self.problems.append(f"torch_memory_saver.torch_memory_saver is a {owner.__name__} object, not uvm's")
            return
        from uvm import _lib
        pause, resume = saver.pause, saver.resume

        def counted_pause(tag=None):
            pause(tag)
            if self.current and any(_lib.paused_count(name) for name in owner._state.selected(tag)):
                self.paused.add(self.current)

        def counted_resume(tag=None):
            resume(tag)
            if self.current in self.paused:
                self.resumed.add(self.current)

        saver.pause, saver.resume = counted_pause, counted_resume  # on the object Megatron imported

    @pytest.hookimpl(hookwrapper=True)
    def pytest_runtest_call(self, item):
        self.current = item.nodeid
        yield
        self.current = None

    def pytest_runtest_logreport(self, report):
        if report.when == "call" and report.passed:
            self.passed.append(report.nodeid)

    def report(self) -> bool:
        on_uvm = [test for test in self.passed if test in self.resumed]
        others = [test for test in self.passed if test not in self.resumed]
        for problem in self.problems:
            print(f"FAIL: {problem}")
        if others:
            print("passed without pausing memory through uvm (not counted): "
                  + ", ".join(test.split("::")[-1] for test in others))
        print(f"on uvm: {len(on_uvm)} of {len(self.passed)} passed tests paused and resumed memory through uvm's saver")
        return not self.problems and bool(on_uvm)


def main(argv: list[str]) -> int:
    checkout = Path(argv[0]).resolve()
    sys.path.insert(0, str(checkout))
    alias_uvm()
    report_what_answers()
    test_file = checkout / "tests/unit_tests/inference/engines/test_dynamic_engine.py"
    use = SaverUse()
    status = pytest.main([str(test_file), "-p", "no:cacheprovider", "-q", "-rA", "--rootdir", str(checkout),
                          *argv[1:]], plugins=[TransformerEngineStandIn(test_file), use])
    counted = use.report()
    return status or (0 if counted else 1)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
