// uvm_discard and uvm_discard_ranges: cudaMemDiscardBatchAsync (CUDA 13), with the legacy NULL
// stream made usable; releasable memory is released instead, once none of it is left. Staged host
// copies of discarded bytes are dropped: they are no longer wanted.
#include <set>
#include <vector>

#include "../alloc/moves.hpp"
#include "../alloc/stats.hpp"
#include "accounting.hpp"
#include "discard_batch.hpp"
#include "order.hpp"
#include "ranges.hpp"
#include "release.hpp"
#include "streams.hpp"
#include "trace.hpp"

namespace uvm {

uvm_status check_discard_support(const Call& call, const std::vector<HintRange>& ranges) {
  std::set<int> checked;
  for (const HintRange& range : ranges) {
    if (range.releasable) continue;  // uvm releases its physical memory: no driver discard needed
    if (!checked.insert(range.owner_device).second) continue;
    DeviceCaps caps;
    if (uvm_status s = check_hint_support(call, range.owner_device, &caps)) return s;
    if (!caps.discard_supported) {
      return fail(call, UVM_ERROR_UNSUPPORTED,
                  "discard needs a CUDA 13 runtime and driver (cudaMemDiscardBatchAsync); this "
                  "build or driver is older");
    }
  }
  return UVM_OK;
}

uvm_status discard_batch(const Call& call, const std::vector<HintRange>& ranges, cudaStream_t stream) {
  std::vector<void*> pointers;
  std::vector<size_t> sizes;
  size_t bytes = 0;
  for (const HintRange& range : ranges) {
    if (range.releasable) continue;  // device memory: uvm releases it instead (release.hpp)
    pointers.push_back(reinterpret_cast<void*>(range.begin));
    sizes.push_back(range.end - range.begin);
    bytes += sizes.back();
  }
  if (pointers.empty()) return UVM_OK;
#if CUDART_VERSION >= 13000
  if (is_legacy_stream(stream)) {
    if (uvm_status s = ordering_stream(call, &stream)) return s;
  }
  StreamPhase discarding(Phase::discard, stream);
  if (cudaError_t e = cudaMemDiscardBatchAsync(pointers.data(), sizes.data(), pointers.size(), 0, stream)) {
    return fail_cuda(call, e, "cudaMemDiscardBatchAsync(%zu ranges)", pointers.size());
  }
  discarding.finish(bytes);
  for (const HintRange& range : ranges) {
    if (!range.releasable && range.allocation != 0) registry().mark_discarded(range.allocation, range.begin, range.end);
  }
  return UVM_OK;
#else
  (void)stream;
  return fail(call, UVM_ERROR_UNSUPPORTED, "uvm was built against CUDA < 13, which has no discard");
#endif
}

namespace {

// Under the moves lock from resolving the ranges to recording what happened, so that no offload or
// onload of the same bytes interleaves; `resolve` fills the ranges.
template <typename Resolve>
uvm_status discard(const Call& call, Resolve&& resolve, cudaStream_t stream) {
  const auto moves = lock_moves();
  std::vector<HintRange> resolved;
  if (uvm_status s = resolve(&resolved)) return s;
  if (resolved.empty()) return UVM_OK;
  const std::vector<HintRange> ranges = coalesce(std::move(resolved));
  if (uvm_status s = check_discard_support(call, ranges)) return s;
  ContextScope scope;
  if (uvm_status s = scope.enter(call, ranges.front().owner_device, ContextScope::When::only_if_none_current)) {
    return s;
  }
  record_move_device(ranges.front().owner_device);
  for (const HintRange& range : ranges) record_move_bytes(range.end - range.begin);
  if (uvm_status s = check_not_capturing(call, stream)) return s;
  if (is_legacy_stream(stream)) {
    if (uvm_status s = ordering_stream(call, &stream)) return s;
  }
  if (uvm_status s = wait_for_moves(call, ranges, stream)) return s;
  if (uvm_status s = discard_batch(call, ranges, stream)) return s;
  for (const HintRange& range : ranges) account_discard(range);
  if (uvm_status s = record_moves(call, ranges, stream)) return s;
  return release_emptied(call, ranges, stream);
}

}  // namespace
}  // namespace uvm

extern "C" {

uvm_status uvm_discard(const void* ptr, size_t size, cudaStream_t stream) {
  const uvm::Call call = uvm::Call::of("uvm_discard").with_ptr(ptr).with_size(size);
  uvm::MoveRecord record(call.name);
  return record.done(uvm::guarded(call, [&] {
    if (size == 0) return UVM_OK;
    const auto resolve = [&](std::vector<uvm::HintRange>* resolved) {
      uvm::HintRange range;
      if (uvm_status s = uvm::resolve_range(call, ptr, size, &range)) return s;
      resolved->push_back(range);
      return UVM_OK;
    };
    return uvm::discard(call, resolve, stream);
  }));
}

uvm_status uvm_discard_ranges(const uvm_range* ranges, size_t count, cudaStream_t stream) {
  const uvm::Call call = uvm::Call::of("uvm_discard_ranges").with_count(count);
  uvm::MoveRecord record(call.name);
  return record.done(uvm::guarded(call, [&] {
    const auto resolve = [&](std::vector<uvm::HintRange>* resolved) {
      return uvm::resolve_ranges(call, ranges, count, resolved);
    };
    return uvm::discard(call, resolve, stream);
  }));
}

}  // extern "C"
