"""Shared helpers: every test that needs fresh module state runs Python in a child process with its
own cache directory.

The tests import uvm from the source tree (python_shim/), or with UVM_TEST_INSTALLED=1 the package
pip installed into the interpreter that runs them (scripts/test_wheel.sh: what users run). UVM_PATH
is the folder that holds the uvm they test; children get it on PYTHONPATH."""
import importlib.util
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
SHIM = ROOT / "python_shim"
INSTALLED = os.environ.get("UVM_TEST_INSTALLED") == "1"


def _uvm_path() -> Path:
    if not INSTALLED:
        return SHIM
    spec = importlib.util.find_spec("uvm")
    if spec is None or spec.origin is None or Path(spec.origin).resolve().is_relative_to(SHIM):
        raise RuntimeError(f"UVM_TEST_INSTALLED=1 but {sys.executable} has no installed uvm (found {spec and spec.origin})")
    return Path(spec.origin).resolve().parents[1]


UVM_PATH = _uvm_path()
if not INSTALLED and str(SHIM) not in sys.path:
    # Tests that import uvm in this process see the tree too, as their children do (UVM_PATH): without
    # it they failed on the import, and a mutant they were to catch counted as killed for nothing.
    sys.path.insert(0, str(SHIM))


def python(code: str, env: dict | None = None, timeout: float = 120, check: bool = True):
    """Runs `code` with the shim importable; returns the CompletedProcess."""
    full_env = {**os.environ, "PYTHONPATH": str(UVM_PATH), **(env or {})}
    result = subprocess.run([sys.executable, "-c", code], env=full_env, capture_output=True, text=True,
                            timeout=timeout)
    if check and result.returncode != 0:
        raise AssertionError(f"child failed ({result.returncode}):\n{result.stdout}\n{result.stderr}")
    return result


@pytest.fixture
def cache(tmp_path):
    """An empty cache directory, and the environment that points uvm at it."""
    directory = tmp_path / "cache"
    return directory, {"UVM_CACHE_DIR": str(directory), "UVM_LIBRARY": "", "UVM_CXX": "",
                       "UVM_COMPILE_TIMEOUT_S": "", "UVM_PREBUILT": "0"}


def builds(directory: Path) -> int:
    log = directory / "builds.log"
    return len(log.read_text().splitlines()) if log.exists() else 0
