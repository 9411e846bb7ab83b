"""`import torch_memory_saver` answered by uvm.memory_saver: the name under which the original's own
tests and SGLang's adapter reach it, so that they run unmodified on uvm (tests/peers/run_tms_tests.sh,
tests/peers/sglang_adapter.py). Its submodules (torch_memory_saver.utils, .testing_utils,
.entrypoint, .hooks.mode_preload) are uvm's too (uvm.tms_layout): nothing of the original's code
runs under this name, installed or not."""
import uvm.tms_layout as _layout
from uvm.memory_saver import TorchMemorySaver, configure_subprocess, torch_memory_saver

__path__ = list(_layout.__path__)
__all__ = ["TorchMemorySaver", "torch_memory_saver", "configure_subprocess"]
