// uvm_offload_ranges and uvm_onload_ranges: moving memory off a GPU and back, by migration
// (prefetch) or by staging (copy out to pinned memory + discard; populate + copy back).
#include <algorithm>
#include <set>
#include <utility>
#include <vector>

#include "../alloc/cuda_compat.hpp"
#include "../alloc/staging.hpp"
#include "../alloc/stats.hpp"
#include "discard_batch.hpp"
#include "order.hpp"
#include "plan.hpp"
#include "release.hpp"
#include "ranges.hpp"
#include "streams.hpp"

namespace uvm {
namespace {

// A staged piece to copy back, with the range it belongs to (for accounting).
struct StagedWork {
  HintRange range;
  StagedPiece piece;
};

// The merged ranges of one call, all of one device: one stream belongs to one device.
struct Target {
  std::vector<HintRange> merged;
  int device = 0;
  DeviceCaps caps;
};

// Validates and merges the ranges, checks they belong to one device (named in order, not by heap
// address) and that it supports hints.
uvm_status resolve_target(const Call& call, const uvm_range* ranges, size_t count, Target* target) {
  if (uvm_status s = resolve_and_coalesce(call, ranges, count, &target->merged)) return s;
  if (target->merged.empty()) return UVM_OK;
  int lowest = target->merged.front().owner_device, highest = lowest;
  for (const HintRange& range : target->merged) {
    lowest = std::min(lowest, range.owner_device);
    highest = std::max(highest, range.owner_device);
  }
  if (lowest != highest) {
    return fail(call, UVM_ERROR_INVALID_ARGUMENT,
                "the ranges belong to devices %d and %d; move each device's ranges in a call of its "
                "own, on a stream of that device",
                lowest, highest);
  }
  target->device = lowest;
  return check_hint_support(call, target->device, &target->caps);
}

// The device's own context, so that uvm's streams and events belong with the caller's stream.
uvm_status enter_device(const Call& call, int device, cudaStream_t stream, ContextScope* scope) {
  if (uvm_status s = scope->enter(call, device, ContextScope::When::always)) return s;
  return check_not_capturing(call, stream);
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

std::vector<Span> spans_of(const std::vector<HintRange>& ranges) {
  std::vector<Span> spans;
  for (const HintRange& range : ranges) spans.push_back(Span{range.begin, range.end});
  return spans;
}

// What an offload still has to move (bytes already staged are off the device), split into what is
// staged and what is migrated: only uvm's own allocations are staged, since a host copy must die
// with its memory and uvm cannot see a cudaFree of memory it did not allocate. Releasable memory is
// not managed, so it is always staged.
void pieces_to_move(const std::vector<HintRange>& merged, bool staging_wanted, std::vector<HintRange>* staged,
                    std::vector<HintRange>* migrated) {
  for (const HintRange& range : merged) {
    const bool stage = range.releasable || (staging_wanted && range.allocation != 0);
    for (const Span& span : subtract(Span{range.begin, range.end}, spans_of(staging().overlapping(range.begin, range.end)))) {
      (stage ? staged : migrated)->push_back(clipped(range, span));
    }
  }
}

bool any_managed(const std::vector<HintRange>& ranges) {
  return std::any_of(ranges.begin(), ranges.end(), [](const HintRange& r) { return !r.releasable; });
}

std::vector<HintRange> managed_only(const std::vector<HintRange>& ranges) {
  std::vector<HintRange> managed;
  for (const HintRange& range : ranges) {
    if (!range.releasable) managed.push_back(range);
  }
  return managed;
}

// MIGRATE moves managed pages; releasable memory is device memory, which only staging can move.
uvm_status check_no_releasable(const Call& call, const std::vector<HintRange>& merged) {
  for (const HintRange& range : merged) {
    if (!range.releasable) continue;
    return fail(call, UVM_ERROR_INVALID_ARGUMENT,
                "the range at %p is in a releasable allocation (device memory, not managed), which "
                "cannot migrate; offload it with UVM_STRATEGY_AUTO or UVM_STRATEGY_STAGED",
                reinterpret_cast<void*>(range.begin));
  }
  return UVM_OK;
}

// Explicit STAGED only for uvm's own allocations: a host copy must die with its memory.
uvm_status check_all_uvm_allocations(const Call& call, const std::vector<HintRange>& merged) {
  for (const HintRange& range : merged) {
    if (range.allocation != 0) continue;
    return fail(call, UVM_ERROR_INVALID_ARGUMENT,
                "the range at %p (%zu bytes) is managed memory not allocated by uvm: a staged host copy "
                "must die with its memory, and uvm cannot see such memory freed; offload it with "
                "UVM_STRATEGY_AUTO or UVM_STRATEGY_MIGRATE",
                reinterpret_cast<void*>(range.begin), static_cast<size_t>(range.end - range.begin));
  }
  return UVM_OK;
}

// An event recorded on `stream` now, or null if none could be had (the caller then waits for the
// stream instead); records no error.
EventRef try_record(cudaStream_t stream) {
  auto event = std::make_shared<CudaEvent>();
  if (clear_cuda_error(cudaEventCreateWithFlags(&event->handle, cudaEventDisableTiming)) != cudaSuccess) {
    event->handle = nullptr;
    return nullptr;
  }
  if (clear_cuda_error(cudaEventRecord(event->handle, stream)) != cudaSuccess) return nullptr;
  return event;
}

// Copies every piece into pinned staging memory, then discards it on the device, all in `stream`
// order: 50–52 GB/s on an H100, against 10–16 GB/s for a prefetch to the CPU. Marks in `done` where
// each releasable allocation's copies end, so that its memory can go back before the later copies
// finish.
uvm_status offload_staged(const Call& call, const std::vector<HintRange>& pieces, cudaStream_t stream,
                          CopiesDone* done) {
  const std::vector<Span> spans = spans_of(pieces);
  std::vector<char*> hosts;
  std::vector<EventRef> reused;
  if (uvm_status s = staging().reserve(call, spans, &hosts, &reused)) return s;
  // On a failure, copies already issued may still be writing into the reserved host bytes: wait for
  // them before the bytes can be handed out again. The data stays where it was, on the device.
  auto give_up = [&](uvm_status status) {
    clear_cuda_error(cudaStreamSynchronize(stream));
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
    const bool last_of_allocation = i + 1 == pieces.size() || pieces[i + 1].allocation != pieces[i].allocation;
    if (pieces[i].releasable && last_of_allocation) {
      if (EventRef copied = try_record(stream)) (*done)[pieces[i].allocation] = copied;
    }
  }
  const std::vector<HintRange> managed = managed_only(pieces);
  if (!managed.empty()) {
    if (uvm_status s = discard_batch(call, managed, stream)) return give_up(s);
  }
  // Issued in stream order, the copies come before the discard: from here on the host copy is all
  // there is of these bytes, so it is kept even if waiting for it fails.
  EventRef written;
  const uvm_status marked = mark_or_wait(call, stream, &written);
  staging().commit(spans, hosts, written);
  for (const HintRange& piece : pieces) account_move(piece, Move::staged, 0);
  record_moves(pieces, written);
  return marked;
}

uvm_status offload(const Call& call, const uvm_range* ranges, size_t count, int requested, cudaStream_t stream) {
  if (requested != UVM_STRATEGY_AUTO && requested != UVM_STRATEGY_MIGRATE && requested != UVM_STRATEGY_STAGED) {
    return fail(call, UVM_ERROR_INVALID_ARGUMENT, "strategy %d is not a uvm_strategy", requested);
  }
  Target sizing;
  if (uvm_status s = resolve_target(call, ranges, count, &sizing)) return s;
  if (sizing.merged.empty()) return UVM_OK;
  ContextScope scope;
  if (uvm_status s = enter_device(call, sizing.device, stream, &scope)) return s;
  if (requested == UVM_STRATEGY_MIGRATE) {
    if (uvm_status s = check_no_releasable(call, sizing.merged)) return s;
  }
  const uvm_strategy strategy = choose_strategy(static_cast<uvm_strategy>(requested), sizing.caps.discard_supported);
  if (strategy == UVM_STRATEGY_STAGED && !sizing.caps.discard_supported && any_managed(sizing.merged)) {
    return fail(call, UVM_ERROR_UNSUPPORTED,
                "staged offload discards the device pages, which needs a CUDA 13 runtime and driver; "
                "use UVM_STRATEGY_AUTO or UVM_STRATEGY_MIGRATE");
  }
  if (requested == UVM_STRATEGY_STAGED) {
    if (uvm_status s = check_all_uvm_allocations(call, sizing.merged)) return s;
  }
  const bool staging_wanted = strategy == UVM_STRATEGY_STAGED;
  {
    // Any pinned memory this needs is allocated before the moves lock, so that the allocation
    // (seconds for GiBs) holds up no uvm_free on another thread.
    std::vector<HintRange> staged, migrated;
    pieces_to_move(sizing.merged, staging_wanted, &staged, &migrated);
    if (!staged.empty()) {
      if (uvm_status s = staging().ensure_capacity(call, spans_of(staged))) return s;
    }
  }
  const auto moves = lock_moves();
  // Once more under the lock: an allocation may have been freed, or its bytes moved, meanwhile.
  Target target;
  if (uvm_status s = resolve_target(call, ranges, count, &target)) return s;
  if (target.merged.empty()) return UVM_OK;
  if (target.device != sizing.device) {
    return fail(call, UVM_ERROR_INVALID_ARGUMENT, "the ranges were freed and reallocated on device %d meanwhile",
                target.device);
  }
  if (requested == UVM_STRATEGY_STAGED) {
    if (uvm_status s = check_all_uvm_allocations(call, target.merged)) return s;
  }
  if (requested == UVM_STRATEGY_MIGRATE) {
    if (uvm_status s = check_no_releasable(call, target.merged)) return s;
  }
  std::vector<HintRange> staged, migrated;
  pieces_to_move(target.merged, staging_wanted, &staged, &migrated);
  std::vector<HintRange> all = staged;
  all.insert(all.end(), migrated.begin(), migrated.end());
  if (uvm_status s = wait_for_moves(call, all, stream)) return s;
  CopiesDone done;
  if (!staged.empty()) {
    if (uvm_status s = offload_staged(call, staged, stream, &done)) return s;
  }
  if (!migrated.empty()) {
    if (uvm_status s = prefetch_each(call, migrated, UVM_LOCATION_CPU, stream)) return s;
    if (uvm_status s = record_moves(call, migrated, stream)) return s;
  }
  return release_emptied(call, target.merged, stream, done);
}

// After a failure half-way through an onload: waits for what the workers were given, so that no
// copy outlives the call that failed and runs beside the next move of the same bytes.
void settle_workers(const cudaStream_t* workers, int count) {
  for (int i = 0; i < count; ++i) clear_cuda_error(cudaStreamSynchronize(workers[i]));
}

// Each worker waits for `stream` and for the copies that wrote the staged pieces.
uvm_status start_workers(const Call& call, const std::vector<StagedWork>& work, cudaStream_t stream,
                         const cudaStream_t* workers, int count) {
  EventRef start;
  if (uvm_status s = record_event(call, stream, &start)) return s;
  std::vector<cudaEvent_t> before = {start->handle};
  for (const StagedWork& w : work) {
    if (w.piece.written && std::find(before.begin(), before.end(), w.piece.written->handle) == before.end()) {
      before.push_back(w.piece.written->handle);
    }
  }
  for (int i = 0; i < count; ++i) {
    for (cudaEvent_t event : before) {
      if (cudaError_t e = cudaStreamWaitEvent(workers[i], event, 0)) return fail_cuda(call, e, "cudaStreamWaitEvent");
    }
  }
  return UVM_OK;
}

// One chunk back on a worker: prefetch, copy, prefetch.
// - The prefetch before the copies populates the chunk. Copying into discarded pages without it
//   faults page by page (0.6 GB/s on an H100); populating everything first and copying after is as
//   slow whenever the driver has not yet reclaimed the discarded pages. Chunk by chunk it ran
//   37–47 GB/s in every case measured.
// - The prefetch after the copies undoes the discard. A copy's writes restore the data but leave
//   the driver treating the pages as discardable, and the prefetch before it does not reliably clear
//   that (it did not for the first chunk on each stream): a later prefetch to the CPU, or an
//   eviction, would then drop the data and read back zeros. Measured with
//   `transfer_probe … hazard` (docs/performance.md); once the pages hold the data the prefetch
//   moves nothing and costs no bandwidth.
//
// A chunk of releasable memory (device memory, mapped before the onload) is only copied.
uvm_status copy_chunk(const Call& call, int device, const OnloadChunk& chunk, bool managed, cudaStream_t worker) {
  void* populate = reinterpret_cast<void*>(chunk.populate.begin);
  const cudaError_t populated = managed ? prefetch_to(populate, chunk.populate.size(), device, worker) : cudaSuccess;
  if (cudaError_t e = populated) {
    return fail_cuda(call, e, "cudaMemPrefetchAsync(%p, %zu bytes) populating before the copy", populate,
                     chunk.populate.size());
  }
  for (const CopyPiece& copy : chunk.copies) {
    void* ptr = reinterpret_cast<void*>(copy.span.begin);
    if (cudaError_t e = cudaMemcpyAsync(ptr, copy.host, copy.span.size(), cudaMemcpyDefault, worker)) {
      return fail_cuda(call, e, "cudaMemcpyAsync(pinned staging → %p, %zu bytes)", ptr, copy.span.size());
    }
  }
  if (!managed) return UVM_OK;
  if (cudaError_t e = prefetch_to(populate, chunk.populate.size(), device, worker)) {
    return fail_cuda(call, e, "cudaMemPrefetchAsync(%p, %zu bytes) undoing the discard after the copy", populate,
                     chunk.populate.size());
  }
  return UVM_OK;
}

// `stream` waits for every worker that was given work.
uvm_status join_workers(const Call& call, const cudaStream_t* workers, int used, cudaStream_t stream) {
  for (int i = 0; i < used; ++i) {
    EventRef done;
    if (uvm_status s = record_event(call, workers[i], &done)) return s;
    if (cudaError_t e = cudaStreamWaitEvent(stream, done->handle, 0)) return fail_cuda(call, e, "cudaStreamWaitEvent");
  }
  return UVM_OK;
}

// Copies staged pieces (sorted by address) back, chunk by chunk over uvm's worker streams, joined
// to `stream` before and after; the pieces stay staged until every copy is issued and joined, so a
// failure loses nothing: the next onload copies them again.
uvm_status copy_back(const Call& call, int device, const std::vector<StagedWork>& work, cudaStream_t stream) {
  const OnloadPipeline pipeline = onload_pipeline();
  cudaStream_t workers[kMaxOnloadStreams] = {};
  if (uvm_status s = worker_streams(call, pipeline.streams, workers)) return s;
  if (uvm_status s = start_workers(call, work, stream, workers, pipeline.streams)) return s;
  std::vector<CopyPiece> pieces;
  std::set<uintptr_t> releasable;
  for (const StagedWork& w : work) {
    pieces.push_back(CopyPiece{w.piece.span, w.range.allocation, w.piece.host});
    if (w.range.releasable) releasable.insert(w.range.allocation);
  }
  const std::vector<OnloadChunk> chunks = plan_onload(pieces, pipeline.chunk_bytes);
  uvm_status status = UVM_OK;
  uint64_t prefetches = 0;
  for (size_t c = 0; c < chunks.size() && status == UVM_OK; ++c) {
    const uintptr_t allocation = chunks[c].copies.front().allocation;
    const bool managed = releasable.count(allocation) == 0;
    // Releasable memory is mapped chunk by chunk, so that mapping the next allocations overlaps the
    // copies into the ones before.
    if (!managed) status = restore_one(call, allocation);
    if (status == UVM_OK) status = copy_chunk(call, device, chunks[c], managed, workers[c % pipeline.streams]);
    if (managed) prefetches += 2;
  }
  const int used = static_cast<int>(std::min<size_t>(chunks.size(), pipeline.streams));
  if (status == UVM_OK) status = join_workers(call, workers, used, stream);
  EventRef read;
  if (status == UVM_OK) status = mark_or_wait(call, stream, &read);
  if (status != UVM_OK) {
    settle_workers(workers, used);
    return status;
  }
  std::vector<HintRange> ranges;
  for (const StagedWork& w : work) {
    staging().release(w.piece.span.begin, w.piece.span.end, read);
    account_move(w.range, Move::to_device, 0);
    ranges.push_back(w.range);
  }
  record_prefetch_calls(device, prefetches);
  record_moves(ranges, read);
  return UVM_OK;
}

uvm_status onload(const Call& call, const uvm_range* ranges, size_t count, cudaStream_t stream) {
  Target target;
  if (uvm_status s = resolve_target(call, ranges, count, &target)) return s;
  if (target.merged.empty()) return UVM_OK;
  ContextScope scope;
  if (uvm_status s = enter_device(call, target.device, stream, &scope)) return s;
  const auto moves = lock_moves();
  if (uvm_status s = resolve_target(call, ranges, count, &target)) return s;  // freed meanwhile?
  if (target.merged.empty()) return UVM_OK;
  if (uvm_status s = wait_for_moves(call, target.merged, stream)) return s;
  std::vector<StagedWork> staged;
  std::vector<HintRange> migrated;
  for (const HintRange& range : target.merged) {
    const auto pieces = staging().overlapping(range.begin, range.end);
    for (const StagedPiece& piece : pieces) staged.push_back(StagedWork{clipped(range, piece.span), piece});
    for (const Span& span : subtract(Span{range.begin, range.end}, spans_of(pieces))) {
      migrated.push_back(clipped(range, span));
    }
  }
  if (!staged.empty()) {
    if (uvm_status s = copy_back(call, target.device, staged, stream)) return s;
  }
  // Every released allocation is mapped again (those with staged bytes already are), so that bytes
  // that were not staged (discarded, or never moved) are device memory again: nothing to prefetch.
  if (uvm_status s = restore_released(call, target.merged)) return s;
  std::vector<HintRange> to_prefetch;
  for (const HintRange& range : migrated) {
    if (range.releasable) account_move(range, Move::to_device, 0);
    else to_prefetch.push_back(range);
  }
  if (to_prefetch.empty()) return UVM_OK;
  if (uvm_status s = prefetch_each(call, to_prefetch, target.device, stream)) return s;
  return record_moves(call, to_prefetch, stream);
}

}  // namespace
}  // namespace uvm

extern "C" {

uvm_status uvm_offload_ranges(const uvm_range* ranges, size_t count, uvm_strategy strategy,
                              cudaStream_t stream) {
  const uvm::Call call = uvm::Call::of("uvm_offload_ranges").with_size(count);
  return uvm::guarded(call, [&] { return uvm::offload(call, ranges, count, uvm::raw_enum(strategy), stream); });
}

uvm_status uvm_onload_ranges(const uvm_range* ranges, size_t count, cudaStream_t stream) {
  const uvm::Call call = uvm::Call::of("uvm_onload_ranges").with_size(count);
  return uvm::guarded(call, [&] { return uvm::onload(call, ranges, count, stream); });
}

}  // extern "C"
