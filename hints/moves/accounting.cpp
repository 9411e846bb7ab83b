#include "accounting.hpp"

#include "../../alloc/stats.hpp"

namespace uvm {

void account_move(const HintRange& range, Move move, uint64_t prefetch_calls) {
  if (range.allocation == 0) return;  // stats cover uvm allocations only
  const long long host_delta = registry().record_placement(range.allocation, range.begin, range.end, move);
  count_move(range.owner_device, range.end - range.begin, move != Move::to_device, host_delta, prefetch_calls);
}

void account_discard(const HintRange& range) {
  if (range.allocation == 0) return;
  registry().forget(range.begin, range.end);  // a host copy of these bytes is no longer wanted
  const long long host_delta = registry().record_placement(range.allocation, range.begin, range.end, Move::discarded);
  record_discard(range.owner_device, range.end - range.begin, host_delta);
}

}  // namespace uvm
