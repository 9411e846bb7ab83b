"""torch_memory_saver's module layout, answered by uvm: what callers of the original import besides
its top-level names (`torch_memory_saver.utils`, `.testing_utils`, `.entrypoint`,
`.hooks.mode_preload`). The switch (uvm._switch) makes this folder the switched package's only
search path, so that no `torch_memory_saver.<submodule>` import reaches the original's code. Each
module is uvm's own, with the names the original's users and tests reach."""
