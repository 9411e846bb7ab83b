// Sharing releasable memory with other processes (uvm.h, "Sharing with other processes"). The
// exporter's side keeps, per exported allocation, the processes that map it now; moves that would
// take its bytes or memory ask here first, under the moves lock, which the import of the memory
// also takes, so an import and a pause never cross.
#pragma once

#include <cstdint>
#include <vector>

#include "errors.hpp"

namespace uvm {

// UVM_ERROR_SHARED naming the allocation at `base` and its importers if another process maps it.
// `what`: the move, for the message ("an offload"). Under the moves lock.
uvm_status check_not_shared(const Call& call, uintptr_t base, const char* what);

// The allocation at `base` is freed: its export goes (importers keep the memory they map). Under
// the moves lock.
void forget_export(uintptr_t base);

}  // namespace uvm
