"""torch_memory_saver.testing_utils, as uvm answers it: the helpers the original's example programs
and tests call (on CUDA: uvm runs on nothing else)."""
from __future__ import annotations

from .utils import is_xpu  # noqa: F401 - the original's tests import it from here


def get_device() -> str:
    """The device string of the tests' tensors."""
    return "cuda"


def empty_cache() -> None:
    import torch
    torch.cuda.empty_cache()


def get_and_print_gpu_memory(message: str, gpu_id: int = 0) -> int:
    """The device's used memory in bytes, as the driver counts it (every process's), printed with
    `message`."""
    import torch
    used = torch.cuda.device_memory_used(gpu_id)
    print(f"GPU {gpu_id} memory: {used / 1024 ** 3:.2f} GB ({message})")
    return used
