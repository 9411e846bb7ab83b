#include "order.hpp"

#include <algorithm>
#include <map>
#include <mutex>

namespace uvm {
namespace {

// The event the last move of each allocation (by base) ends with.
struct LastMoves {
  std::mutex mutex;
  std::map<uintptr_t, EventRef> by_base;
};

LastMoves& last_moves() {
  static auto* instance = new LastMoves();  // never destroyed: no CUDA calls from static destructors
  return *instance;
}

std::vector<uintptr_t> allocations_of(const std::vector<HintRange>& ranges) {
  std::vector<uintptr_t> bases;
  for (const HintRange& range : ranges) {
    if (range.allocation != 0) bases.push_back(range.allocation);
  }
  std::sort(bases.begin(), bases.end());
  bases.erase(std::unique(bases.begin(), bases.end()), bases.end());
  return bases;
}

// The events to wait for, without duplicates (one event often ends the moves of many allocations).
std::vector<EventRef> events_of(const std::vector<uintptr_t>& bases) {
  LastMoves& moves = last_moves();
  std::lock_guard<std::mutex> lock(moves.mutex);
  std::vector<EventRef> events;
  for (uintptr_t base : bases) {
    auto it = moves.by_base.find(base);
    if (it != moves.by_base.end() && std::find(events.begin(), events.end(), it->second) == events.end()) {
      events.push_back(it->second);
    }
  }
  return events;
}

}  // namespace

uvm_status wait_for_moves(const Call& call, const std::vector<HintRange>& ranges, cudaStream_t stream) {
  for (const EventRef& move : events_of(allocations_of(ranges))) {
    if (cudaError_t e = cudaStreamWaitEvent(stream, move->handle, 0)) {
      return fail_cuda(call, e, "cudaStreamWaitEvent (the previous move of these bytes)");
    }
  }
  return UVM_OK;
}

void record_moves(const std::vector<HintRange>& ranges, const EventRef& done) {
  LastMoves& moves = last_moves();
  std::lock_guard<std::mutex> lock(moves.mutex);
  for (uintptr_t base : allocations_of(ranges)) {
    if (done) moves.by_base[base] = done;
    else moves.by_base.erase(base);
  }
}

uvm_status record_moves(const Call& call, const std::vector<HintRange>& ranges, cudaStream_t stream) {
  EventRef done;
  const uvm_status status = mark_or_wait(call, stream, &done);
  record_moves(ranges, done);  // when even the wait failed, nothing better is known to wait for
  return status;
}

void forget_last_moves(uintptr_t begin, uintptr_t end) {
  LastMoves& moves = last_moves();
  std::lock_guard<std::mutex> lock(moves.mutex);
  moves.by_base.erase(moves.by_base.lower_bound(begin), moves.by_base.lower_bound(end));
}

}  // namespace uvm
