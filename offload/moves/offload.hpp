// The body of uvm_offload_ranges, for every entry that offloads: ranges, a selection
// (selection.cpp) and uvm_pause.
#pragma once

#include "../../hints/moves/begin.hpp"
#include "../media/copies.hpp"

namespace uvm {

// Whether `strategy` is a uvm_strategy.
bool is_strategy(int strategy);

// Offloads what `args` names with `strategy` on `stream`.
uvm_status offload_moves(const Call& call, const MoveArgs& args, int strategy, cudaStream_t stream);

// Offloads what `args` names into compressed copies kept in `kept` memory (uvm_pause of
// allocations made with uvm_set_thread_compression(1)); where the coder cannot run, into plain ones.
uvm_status offload_compressed(const Call& call, const MoveArgs& args, Kept kept, cudaStream_t stream);

}  // namespace uvm
