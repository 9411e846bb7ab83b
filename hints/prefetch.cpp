// uvm_prefetch and uvm_prefetch_ranges: cudaMemPrefetchAsync with validation, coalescing and
// accounting of what moved where.
#include "prefetch.hpp"

#include "../alloc/cuda_compat.hpp"
#include "../alloc/moves.hpp"
#include "../alloc/stats.hpp"
#include "accounting.hpp"
#include "order.hpp"
#include "ranges.hpp"
#include "trace.hpp"

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

// Checks the location and device support, then (inside the context the calls will use, so that
// the capture query creates no context elsewhere) the capture state, and issues one call a range.
uvm_status issue(const Call& call, const std::vector<HintRange>& ranges, int location,
                 cudaStream_t stream) {
  if (uvm_status s = check_all_managed(call, ranges, "prefetch")) return s;
  if (uvm_status s = check_device(call, location, true)) return s;
  // Every range's deciding device is checked before anything is issued: ranges to the CPU may come
  // from allocations on several devices.
  for (const HintRange& range : ranges) {
    if (uvm_status s = check_hint_support(call, deciding_device(location, range))) return s;
  }
  const int deciding = deciding_device(location, ranges.front());
  ContextScope scope;
  if (uvm_status s = scope.enter(call, deciding, ContextScope::When::only_if_none_current)) return s;
  record_move_device(deciding);
  for (const HintRange& range : ranges) record_move_bytes(range.end - range.begin);
  if (uvm_status s = check_not_capturing(call, stream)) return s;
  // A prefetch to the CPU of bytes an onload is still copying back on uvm's streams would drop
  // them (the driver still counts them as discarded): wait for the last move of each allocation.
  if (uvm_status s = wait_for_moves(call, ranges, stream)) return s;
  return prefetch_each(call, ranges, location, stream);
}

uvm_status prefetch(const Call& call, const void* ptr, size_t size, int location,
                    cudaStream_t stream) {
  if (size == 0) return UVM_OK;
  const auto moves = lock_moves();
  HintRange range;
  if (uvm_status s = resolve_range(call, ptr, size, &range)) return s;
  return issue(call, {range}, location, stream);
}

uvm_status prefetch_ranges(const Call& call, const uvm_range* ranges, size_t count, int location,
                           cudaStream_t stream) {
  const auto moves = lock_moves();
  std::vector<HintRange> merged;
  if (uvm_status s = resolve_and_coalesce(call, ranges, count, &merged)) return s;
  if (merged.empty()) return UVM_OK;
  return issue(call, merged, location, stream);
}

}  // namespace
}  // namespace uvm

extern "C" {

uvm_status uvm_prefetch(const void* ptr, size_t size, int device, cudaStream_t stream) {
  const uvm::Call call = uvm::Call::of("uvm_prefetch").with_ptr(ptr).with_size(size).with_location(device);
  uvm::MoveRecord record(call.name);
  return record.done(uvm::guarded(call, [&] { return uvm::prefetch(call, ptr, size, device, stream); }));
}

uvm_status uvm_prefetch_ranges(const uvm_range* ranges, size_t count, int device,
                               cudaStream_t stream) {
  const uvm::Call call = uvm::Call::of("uvm_prefetch_ranges").with_count(count).with_location(device);
  uvm::MoveRecord record(call.name);
  return record.done(uvm::guarded(call, [&] { return uvm::prefetch_ranges(call, ranges, count, device, stream); }));
}

}  // extern "C"
