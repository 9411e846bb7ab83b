"""vLLM's general plugin (entry point `vllm.general_plugins: uvm = uvm.vllm_plugin:register`): vLLM runs
it in each of its processes. A module of its own because it joins the switch (uvm._switch, which
imports uvm.vllm when vLLM's cumem module loads) and uvm.vllm, neither of which imports the other's
importer."""
from __future__ import annotations

import sys

from . import _switch, vllm


def register() -> None:
    """With UVM_SWITCH naming vllm, puts uvm's allocator in place: now if vLLM's cumem module is
    loaded, else as it is imported (the switch's import hook). Otherwise does nothing. Idempotent;
    never touches CUDA."""
    _switch.install()
    if vllm.CUMEM_MODULE not in _switch.active():
        return
    module = sys.modules.get(vllm.CUMEM_MODULE)
    if module is not None:
        vllm.patch(module)
