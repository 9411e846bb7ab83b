// uvm_prefetch and uvm_prefetch_ranges: cudaMemPrefetchAsync with validation, coalescing and
// accounting of what moved where.
#include "prefetch.hpp"

#include "../alloc/cuda_compat.hpp"
#include "../alloc/stats.hpp"
#include "moves/accounting.hpp"
#include "moves/begin.hpp"
#include "moves/trace.hpp"

namespace uvm {

namespace {

// Before a prefetch of `range` to the CPU: its discard-marked bytes (registry.hpp) go to their device
// first, which undoes the discard for what was written since; else the driver would drop them.
uvm_status undo_discard_marks(const Call& call, const HintRange& range, cudaStream_t stream) {
  if (range.allocation == 0 || range.releasable) return UVM_OK;
  for (const Span& span : registry().marked(range.allocation, range.begin, range.end)) {
    const void* ptr = reinterpret_cast<const void*>(span.begin);
    if (cudaError_t e = prefetch_to(ptr, span.size(), range.owner_device, stream)) {
      return fail_cuda(call, e, "cudaMemPrefetchAsync(%p, %zu bytes) undoing a discard before the move to the CPU",
                       ptr, span.size());
    }
    record_prefetch_calls(range.owner_device, 1);
    registry().unmark(range.allocation, span.begin, span.end);
  }
  return UVM_OK;
}

}  // namespace

uvm_status prefetch_each(const Call& call, const std::vector<HintRange>& ranges, int location,
                         cudaStream_t stream) {
  StreamPhase migrating(Phase::migrate, stream);
  size_t bytes = 0;
  for (const HintRange& range : ranges) {
    if (location == UVM_LOCATION_CPU) {
      if (uvm_status s = undo_discard_marks(call, range, stream)) return s;
    }
    const void* ptr = reinterpret_cast<const void*>(range.begin);
    const size_t size = range.end - range.begin;
    if (cudaError_t e = prefetch_to(ptr, size, location, stream)) {
      return fail_cuda(call, e, "cudaMemPrefetchAsync(%p, %zu bytes)", ptr, size);
    }
    account_move(range, location == UVM_LOCATION_CPU ? Move::to_host : Move::to_device, 1);
    bytes += size;
  }
  migrating.finish(bytes);
  return UVM_OK;
}

namespace {

uvm_status prefetch(const Call& call, const MoveArgs& args, cudaStream_t stream) {
  MoveScope move;
  if (uvm_status s = begin_move(call, MoveKind::prefetch, args, stream, &move)) return s;
  if (move.ranges.empty()) return UVM_OK;
  return prefetch_each(call, move.ranges, args.location, move.stream);
}

}  // namespace
}  // namespace uvm

extern "C" {

uvm_status uvm_prefetch(const void* ptr, size_t size, int device, cudaStream_t stream) {
  const uvm::Call call = uvm::Call::of("uvm_prefetch").with_ptr(ptr).with_size(size).with_location(device);
  uvm::MoveRecord record(call.name);
  return record.done(
      uvm::guarded(call, [&] { return uvm::prefetch(call, uvm::MoveArgs::one(ptr, size).to(device), stream); }));
}

uvm_status uvm_prefetch_ranges(const uvm_range* ranges, size_t count, int device,
                               cudaStream_t stream) {
  const uvm::Call call = uvm::Call::of("uvm_prefetch_ranges").with_count(count).with_location(device);
  uvm::MoveRecord record(call.name);
  return record.done(
      uvm::guarded(call, [&] { return uvm::prefetch(call, uvm::MoveArgs::of(ranges, count).to(device), stream); }));
}

}  // extern "C"
