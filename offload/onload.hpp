// The onload behind uvm_onload_ranges, for uvm_resume, which may keep the host copies it brings back.
#pragma once

#include "uvm.h"

namespace uvm {

// uvm_onload_ranges (recorded as that call). With `retain`, the copies in host memory (pinned and
// pageable, not files) stay with their bytes as retained copies once copied back (registry.hpp).
uvm_status onload_ranges(const uvm_range* ranges, size_t count, cudaStream_t stream, bool retain);

}  // namespace uvm
