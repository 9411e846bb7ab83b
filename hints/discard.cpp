// uvm_discard and uvm_discard_ranges: cudaMemDiscardBatchAsync (CUDA 13), with the legacy NULL
// stream made usable; releasable memory is released instead, once none of it is left. Staged host
// copies of discarded bytes are dropped: they are no longer wanted.
#include <vector>

#include "../alloc/stats.hpp"
#include "discard_batch.hpp"
#include "moves/accounting.hpp"
#include "moves/begin.hpp"
#include "moves/order.hpp"
#include "moves/release.hpp"
#include "moves/streams.hpp"
#include "moves/trace.hpp"

namespace uvm {

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

uvm_status discard_moves(const Call& call, const MoveArgs& args, cudaStream_t stream) {
  MoveScope move;
  if (uvm_status s = begin_move(call, MoveKind::discard, args, stream, &move)) return s;
  if (move.ranges.empty()) return UVM_OK;
  if (uvm_status s = discard_batch(call, move.ranges, move.stream)) return s;
  for (const HintRange& range : move.ranges) account_discard(range);
  if (uvm_status s = set_last_moves(call, move.ranges, move.stream)) return s;
  return finish_move(release_emptied(call, move.ranges, move.stream), args, move);
}

}  // namespace uvm

extern "C" {

uvm_status uvm_discard(const void* ptr, size_t size, cudaStream_t stream) {
  const uvm::Call call = uvm::Call::of("uvm_discard").with_ptr(ptr).with_size(size);
  uvm::MoveRecord record(call.name);
  return record.done(uvm::guarded(call, [&] { return uvm::discard_moves(call, uvm::MoveArgs::one(ptr, size), stream); }));
}

uvm_status uvm_discard_ranges(const uvm_range* ranges, size_t count, cudaStream_t stream) {
  const uvm::Call call = uvm::Call::of("uvm_discard_ranges").with_count(count);
  uvm::MoveRecord record(call.name);
  return record.done(uvm::guarded(call, [&] { return uvm::discard_moves(call, uvm::MoveArgs::of(ranges, count), stream); }));
}

}  // extern "C"
