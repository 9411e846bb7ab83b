// Planning for offload and onload, kept free of CUDA calls so that it is tested on its own: which
// strategy runs, which bytes still need moving, and how the onload pipeline cuts its work.
#pragma once

#include <cstddef>
#include <functional>
#include <vector>

#include "../alloc/span_set.hpp"
#include "uvm.h"

namespace uvm {

// AUTO becomes STAGED where discard works (measured on an H100: 50–52 GB/s offload against 10–16
// for migration), else MIGRATE. Others stay as asked.
uvm_strategy choose_strategy(uvm_strategy requested, bool discard_supported);

// The parts of `range` that no span of `covered` (sorted, disjoint) covers.
std::vector<Span> subtract(const Span& range, const std::vector<Span>& covered);

// Cuts `spans` into consecutive pieces of at most `chunk_bytes`.
std::vector<Span> split_into_chunks(const std::vector<Span>& spans, size_t chunk_bytes);

// The most worker streams an onload spreads its copies over (UVM_ONLOAD_STREAMS's upper bound).
constexpr int kMaxOnloadStreams = 8;

// How onload copies staged bytes back: pieces of chunk_bytes, each populated (prefetched) and then
// copied on one of `streams` in turn. Env UVM_ONLOAD_CHUNK_MIB (1–4096, default 64) and
// UVM_ONLOAD_STREAMS (1–kMaxOnloadStreams, default 4) override, read once; a malformed value keeps
// the default.
struct OnloadPipeline {
  size_t chunk_bytes;
  int streams;
};
OnloadPipeline onload_pipeline();
OnloadPipeline parse_onload_pipeline(const char* chunk_mib, const char* streams);

}  // namespace uvm

namespace uvm {

// A staged piece to copy back: its managed bytes, the uvm allocation holding them, its host copy.
struct CopyPiece {
  Span span;
  uintptr_t allocation = 0;
  const char* host = nullptr;
};

// One step of an onload on one worker stream: `populate` is prefetched to the device, each of
// `copies` (pieces of pieces, inside `populate`) is copied back, and `populate` is prefetched again.
struct OnloadChunk {
  Span populate;
  std::vector<CopyPiece> copies;
};

// Pieces closer than this inside one allocation share their populate prefetches (gap included).
// Measured on an H200 with the 4 GiB benchmark model (1,027 tensors, biases of 2·hidden bytes
// leave gaps): three calls per piece cut the onload from 44 to 25 GB/s.
constexpr size_t kPopulateGapBytes = size_t{1} << 20;

// Cuts `pieces` (sorted by address, disjoint) into chunks of at most `chunk_bytes` of address space.
// Consecutive pieces of one allocation join one populate span when the gap between them is at most
// `max_gap` and `gap_is_resident(gap)` says uvm moved none of its bytes off the device: prefetching
// such a gap to the device moves nothing and changes no byte, while the copies stay exact (a gap
// is never written). A piece longer than a chunk is split.
std::vector<OnloadChunk> plan_onload(const std::vector<CopyPiece>& pieces, size_t chunk_bytes, size_t max_gap,
                                     const std::function<bool(const Span&)>& gap_is_resident);

}  // namespace uvm
