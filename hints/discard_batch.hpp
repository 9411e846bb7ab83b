// The discard step shared by uvm_discard and staged offload.
#pragma once

#include <vector>

#include "moves/hint_range.hpp"

namespace uvm {

// One cudaMemDiscardBatchAsync over the managed ones of `ranges` on `stream` (the legacy stream
// through uvm's ordering stream, since the driver rejects it). Releasable ranges are skipped: they
// are device memory, which uvm releases instead; with none managed, nothing is issued.
uvm_status discard_batch(const Call& call, const std::vector<HintRange>& ranges, cudaStream_t stream);

}  // namespace uvm
