// The onload behind uvm_onload_ranges, for uvm_resume (which may keep the host copies it brings
// back), uvm_fetch_ranges and the selection entries.
#pragma once

#include "../../hints/moves/begin.hpp"
#include "uvm.h"

namespace uvm {

// How an onload runs: uvm_onload_ranges, uvm_resume (may retain) or uvm_fetch_ranges (retains,
// beside compute).
struct OnloadMode {
  const char* name = "uvm_onload_ranges";  // the call it is recorded as
  // The copies in host memory (pinned and pageable, not files) stay with their bytes as retained
  // copies once copied back (registry.hpp).
  bool retain = false;
  // It runs beside the kernels of the layers before it (streaming): under UVM_ONLOAD_COPY=auto it
  // copies with the copy engine, whose copies take no SMs from them (the kernel's did, and the
  // streamed model ran slower). And it copies on one stream in chunks of at least
  // kFetchChunkBytes: fetches are queued ahead of use, so more streams only interleave them
  // (docs/measurements.md, "Streaming a model larger than its budget").
  bool beside_compute = false;
};

constexpr size_t kFetchChunkBytes = size_t{256} << 20;

// uvm_onload_ranges, as `mode` says.
uvm_status onload_ranges(const uvm_range* ranges, size_t count, cudaStream_t stream, const OnloadMode& mode = {});

// Its body, for what `args` names (a selection: selection.cpp, uvm_resume), recorded by the caller.
uvm_status onload_moves(const Call& call, const MoveArgs& args, cudaStream_t stream, const OnloadMode& mode = {});

}  // namespace uvm
