// Coalescing: the fewest, largest driver calls that cover a set of ranges.
#pragma once

#include <vector>

#include "target.hpp"

namespace uvm {

// Validates every range of a batched call (skipping empty ones) into `resolved`; a bad range fails
// the whole call, naming its index, before anything is issued.
uvm_status resolve_ranges(const Call& call, const uvm_range* ranges, size_t count,
                          std::vector<HintRange>* resolved);

// Sorts `ranges` and merges those that overlap, touch, or lie less than `max_gap` bytes apart
// inside one uvm allocation. Ranges of other managed memory merge only when they overlap, since
// touching ones may be separate allocations, which one driver call may not span (the driver
// rejects a prefetch, copy or discard across two allocations even when they are adjacent).
std::vector<HintRange> coalesce(std::vector<HintRange> ranges, size_t max_gap = 0);

}  // namespace uvm
