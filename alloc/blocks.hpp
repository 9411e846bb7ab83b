// Blocks a runtime cuts out of uvm allocations (uvm.h, "Blocks"): what allocation needs to know,
// and the bodies of uvm_block_allocated and uvm_block_freed (whose entries, in offload/free.cpp,
// also give back the pinned staging memory of host copies that die with a block).
#pragma once

#include <cstddef>

#include "errors.hpp"

namespace uvm {

// A block [ptr, ptr + size) handed out, or taken back, by the runtime: what uvm kept of the bytes'
// earlier owner goes. `dropped_pinned`: a copy of them in pinned staging memory went.
uvm_status block_allocated(const Call& call, const void* ptr, size_t size, bool* dropped_pinned);
uvm_status block_freed(const Call& call, const void* ptr, size_t size, bool* dropped_pinned);

// Whether uvm_report_blocks is on: allocations made now have every block reported.
bool blocks_are_reported();

}  // namespace uvm
