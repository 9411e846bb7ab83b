// Ordering moves of the same bytes across streams. Prefetch, offload, onload and discard each end
// with an event that the next move of the same allocation waits for, whatever stream either runs
// on: a copy back still running on uvm's worker streams must not meet a discard or a prefetch to
// the CPU issued on another stream (the driver leaves such bytes undefined, or drops them as
// discarded). The event lives in the allocation's record (alloc/registry.hpp) and dies with it.
#pragma once

#include <vector>

#include "../../alloc/events.hpp"
#include "hint_range.hpp"

namespace uvm {

// Makes `stream` wait for the last move of every uvm allocation that `ranges` touch.
uvm_status wait_for_last_moves(const Call& call, const std::vector<HintRange>& ranges, cudaStream_t stream);

// Records that the moves just issued on `stream` for `ranges` end where the stream is now. If no
// event can be recorded, waits for the stream instead.
uvm_status set_last_moves(const Call& call, const std::vector<HintRange>& ranges, cudaStream_t stream);

// The same, with an event the caller already recorded (null: the moves have completed).
void set_last_moves(const std::vector<HintRange>& ranges, const EventRef& done);

}  // namespace uvm
