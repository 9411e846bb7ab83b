"""torch_memory_saver.hooks.mode_preload, as uvm answers it: configure_subprocess, which finds the
interposer through this module's get_binary_path_from_package (a caller may replace it, as the
original's own tests do)."""
from __future__ import annotations

import contextlib

from .. import utils
from ..utils import get_binary_path_from_package  # noqa: F401 - looked up here at each call


@contextlib.contextmanager
def configure_subprocess():
    """Processes started inside preload uvm's interposer (uvm.memory_saver.configure_subprocess):
    LD_PRELOAD names it first, the entries already there kept after it; put back on exit."""
    from uvm import _preload
    path = globals()["get_binary_path_from_package"](utils.PRELOAD_STEM)
    with _preload.child_environment(path):
        yield
