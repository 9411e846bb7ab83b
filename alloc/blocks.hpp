// Blocks a runtime cuts out of uvm allocations (uvm.h, "Blocks"): what allocation needs to know.
// What a block's lifetime does to the bytes' host copies (uvm_block_allocated, uvm_block_freed) is
// offload's, in offload/moves/free.cpp.
#pragma once

namespace uvm {

// Whether uvm_report_blocks is on: allocations made now have every block reported.
bool blocks_are_reported();

}  // namespace uvm
