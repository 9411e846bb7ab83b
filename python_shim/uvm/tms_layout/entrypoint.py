"""torch_memory_saver.entrypoint, as uvm answers it: the class and the process-wide instance."""
from uvm.memory_saver import TorchMemorySaver, torch_memory_saver  # noqa: F401
