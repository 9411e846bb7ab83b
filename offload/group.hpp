// Groups of moves (uvm_begin_moves, uvm_end_moves): a caller that gathers its ranges while the copies
// of the ranges it already gave run (the Python shim moving a module's tensors) makes several move
// calls that are one move to it.
#pragma once

namespace uvm {

// After an offload that staged bytes: frees the staging blocks left holding nothing in the
// background now, or, inside a group of moves, once the group ends. Freed after each call of a
// group, the blocks that the group's later calls were about to fill would be pinned again.
void free_unused_staging_after_offload();

}  // namespace uvm
