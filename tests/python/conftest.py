"""Shared helpers: every test that needs fresh module state runs Python in a child process with its
own cache directory."""
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
SHIM = ROOT / "python_shim"


def python(code: str, env: dict | None = None, timeout: float = 120, check: bool = True):
    """Runs `code` with the shim importable; returns the CompletedProcess."""
    full_env = {**os.environ, "PYTHONPATH": str(SHIM), **(env or {})}
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
                       "UVM_COMPILE_TIMEOUT_S": ""}


def builds(directory: Path) -> int:
    log = directory / "builds.log"
    return len(log.read_text().splitlines()) if log.exists() else 0
