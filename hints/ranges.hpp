// Coalescing: the fewest, largest driver calls that cover a set of ranges.
#pragma once

#include <vector>

#include "target.hpp"

namespace uvm {

// Sorts `ranges` and merges those that overlap or touch inside one uvm allocation. Ranges of other
// managed memory merge only when they overlap, since touching ones may be separate allocations,
// which one driver call may not span.
std::vector<HintRange> coalesce(std::vector<HintRange> ranges);

}  // namespace uvm
