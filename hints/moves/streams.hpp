// Streams uvm owns, one set per device, created on first use in the current context and kept for
// the life of the process.
#pragma once

#include <cuda_runtime_api.h>

#include "../../alloc/errors.hpp"
#include "../../alloc/options.hpp"

namespace uvm {

// The most worker streams an onload spreads its copies over (UVM_ONLOAD_STREAMS's upper bound).
constexpr int kMaxWorkerStreams = kMaxOnloadStreams;

// The legacy NULL stream or its alias.
inline bool is_legacy_stream(cudaStream_t stream) {
  return stream == nullptr || stream == cudaStreamLegacy;
}

// The driver rejects the legacy NULL stream for the batch calls (discard: cudaErrorInvalidValue). A blocking stream synchronizes with the legacy stream both ways, so work
// issued on it keeps the caller's legacy-stream order exactly. For the current device.
uvm_status ordering_stream(const Call& call, cudaStream_t* out);

// `count` (at most kMaxWorkerStreams) non-blocking streams of the current device for the onload
// pipeline; callers join them to their own stream with events before and after.
uvm_status worker_streams(const Call& call, int count, cudaStream_t* out);

}  // namespace uvm
