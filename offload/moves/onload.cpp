// uvm_onload_ranges: bringing offloaded memory back to its GPU. Staged bytes are copied back from
// pinned memory chunk by chunk over uvm's worker streams; migrated bytes are prefetched.
#include <algorithm>
#include <set>
#include <vector>

#include "../../alloc/cuda_compat.hpp"
#include "../../alloc/registry.hpp"
#include "../../alloc/stats.hpp"
#include "../../hints/moves/accounting.hpp"
#include "../../hints/moves/begin.hpp"
#include "../../hints/moves/order.hpp"
#include "../../hints/moves/release.hpp"
#include "../../hints/moves/streams.hpp"
#include "../../hints/moves/trace.hpp"
#include "../../hints/prefetch.hpp"
#include "../media/coded.hpp"
#include "../media/copies.hpp"
#include "../media/plan.hpp"
#include "../media/spill.hpp"
#include "../media/staging.hpp"
#include "onload.hpp"
#include "sm_copy.hpp"

namespace uvm {
namespace {

// A staged piece to copy back, with the range it belongs to (for accounting).
struct StagedWork {
  HintRange range;
  StagedPiece piece;
};

// uvm's worker streams for one onload, and how many of them were given work.
struct Workers {
  cudaStream_t streams[kMaxWorkerStreams] = {};
  int count = 0;
  int used = 0;
};

// After a failure half-way through an onload: waits for what the workers were given, so that no
// copy outlives the call that failed and runs beside the next move of the same bytes.
void settle(const Workers& workers) {
  for (int i = 0; i < workers.used; ++i) clear_cuda_error(cudaStreamSynchronize(workers.streams[i]));
}

// Each worker waits for `stream` and for the copies that wrote the staged pieces.
uvm_status start_workers(const Call& call, const std::vector<StagedWork>& work, cudaStream_t stream,
                         const Workers& workers) {
  EventRef start;
  if (uvm_status s = record_event(call, stream, &start)) return s;
  std::vector<cudaEvent_t> before = {start->handle};
  for (const StagedWork& w : work) {
    if (w.piece.written && std::find(before.begin(), before.end(), w.piece.written->handle) == before.end()) {
      before.push_back(w.piece.written->handle);
    }
  }
  for (int i = 0; i < workers.count; ++i) {
    for (cudaEvent_t event : before) {
      if (cudaError_t e = cudaStreamWaitEvent(workers.streams[i], event, 0)) {
        return fail_cuda(call, e, "cudaStreamWaitEvent");
      }
    }
  }
  return UVM_OK;
}

// One chunk back on a worker: prefetch, copy, prefetch.
// - The prefetch before the copies populates the chunk. Copying into discarded pages without it
//   faults page by page, dozens of times slower; populating everything first and copying after is
//   as slow whenever the driver has not yet reclaimed the discarded pages. Chunk by chunk it ran
//   near the link's speed in every case measured (docs/measurements.md, "Where the onload time goes").
// - The prefetch after the copies undoes the discard. A copy's writes restore the data but leave
//   the driver treating the pages as discardable, and the prefetch before it does not reliably clear
//   that (it did not for the first chunk on each stream): a later prefetch to the CPU, or an
//   eviction, would then drop the data and read back zeros. Measured with
//   `transfer_probe … hazard` (docs/performance.md); once the pages hold the data the prefetch
//   moves nothing and costs no bandwidth.
//
// A chunk of releasable memory (device memory, mapped before the onload) is only copied, by the
// copy engine or by the SMs, as UVM_ONLOAD_COPY (default auto) chose (sm_copy.hpp: after a bulk
// free the engine runs at half speed). Managed memory keeps the engine: the prefetches around its
// copies are measured with engine copies only.
// `lane` names the worker in move reports and traces.
uvm_status copy_chunk(const Call& call, int device, const OnloadChunk& chunk, bool managed, OnloadCopy how,
                      cudaStream_t worker, int lane) {
  void* populate = reinterpret_cast<void*>(chunk.populate.begin);
  StreamPhase phase(managed ? Phase::populate : Phase::copy, worker, lane, chunk.populate.begin);
  if (managed) {
    if (cudaError_t e = prefetch_to(populate, chunk.populate.size(), device, worker)) {
      return fail_cuda(call, e, "cudaMemPrefetchAsync(%p, %zu bytes) populating before the copy", populate,
                       chunk.populate.size());
    }
    phase.next(Phase::copy, chunk.populate.size());
  }
  size_t copied = 0;
  const std::vector<CopyPiece>& pieces = chunk.copies;
  const auto one_registration = [](const char* host, size_t bytes) { return staging().one_registration(host, bytes); };
  for (const CopyRun& run : copy_runs(pieces, one_registration)) {
    void* ptr = reinterpret_cast<void*>(pieces[run.first].span.begin);
    const char* host = pieces[run.first].host;
    if (!managed && how == OnloadCopy::sm && sm_copyable(ptr, host, run.bytes)) {
      if (uvm_status s = sm_copy(call, device, ptr, host, run.bytes, worker)) return s;
    } else if (cudaError_t e = cudaMemcpyAsync(ptr, host, run.bytes, cudaMemcpyDefault, worker)) {
      return fail_cuda(call, e, "cudaMemcpyAsync(pinned staging → %p, %zu bytes)", ptr, run.bytes);
    }
    copied += run.bytes;
  }
  if (!managed) {
    phase.finish(copied);
    return UVM_OK;
  }
  phase.next(Phase::populate, copied);  // the prefetch after: moves nothing once the pages hold the data
  if (cudaError_t e = prefetch_to(populate, chunk.populate.size(), device, worker)) {
    return fail_cuda(call, e, "cudaMemPrefetchAsync(%p, %zu bytes) undoing the discard after the copy", populate,
                     chunk.populate.size());
  }
  phase.finish(0);
  return UVM_OK;
}

// Issues every chunk on the workers in turn. Releasable memory is mapped chunk by chunk, so that
// mapping the next allocations overlaps the copies into the ones before. Counts the prefetches.
uvm_status issue_chunks(const Call& call, int device, const std::vector<StagedWork>& work, size_t chunk_bytes,
                        OnloadCopy how, Workers* workers, uint64_t* prefetches) {
  std::vector<CopyPiece> pieces;
  std::set<uintptr_t> releasable;
  for (const StagedWork& w : work) {
    pieces.push_back(CopyPiece{w.piece.span, w.range.allocation, w.piece.host, w.range.memory});
    if (w.range.releasable) releasable.insert(w.range.allocation);
  }
  const std::vector<OnloadChunk> chunks = plan_onload(pieces, chunk_bytes);
  for (size_t c = 0; c < chunks.size(); ++c) {
    const uintptr_t allocation = chunks[c].copies.front().allocation;
    const bool managed = releasable.count(allocation) == 0;
    workers->used = static_cast<int>(std::min<size_t>(c + 1, workers->count));
    if (!managed) {
      if (uvm_status s = restore_one(call, allocation)) return s;
    }
    const int worker = static_cast<int>(c % workers->count);
    if (uvm_status s = copy_chunk(call, device, chunks[c], managed, copy_for_worker(how, worker),
                                  workers->streams[worker], worker + 1)) {
      return s;
    }
    if (managed) *prefetches += 2;
  }
  return UVM_OK;
}

// `stream` waits for every worker that was given work, and `read` marks where that is.
uvm_status join_workers(const Call& call, const Workers& workers, cudaStream_t stream, EventRef* read) {
  for (int i = 0; i < workers.used; ++i) {
    EventRef done;
    if (uvm_status s = record_event(call, workers.streams[i], &done)) return s;
    if (cudaError_t e = cudaStreamWaitEvent(stream, done->handle, 0)) return fail_cuda(call, e, "cudaStreamWaitEvent");
  }
  return mark_or_wait(call, stream, read);
}

// Once every copy is issued and joined (or done, for copies kept outside pinned staging: `read`
// null): the pieces are no longer staged (their host bytes, mapping or file go back once `read`
// completes; with `retain`, host copies stay as retained copies) and are accounted as back on the
// device.
void finish_copy_back(int device, const std::vector<StagedWork>& work, const EventRef& read, uint64_t prefetches,
                      bool retain) {
  std::vector<const char*> hosts;
  for (const StagedWork& w : work) hosts.push_back(w.piece.host);
  staging().note_use(hosts, read);
  std::vector<HintRange> ranges;
  for (const StagedWork& w : work) {
    unstage_copies(w.piece.span.begin, w.piece.span.end, retain);
    // Managed pieces were prefetched to the device after their copy: their discard is undone.
    if (!w.range.releasable) registry().unmark(w.range.allocation, w.piece.span.begin, w.piece.span.end);
    account_move(w.range, Move::to_device, 0);
    ranges.push_back(w.range);
  }
  record_prefetch_calls(device, prefetches);
  set_last_moves(ranges, read);
}

// Copies staged pieces (sorted by address) back over uvm's worker streams, joined to `stream`
// before and after. The pieces stay staged until every copy is issued and joined, so a failure
// loses nothing: the next onload copies them again.
uvm_status copy_back(const Call& call, int device, const std::vector<StagedWork>& work, cudaStream_t stream,
                     const OnloadMode& mode) {
  size_t releasable_bytes = 0;  // the only bytes the choice of copy applies to
  for (const StagedWork& w : work) releasable_bytes += w.range.releasable ? w.range.end - w.range.begin : 0;
  OnloadCopy how = OnloadCopy::engine;
  // Beside compute, auto weighs nothing: the engine (OnloadMode), as for bytes with no choice.
  if (uvm_status s = onload_copy_for(call, device, mode.beside_compute ? 0 : releasable_bytes, &how)) return s;
  Workers workers;
  workers.count = mode.beside_compute ? 1 : options().onload_streams;
  if (uvm_status s = worker_streams(call, workers.count, workers.streams)) return s;
  if (uvm_status s = start_workers(call, work, stream, workers)) return s;
  uint64_t prefetches = 0;
  EventRef read;
  const size_t chunk_bytes = mode.beside_compute ? std::max(options().onload_chunk_bytes, kFetchChunkBytes)
                                                 : options().onload_chunk_bytes;
  uvm_status status = issue_chunks(call, device, work, chunk_bytes, how, &workers, &prefetches);
  if (status == UVM_OK) status = join_workers(call, workers, stream, &read);
  if (status != UVM_OK) {
    settle(workers);
    return status;
  }
  finish_copy_back(device, work, read, prefetches, mode.retain);
  return UVM_OK;
}

// Splits the merged ranges into what is staged (copied back) and what is not (prefetched), leaving
// out free space.
void split_staged(const std::vector<HintRange>& merged, std::vector<StagedWork>* staged,
                  std::vector<HintRange>* migrated) {
  for (const HintRange& range : merged) {
    std::vector<Span> staged_spans, free;
    for (const StagedPiece& piece : staged_copies(range.begin, range.end)) {
      staged->push_back(StagedWork{clipped(range, piece.span), piece});
      staged_spans.push_back(piece.span);
    }
    // Free space holds nothing to bring back (offload dropped it): it is neither copied nor prefetched.
    if (range.allocation != 0) free = registry().free_space(range.allocation, range.begin, range.end);
    const RangeSplit split = split_range(Span{range.begin, range.end}, std::move(staged_spans), std::move(free));
    for (const Span& span : split.rest) migrated->push_back(clipped(range, span));
  }
}

// Copies kept in pageable memory or on disk come back through bounce buffers (spill.hpp), and
// compressed ones (`coded`) are decoded on the GPU (coded.hpp), once `stream` has reached the call,
// into memory mapped first (a compressed piece's as its decode is issued, so that mapping overlaps
// the decoding of the pieces before); the call waits for them. They stay staged until every copy is
// done, so a failure (a file changed meanwhile) loses nothing.
uvm_status copy_back_kept(const Call& call, int device, const std::vector<StagedWork>& work, cudaStream_t stream,
                          bool retain, bool coded) {
  if (work.empty()) return UVM_OK;
  const auto map_piece = [&](size_t i) {
    return work[i].range.releasable ? restore_one(call, work[i].range.allocation) : UVM_OK;
  };
  std::vector<StagedPiece> pieces;
  std::vector<bool> managed;
  for (size_t i = 0; i < work.size(); ++i) {
    if (!coded) {
      if (uvm_status s = map_piece(i)) return s;
    }
    pieces.push_back(work[i].piece);
    managed.push_back(!work[i].range.releasable);
  }
  const uvm_status copied = coded ? code_in(call, device, stream, pieces, managed, map_piece)
                                  : spill_in(call, device, stream, pieces, managed);
  if (copied != UVM_OK) return copied;
  finish_copy_back(device, work, EventRef{}, 0, retain);  // done already: nothing pending to wait for
  return UVM_OK;
}

}  // namespace

uvm_status onload_moves(const Call& call, const MoveArgs& args, cudaStream_t stream, const OnloadMode& mode) {
  MoveScope move;
  if (uvm_status s = begin_move(call, MoveKind::onload, args, stream, &move)) return s;
  if (move.ranges.empty()) return UVM_OK;
  std::vector<StagedWork> all_staged, staged, kept, coded;
  std::vector<HintRange> migrated;
  split_staged(move.ranges, &all_staged, &migrated);
  for (StagedWork& w : all_staged) {
    (w.piece.coded ? coded : w.piece.kept == Kept::pinned ? staged : kept).push_back(std::move(w));
  }
  if (uvm_status s = copy_back_kept(call, move.device, coded, move.stream, mode.retain, true)) return s;
  if (uvm_status s = copy_back_kept(call, move.device, kept, move.stream, mode.retain, false)) return s;
  if (!staged.empty()) {
    if (uvm_status s = copy_back(call, move.device, staged, stream, mode)) return s;
  }
  // Every released allocation is mapped again (those with staged bytes already are), so that bytes
  // that were not staged (discarded, or never moved) are device memory again: nothing to prefetch.
  if (uvm_status s = restore_released(call, move.ranges)) return s;
  std::vector<HintRange> to_prefetch;
  for (const HintRange& range : migrated) {
    if (range.releasable) account_move(range, Move::to_device, 0);
    else to_prefetch.push_back(range);
  }
  if (to_prefetch.empty()) return finish_move(UVM_OK, args, move);
  if (uvm_status s = prefetch_each(call, to_prefetch, move.device, stream)) return s;
  return finish_move(set_last_moves(call, to_prefetch, stream), args, move);
}

uvm_status onload_ranges(const uvm_range* ranges, size_t count, cudaStream_t stream, const OnloadMode& mode) {
  const Call call = Call::of(mode.name).with_count(count);
  MoveRecord record(call.name);
  return record.done(guarded(call, [&] { return onload_moves(call, MoveArgs::of(ranges, count), stream, mode); }));
}

}  // namespace uvm

extern "C" uvm_status uvm_onload_ranges(const uvm_range* ranges, size_t count, cudaStream_t stream) {
  return uvm::onload_ranges(ranges, count, stream);
}
