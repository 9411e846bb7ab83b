// Blocks a runtime cuts out of uvm allocations (uvm.h, "Blocks"): what allocation needs to know.
#pragma once

namespace uvm {

// Whether uvm_report_blocks is on: allocations made now have every block reported.
bool blocks_are_reported();

}  // namespace uvm
