"""torch_memory_saver's submodules as uvm answers them (uvm.tms_layout), through the peers' alias
(tests/peers/tms_alias) with a stand-in original installed beside it: every `torch_memory_saver.<x>`
import gives uvm's module, never the original's code (issue 58: the alias used to fall through to
it), and the helpers behave as the original's callers expect. No torch, no GPU."""
import os
import subprocess
import sys

from conftest import ROOT, UVM_PATH

ALIAS = ROOT / "tests" / "peers" / "tms_alias"
SUBMODULES = ["utils", "testing_utils", "entrypoint", "hooks", "hooks.mode_preload"]


def run(code: str, tmp_path) -> list[str]:
    original = tmp_path / "original" / "torch_memory_saver"
    (original / "hooks").mkdir(parents=True)
    for name in ["__init__", "utils", "testing_utils", "entrypoint", "hooks/__init__", "hooks/mode_preload"]:
        (original / f"{name}.py").write_text("raise ImportError('the original was imported')\n")
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ALIAS), str(UVM_PATH), str(tmp_path / "original")])}
    result = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr
    return result.stdout.splitlines()


def test_every_submodule_is_uvms_even_with_the_original_installed(tmp_path):
    code = "import importlib\n" + "".join(
        f"m = importlib.import_module('torch_memory_saver.{name}'); print(m.__name__, m.__file__.split('/uvm/')[-1])\n"
        for name in SUBMODULES)
    assert run(code, tmp_path) == [f"torch_memory_saver.{name} tms_layout/{name.replace('.', '/')}"
                                   f"{'/__init__' if name == 'hooks' else ''}.py" for name in SUBMODULES]


def test_configure_subprocess_prepends_the_interposer_keeps_the_rest_and_puts_it_back(tmp_path):
    code = """
import os
import torch_memory_saver.hooks.mode_preload as mode
mode.get_binary_path_from_package = lambda stem: "/interposer/for/" + stem  # as the original's tests patch it
os.environ["LD_PRELOAD"] = "/other/lib.so"
with mode.configure_subprocess():
    print(os.environ["LD_PRELOAD"])
print(os.environ["LD_PRELOAD"])
del os.environ["LD_PRELOAD"]
with mode.configure_subprocess():
    print(os.environ["LD_PRELOAD"])
print("LD_PRELOAD" in os.environ)
"""
    assert run(code, tmp_path) == ["/interposer/for/torch_memory_saver_hook_mode_preload:/other/lib.so", "/other/lib.so",
                                   "/interposer/for/torch_memory_saver_hook_mode_preload", "False"]


def test_change_env_and_the_platform_helpers(tmp_path):
    code = """
import os
from torch_memory_saver.utils import change_env, get_binary_path_from_package
from torch_memory_saver.testing_utils import is_xpu, get_device
os.environ.pop("UVM_LAYOUT_T", None)
with change_env("UVM_LAYOUT_T", "1"):
    print(os.environ["UVM_LAYOUT_T"])
print("UVM_LAYOUT_T" in os.environ)
os.environ["UVM_LAYOUT_T"] = "old"
with change_env("UVM_LAYOUT_T", "new"):
    pass
print(os.environ["UVM_LAYOUT_T"], is_xpu(), get_device())
try:
    get_binary_path_from_package("torch_memory_saver_hook_mode_torch")
except ValueError as error:
    print("refused:", error)
"""
    lines = run(code, tmp_path)
    assert lines[:3] == ["1", "False", "old False cuda"]
    assert lines[3].startswith("refused: uvm provides no 'torch_memory_saver_hook_mode_torch' library")
