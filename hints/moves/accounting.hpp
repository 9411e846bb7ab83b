// What a move of a hint range changes in uvm's books: the registry's record of where each byte is,
// and the owning device's stats.
#pragma once

#include <cstdint>

#include "hint_range.hpp"

namespace uvm {

// Records that [range.begin, range.end) moved (for uvm allocations only) in the registry and the
// owner's stats, `prefetch_calls` driver prefetches having done it.
void account_move(const HintRange& range, Move move, uint64_t prefetch_calls);

// Records that [range.begin, range.end) was discarded (for uvm allocations only): no copy kept of
// it, staged or not, in the registry and the owner's stats.
void account_discard(const HintRange& range);

}  // namespace uvm
