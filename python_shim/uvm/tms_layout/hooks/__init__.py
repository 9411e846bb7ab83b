"""torch_memory_saver.hooks, as uvm answers it (hooks.mode_preload)."""
