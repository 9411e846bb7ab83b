// Streaming: bytes that live on the host and visit the GPU. uvm_fetch_ranges brings staged bytes
// back keeping their host copies; uvm_drop_clean_ranges lets the device copy go again without a
// copy out, since the host copy still holds the same bytes. Weights that do not change cross the
// link once per visit, one way.
#include <vector>

#include "../../alloc/registry.hpp"
#include "../../hints/discard_batch.hpp"
#include "../../hints/moves/accounting.hpp"
#include "../../hints/moves/begin.hpp"
#include "../../hints/moves/order.hpp"
#include "../../hints/moves/release.hpp"
#include "../../hints/moves/trace.hpp"
#include "../media/copies.hpp"
#include "../media/plan.hpp"
#include "onload.hpp"

namespace uvm {
namespace {

// The bytes of `range` still on the device: neither staged (off it already) nor free space.
std::vector<Span> on_device(const HintRange& range) {
  std::vector<Span> staged, free;
  for (const StagedPiece& piece : staged_copies(range.begin, range.end)) staged.push_back(piece.span);
  if (range.allocation != 0) free = registry().free_space(range.allocation, range.begin, range.end);
  return split_range(Span{range.begin, range.end}, std::move(staged), std::move(free)).rest;
}

// Every byte to drop must have a host copy in memory (a fetch's retained pinned or pageable copy):
// else dropping it would lose it. Checked for all ranges before anything is issued.
uvm_status check_clean_copies(const Call& call, const std::vector<HintRange>& pieces) {
  for (const HintRange& piece : pieces) {
    if (piece.allocation == 0) {
      return fail(call, UVM_ERROR_INVALID_ARGUMENT,
                  "the range at %p (%zu bytes) is managed memory not allocated by uvm, which keeps no host copy of it",
                  reinterpret_cast<void*>(piece.begin), static_cast<size_t>(piece.end - piece.begin));
    }
    std::vector<Span> kept;  // by address, disjoint
    for (const StagedPiece& copy : retained_copies(piece.begin, piece.end)) {
      if (copy.kept != Kept::disk) kept.push_back(copy.span);  // a pause's file is no fetch's copy
    }
    const std::vector<Span> uncovered = subtract(Span{piece.begin, piece.end}, kept);
    if (!uncovered.empty()) {
      return fail(call, UVM_ERROR_INVALID_ARGUMENT,
                  "%zu bytes at %p have no clean host copy (only bytes brought back by uvm_fetch_ranges have "
                  "one, until they are offloaded, discarded or their block is freed); offload them instead",
                  uncovered.front().size(), reinterpret_cast<void*>(uncovered.front().begin));
    }
  }
  return UVM_OK;
}

uvm_status drop_clean(const Call& call, const uvm_range* ranges, size_t count, cudaStream_t stream) {
  MoveScope move;
  if (uvm_status s = begin_move(call, MoveKind::offload, MoveArgs::of(ranges, count), stream, &move)) return s;
  if (move.ranges.empty()) return UVM_OK;
  std::vector<HintRange> pieces;  // the bytes still on the device, each with its clean copy
  for (const HintRange& range : move.ranges) {
    for (const Span& span : on_device(range)) pieces.push_back(clipped(range, span));
  }
  if (uvm_status s = check_clean_copies(call, pieces)) return s;
  for (const HintRange& piece : pieces) {
    if (!piece.releasable && !move.caps.discard_supported) {
      return fail(call, UVM_ERROR_UNSUPPORTED,
                  "dropping managed bytes (at %p) discards them, which needs a CUDA 13 runtime and driver",
                  reinterpret_cast<void*>(piece.begin));
    }
  }
  if (pieces.empty()) return UVM_OK;
  for (const HintRange& piece : pieces) trace_move_bytes(piece.end - piece.begin);
  // The host copy becomes the staged copy before the discard: from there on it is all there is.
  for (const HintRange& piece : pieces) {
    restage_copies(piece.begin, piece.end);
    account_move(piece, Move::staged, 0);
  }
  if (uvm_status s = discard_batch(call, pieces, move.stream)) return s;
  if (uvm_status s = set_last_moves(call, pieces, move.stream)) return s;
  return release_emptied(call, move.ranges, move.stream);
}

}  // namespace
}  // namespace uvm

extern "C" uvm_status uvm_fetch_ranges(const uvm_range* ranges, size_t count, cudaStream_t stream,
                                       cudaEvent_t arrived) {
  const uvm_status status = uvm::onload_ranges(ranges, count, stream, uvm::OnloadMode{"uvm_fetch_ranges", true, true});
  if (status != UVM_OK || arrived == nullptr) return status;
  const uvm::Call call = uvm::Call::of("uvm_fetch_ranges").with_count(count);
  if (cudaError_t e = cudaEventRecord(arrived, stream)) return uvm::fail_cuda(call, e, "cudaEventRecord(arrived)");
  return UVM_OK;
}

extern "C" uvm_status uvm_drop_clean_ranges(const uvm_range* ranges, size_t count, cudaStream_t stream) {
  const uvm::Call call = uvm::Call::of("uvm_drop_clean_ranges").with_count(count);
  uvm::MoveRecord record(call.name);
  return record.done(uvm::guarded(call, [&] { return uvm::drop_clean(call, ranges, count, stream); }));
}
