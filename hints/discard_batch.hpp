// The discard step shared by uvm_discard and staged offload.
#pragma once

#include <vector>

#include "target.hpp"

namespace uvm {

// UVM_ERROR_UNSUPPORTED unless every range's device can discard (CUDA 13 runtime and driver).
uvm_status check_discard_support(const Call& call, const std::vector<HintRange>& ranges);

// One cudaMemDiscardBatchAsync over `ranges` on `stream` (the legacy stream through uvm's ordering
// stream, since the driver rejects it).
uvm_status discard_batch(const Call& call, const std::vector<HintRange>& ranges, cudaStream_t stream);

}  // namespace uvm
