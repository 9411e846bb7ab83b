// uvm_offload_ranges and uvm_onload_ranges: moving memory off a GPU and back, by migration
// (prefetch) or by staging (copy out to pinned memory + discard; populate + copy back).
#include <algorithm>
#include <utility>
#include <vector>

#include "../alloc/cuda_compat.hpp"
#include "../alloc/staging.hpp"
#include "../alloc/stats.hpp"
#include "discard_batch.hpp"
#include "plan.hpp"
#include "ranges.hpp"
#include "streams.hpp"

namespace uvm {
namespace {

// A staged piece to copy back, with the range it belongs to (for accounting).
struct StagedWork {
  HintRange range;
  StagedPiece piece;
};

// One stream belongs to one device, so one call moves the memory of one device.
uvm_status single_device(const Call& call, const std::vector<HintRange>& ranges, int* device) {
  *device = ranges.front().owner_device;
  for (const HintRange& range : ranges) {
    if (range.owner_device != *device) {
      return fail(call, UVM_ERROR_INVALID_ARGUMENT,
                  "the ranges belong to devices %d and %d; move each device's ranges in a call of its "
                  "own, on a stream of that device",
                  *device, range.owner_device);
    }
  }
  return UVM_OK;
}

HintRange clipped(const HintRange& range, const Span& span) {
  HintRange piece = range;
  piece.begin = span.begin;
  piece.end = span.end;
  return piece;
}

std::vector<Span> spans_of(const std::vector<StagedPiece>& pieces) {
  std::vector<Span> spans;
  for (const StagedPiece& piece : pieces) spans.push_back(piece.span);
  return spans;
}

// Validates, merges, checks the one device and its support, and enters its context.
uvm_status prepare(const Call& call, const uvm_range* ranges, size_t count, cudaStream_t stream,
                   std::vector<HintRange>* merged, int* device, DeviceCaps* caps, ContextScope* scope) {
  std::vector<HintRange> resolved;
  if (uvm_status s = resolve_ranges(call, ranges, count, &resolved)) return s;
  if (resolved.empty()) return UVM_OK;
  *merged = coalesce(std::move(resolved), kMergeGapBytes);
  if (uvm_status s = single_device(call, *merged, device)) return s;
  if (uvm_status s = check_hint_support(call, *device, caps)) return s;
  // The device's own context, so that uvm's streams and events belong with the caller's stream.
  if (uvm_status s = scope->enter(call, *device, ContextScope::When::always)) return s;
  return check_not_capturing(call, stream);
}

// Copies every piece into pinned staging memory, then discards it on the device, all in `stream`
// order: 50–52 GB/s on an H100, against 10–16 GB/s for a prefetch to the CPU.
uvm_status offload_staged(const Call& call, const std::vector<HintRange>& pieces, cudaStream_t stream) {
  std::vector<Span> spans;
  for (const HintRange& piece : pieces) spans.push_back(Span{piece.begin, piece.end});
  std::vector<char*> hosts;
  std::vector<EventRef> reused;
  if (uvm_status s = staging().reserve(call, spans, &hosts, &reused)) return s;
  auto give_up = [&](uvm_status status) {
    staging().cancel(spans, hosts);
    return status;
  };
  for (const EventRef& read : reused) {
    if (cudaError_t e = cudaStreamWaitEvent(stream, read->handle, 0)) {
      return give_up(fail_cuda(call, e, "cudaStreamWaitEvent (staging memory still being read)"));
    }
  }
  for (size_t i = 0; i < pieces.size(); ++i) {
    const void* ptr = reinterpret_cast<const void*>(spans[i].begin);
    if (cudaError_t e = cudaMemcpyAsync(hosts[i], ptr, spans[i].size(), cudaMemcpyDefault, stream)) {
      return give_up(fail_cuda(call, e, "cudaMemcpyAsync(%p → pinned staging, %zu bytes)", ptr, spans[i].size()));
    }
  }
  if (uvm_status s = discard_batch(call, pieces, stream)) return give_up(s);
  EventRef written;
  if (record_event(call, stream, &written) != UVM_OK) {
    // The copies and the discard are issued; without an event, wait for them here instead.
    if (cudaError_t e = cudaStreamSynchronize(stream)) return fail_cuda(call, e, "cudaStreamSynchronize");
  }
  staging().commit(spans, hosts, written);
  for (const HintRange& piece : pieces) account_move(piece, Move::staged, 0);
  return UVM_OK;
}

// Copies staged pieces back, chunk by chunk on uvm's worker streams: prefetch, copy, prefetch.
// - The prefetch before the copy populates the chunk. Copying into discarded pages without it
//   faults page by page (0.6 GB/s on an H100); populating everything first and copying after is as
//   slow whenever the driver has not yet reclaimed the discarded pages. Chunk by chunk it ran
//   37–47 GB/s in every case measured.
// - The prefetch after the copy undoes the discard. A copy's writes restore the data but leave the
//   driver treating the pages as discardable, and the prefetch before it does not reliably clear
//   that (it did not for the first chunk on each stream): a later prefetch to the CPU, or an
//   eviction, would then drop the data and read back zeros. Measured with
//   `transfer_probe … hazard` (docs/performance.md); once the pages hold the data the prefetch
//   moves nothing and costs no bandwidth.
uvm_status copy_back(const Call& call, int device, const std::vector<StagedWork>& work, cudaStream_t stream) {
  const OnloadPipeline pipeline = onload_pipeline();
  cudaStream_t workers[8] = {};
  if (uvm_status s = worker_streams(call, pipeline.streams, workers)) return s;
  EventRef start;
  if (uvm_status s = record_event(call, stream, &start)) return s;
  std::vector<cudaEvent_t> before = {start->handle};
  for (const StagedWork& w : work) {
    if (w.piece.written && std::find(before.begin(), before.end(), w.piece.written->handle) == before.end()) {
      before.push_back(w.piece.written->handle);
    }
  }
  for (int i = 0; i < pipeline.streams; ++i) {
    for (cudaEvent_t event : before) {
      if (cudaError_t e = cudaStreamWaitEvent(workers[i], event, 0)) return fail_cuda(call, e, "cudaStreamWaitEvent");
    }
  }
  size_t issued = 0;
  std::vector<size_t> chunks_of(work.size());
  for (size_t k = 0; k < work.size(); ++k) {
    const StagedWork& w = work[k];
    const auto chunks = split_into_chunks({w.piece.span}, pipeline.chunk_bytes);
    chunks_of[k] = chunks.size();
    for (const Span& chunk : chunks) {
      cudaStream_t worker = workers[issued++ % pipeline.streams];
      void* ptr = reinterpret_cast<void*>(chunk.begin);
      if (cudaError_t e = prefetch_to(ptr, chunk.size(), device, worker)) {
        return fail_cuda(call, e, "cudaMemPrefetchAsync(%p, %zu bytes) populating before the copy", ptr, chunk.size());
      }
      const char* host = w.piece.host + (chunk.begin - w.piece.span.begin);
      if (cudaError_t e = cudaMemcpyAsync(ptr, host, chunk.size(), cudaMemcpyDefault, worker)) {
        return fail_cuda(call, e, "cudaMemcpyAsync(pinned staging → %p, %zu bytes)", ptr, chunk.size());
      }
      if (cudaError_t e = prefetch_to(ptr, chunk.size(), device, worker)) {
        return fail_cuda(call, e, "cudaMemPrefetchAsync(%p, %zu bytes) undoing the discard after the copy", ptr,
                         chunk.size());
      }
    }
  }
  for (int i = 0; i < pipeline.streams && static_cast<size_t>(i) < issued; ++i) {
    EventRef done;
    if (uvm_status s = record_event(call, workers[i], &done)) return s;
    if (cudaError_t e = cudaStreamWaitEvent(stream, done->handle, 0)) return fail_cuda(call, e, "cudaStreamWaitEvent");
  }
  EventRef read;
  if (uvm_status s = record_event(call, stream, &read)) return s;
  for (size_t k = 0; k < work.size(); ++k) {
    staging().release(work[k].piece.span.begin, work[k].piece.span.end, read);
    account_move(work[k].range, Move::to_device, chunks_of[k]);
  }
  return UVM_OK;
}

uvm_status offload(const Call& call, const uvm_range* ranges, size_t count, uvm_strategy requested,
                   cudaStream_t stream) {
  if (requested != UVM_STRATEGY_AUTO && requested != UVM_STRATEGY_MIGRATE && requested != UVM_STRATEGY_STAGED) {
    return fail(call, UVM_ERROR_INVALID_ARGUMENT, "strategy %d is not a uvm_strategy", static_cast<int>(requested));
  }
  std::vector<HintRange> merged;
  int device = 0;
  DeviceCaps caps;
  ContextScope scope;
  if (uvm_status s = prepare(call, ranges, count, stream, &merged, &device, &caps, &scope)) return s;
  if (merged.empty()) return UVM_OK;
  const uvm_strategy strategy = choose_strategy(requested, caps.discard_supported);
  if (strategy == UVM_STRATEGY_STAGED && !caps.discard_supported) {
    return fail(call, UVM_ERROR_UNSUPPORTED,
                "staged offload discards the device pages, which needs a CUDA 13 runtime and driver; "
                "use UVM_STRATEGY_AUTO or UVM_STRATEGY_MIGRATE");
  }
  // Bytes already staged are off the device; the rest moves.
  std::vector<HintRange> pieces;
  for (const HintRange& range : merged) {
    const auto staged = spans_of(staging().overlapping(range.begin, range.end));
    for (const Span& span : subtract(Span{range.begin, range.end}, staged)) pieces.push_back(clipped(range, span));
  }
  if (pieces.empty()) return UVM_OK;
  if (strategy == UVM_STRATEGY_STAGED) return offload_staged(call, pieces, stream);
  return prefetch_each(call, pieces, UVM_LOCATION_CPU, stream);
}

uvm_status onload(const Call& call, const uvm_range* ranges, size_t count, cudaStream_t stream) {
  std::vector<HintRange> merged;
  int device = 0;
  DeviceCaps caps;
  ContextScope scope;
  if (uvm_status s = prepare(call, ranges, count, stream, &merged, &device, &caps, &scope)) return s;
  std::vector<StagedWork> staged;
  std::vector<HintRange> migrated;
  for (const HintRange& range : merged) {
    const auto pieces = staging().overlapping(range.begin, range.end);
    for (const StagedPiece& piece : pieces) staged.push_back(StagedWork{clipped(range, piece.span), piece});
    for (const Span& span : subtract(Span{range.begin, range.end}, spans_of(pieces))) {
      migrated.push_back(clipped(range, span));
    }
  }
  if (!staged.empty()) {
    if (uvm_status s = copy_back(call, device, staged, stream)) return s;
  }
  return prefetch_each(call, migrated, device, stream);
}

}  // namespace
}  // namespace uvm

extern "C" {

uvm_status uvm_offload_ranges(const uvm_range* ranges, size_t count, uvm_strategy strategy,
                              cudaStream_t stream) {
  const uvm::Call call = uvm::Call::of("uvm_offload_ranges").with_size(count);
  return uvm::guarded(call, [&] { return uvm::offload(call, ranges, count, strategy, stream); });
}

uvm_status uvm_onload_ranges(const uvm_range* ranges, size_t count, cudaStream_t stream) {
  const uvm::Call call = uvm::Call::of("uvm_onload_ranges").with_size(count);
  return uvm::guarded(call, [&] { return uvm::onload(call, ranges, count, stream); });
}

}  // extern "C"
