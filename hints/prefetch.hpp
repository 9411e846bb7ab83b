// The prefetch step shared by uvm_prefetch and the moves of offload and onload.
#pragma once

#include <vector>

#include "moves/hint_range.hpp"

namespace uvm {

// One cudaMemPrefetchAsync a range to `location` on `stream`, each accounted as it is issued. The
// caller has validated the ranges and entered the context.
uvm_status prefetch_each(const Call& call, const std::vector<HintRange>& ranges, int location,
                         cudaStream_t stream);

}  // namespace uvm
