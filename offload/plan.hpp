// Planning for offload and onload, kept free of CUDA calls so that it is tested on its own: which
// strategy runs, which bytes still need moving, and how the onload pipeline cuts its work.
#pragma once

#include <cstddef>
#include <vector>

#include "../alloc/span_set.hpp"
#include "../hints/streams.hpp"
#include "uvm.h"

namespace uvm {

// AUTO becomes STAGED where discard works (measured on an H100: 50–52 GB/s offload against 10–16
// for migration), else MIGRATE. Others stay as asked.
uvm_strategy choose_strategy(uvm_strategy requested, bool discard_supported);

// The parts of `range` that no span of `covered` (sorted, disjoint) covers.
std::vector<Span> subtract(const Span& range, const std::vector<Span>& covered);

// Cuts `spans` into consecutive pieces of at most `chunk_bytes`.
std::vector<Span> split_into_chunks(const std::vector<Span>& spans, size_t chunk_bytes);

// How onload copies staged bytes back: chunks of up to chunk_bytes, each populated (prefetched),
// copied and prefetched again on one of `streams` in turn. Env UVM_ONLOAD_CHUNK_MIB (1–4096,
// default 64) and UVM_ONLOAD_STREAMS (1–kMaxWorkerStreams, default 4) override, read once; a
// malformed value keeps the default. `batch_prefetch`: a chunk's ranges are prefetched by one
// cudaMemPrefetchBatchAsync (CUDA 13) instead of one call each; env UVM_ONLOAD_PREFETCH=each turns it off.
struct OnloadPipeline {
  size_t chunk_bytes;
  int streams;
  bool batch_prefetch = true;
};
OnloadPipeline onload_pipeline();
OnloadPipeline parse_onload_pipeline(const char* chunk_mib, const char* streams, const char* prefetch = nullptr);

}  // namespace uvm

namespace uvm {

// A staged piece to copy back: its bytes, the uvm allocation holding them, its host copy, and
// whether the allocation is managed (else releasable: device memory, mapped before its copies).
struct CopyPiece {
  Span span;
  uintptr_t allocation = 0;
  const char* host = nullptr;
  bool managed = true;
};

// One step of an onload on one worker stream: the `populate` ranges are prefetched to the device,
// each of `copies` (inside them) is copied back, and the `populate` ranges are prefetched again.
struct OnloadChunk {
  std::vector<Span> populate;  // by address; each inside one allocation
  std::vector<CopyPiece> copies;
  size_t bytes() const;
};

// Cuts `pieces` (sorted by address, disjoint) into chunks of at most `chunk_bytes`.
// - Managed pieces fill a chunk across allocations: thousands of small allocations (PyTorch serves
//   tensors up to 1 MiB from 2 MiB segments) then take a few chunks, not one each. On an H100 a
//   2 MiB chunk of its own spent 120–170 µs populating and 80–130 µs in the prefetch after its
//   copy, which moves nothing: 2 GiB of 512 KiB tensors came back at 19 GB/s.
// - Pieces of one allocation that touch share a populate range; a gap between pieces is never
//   populated: prefetching a gap together with the pieces around it lost data on an H200 (zeros
//   from a 64 KiB boundary on, 1 run in 12), where prefetching exactly the copied bytes never did.
// - A releasable allocation's pieces have chunks of their own, since each such chunk first maps
//   its allocation.
std::vector<OnloadChunk> plan_onload(const std::vector<CopyPiece>& pieces, size_t chunk_bytes);

}  // namespace uvm
