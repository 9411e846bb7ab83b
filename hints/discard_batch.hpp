// The discard step shared by uvm_discard and staged offload, and the discard entries' body.
#pragma once

#include <vector>

#include "moves/begin.hpp"
#include "moves/hint_range.hpp"

namespace uvm {

// One cudaMemDiscardBatchAsync over the managed ones of `ranges` on `stream` (the legacy stream
// through uvm's ordering stream, since the driver rejects it). Releasable ranges are skipped: they
// are device memory, which uvm releases instead; with none managed, nothing is issued.
uvm_status discard_batch(const Call& call, const std::vector<HintRange>& ranges, cudaStream_t stream);

// The body of uvm_discard and uvm_discard_ranges, for what `args` names (also a selection:
// selection.cpp, uvm_pause), recorded by the caller.
uvm_status discard_moves(const Call& call, const MoveArgs& args, cudaStream_t stream);

}  // namespace uvm
