// Coalescing: the fewest, largest driver calls that cover a set of ranges.
#pragma once

#include <vector>

#include "hint_range.hpp"

namespace uvm {

// Validates every range of a batched call (skipping empty ones) into `resolved`; a bad range fails
// the whole call, naming its index, before anything is issued.
uvm_status resolve_ranges(const Call& call, const uvm_range* ranges, size_t count,
                          std::vector<HintRange>* resolved);

// Sorts `ranges` and merges those that overlap or touch inside one uvm allocation. Ranges of other
// managed memory merge only when they overlap, since touching ones may be separate allocations,
// which one driver call may not span (the driver rejects a prefetch, copy or discard across two
// allocations even when they are adjacent).
//
// No gap is ever merged, however small: any byte between two ranges may belong to a live tensor
// (a 512-byte gap holds a whole PyTorch block; views of one buffer may sit a byte apart), and
// staged offload, onload and discard write the bytes they cover. So every byte a call touches is
// a byte the caller named. Tensors PyTorch packs end to end (sizes that are multiples of 512)
// still merge into one call.
std::vector<HintRange> coalesce(std::vector<HintRange> ranges);

// Resolves and coalesces a batched call's ranges (resolve_ranges, then coalesce).
uvm_status resolve_and_coalesce(const Call& call, const uvm_range* ranges, size_t count,
                                std::vector<HintRange>* merged);

}  // namespace uvm
