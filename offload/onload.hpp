// The onload behind uvm_onload_ranges, for uvm_resume, which may keep the host copies it brings back.
#pragma once

#include "uvm.h"

namespace uvm {

// uvm_onload_ranges, recorded as the call `name` (uvm_resume and uvm_fetch_ranges onload too).
// With `retain`, the copies in host memory (pinned and pageable, not files) stay with their bytes
// as retained copies once copied back (registry.hpp).
uvm_status onload_ranges(const uvm_range* ranges, size_t count, cudaStream_t stream, bool retain,
                         const char* name = "uvm_onload_ranges");

}  // namespace uvm
