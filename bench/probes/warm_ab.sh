# A cache hit of the JIT build (uvm._build.build(), fresh processes, taking turns) of the shim in
# .deps/jit_before (an older commit's python_shim and sources, from git archive) and of this tree.
# Prints one line per run: the tree and seconds.
#   git archive <commit> python_shim/uvm sources.txt alloc share hints offload include | tar -x -C .deps/jit_before
set -u
code='import time, uvm._build as b
t = time.perf_counter(); b.build(); print(time.perf_counter() - t)'
for tree in .deps/jit_before/python_shim python_shim; do
  export UVM_CACHE_DIR=/tmp/warm-cache-$(echo $tree | tr / _); PYTHONPATH=$tree python3 -c "$code" > /dev/null
done
for round in 1 2 3 4 5 6 7; do
  for tree in .deps/jit_before/python_shim python_shim; do
    export UVM_CACHE_DIR=/tmp/warm-cache-$(echo $tree | tr / _)
    echo "$tree $(PYTHONPATH=$tree python3 -c "$code")"
  done
done
