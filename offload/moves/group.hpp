// Groups of moves (uvm_begin_moves, uvm_end_moves): a caller that gathers its ranges while the copies
// of the ranges it already gave run (the Python shim moving a module's tensors) makes several move
// calls that are one move to it.
#pragma once

#include <cstddef>

namespace uvm {

// After an offload that staged bytes: frees the staging blocks left holding nothing in the
// background now, or, inside a group of moves, once the group ends. Freed after each call of a
// group, the blocks that the group's later calls were about to fill would be pinned again.
void free_unused_staging_after_offload();

// Inside a group that expects to stage more than its offloads have reserved so far and `wanted`
// bytes more: the rest, which an offload that must pin staging anyway pins too (in steps, which
// the group's later calls fill as they are pinned). 0 outside a group.
size_t staging_to_pin_ahead(size_t wanted);

// An offload of the open group (if any) reserved `bytes` of staging.
void note_staging_reserved(size_t bytes);

}  // namespace uvm
