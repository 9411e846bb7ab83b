#include "order.hpp"

#include <algorithm>

namespace uvm {
namespace {

std::vector<uintptr_t> allocations_of(const std::vector<HintRange>& ranges) {
  std::vector<uintptr_t> bases;
  for (const HintRange& range : ranges) {
    if (range.allocation != 0) bases.push_back(range.allocation);
  }
  std::sort(bases.begin(), bases.end());
  bases.erase(std::unique(bases.begin(), bases.end()), bases.end());
  return bases;
}

}  // namespace

uvm_status wait_for_last_moves(const Call& call, const std::vector<HintRange>& ranges, cudaStream_t stream) {
  for (const EventRef& move : registry().last_move_events(allocations_of(ranges))) {
    if (cudaError_t e = cudaStreamWaitEvent(stream, move->handle, 0)) {
      return fail_cuda(call, e, "cudaStreamWaitEvent (the previous move of these bytes)");
    }
  }
  return UVM_OK;
}

void set_last_moves(const std::vector<HintRange>& ranges, const EventRef& done) {
  registry().set_last_move(allocations_of(ranges), done);
}

uvm_status set_last_moves(const Call& call, const std::vector<HintRange>& ranges, cudaStream_t stream) {
  EventRef done;
  const uvm_status status = mark_or_wait(call, stream, &done);
  set_last_moves(ranges, done);  // when even the wait failed, nothing better is known to wait for
  return status;
}

}  // namespace uvm
