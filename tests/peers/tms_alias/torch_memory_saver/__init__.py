"""`import torch_memory_saver` answered by uvm.memory_saver: the name under which the original's own
tests and SGLang's adapter reach it, so that they run unmodified on uvm (tests/peers/run_tms_tests.sh,
tests/peers/sglang_adapter.py). Only the entry points come from uvm; the original's pure-Python
test helpers (torch_memory_saver.utils, .testing_utils) come from its wheel, which must be on
sys.path after this folder."""
import os
import sys

from uvm.memory_saver import TorchMemorySaver, configure_subprocess, torch_memory_saver

_here = os.path.dirname(os.path.abspath(__file__))
for _entry in sys.path:
    _original = os.path.join(os.path.abspath(_entry or "."), "torch_memory_saver")
    if _original != _here and os.path.isfile(os.path.join(_original, "testing_utils.py")):
        __path__.append(_original)  # the helpers' submodules, not the original's entry points
        break

__all__ = ["TorchMemorySaver", "torch_memory_saver", "configure_subprocess"]
