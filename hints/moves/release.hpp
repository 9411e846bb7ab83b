// Physical memory of releasable allocations (alloc/vmm.hpp): given back once every byte of an
// allocation is off its device, mapped again before an onload needs it.
#pragma once

#include <map>
#include <vector>

#include "../../alloc/events.hpp"
#include "hint_range.hpp"

namespace uvm {

// Where an offload's copies out of one releasable allocation end on its stream (`copied`), so that
// its memory can go back while the copies of the next ones still run, and the event the offload
// left as the allocation's last move (`moved`, alloc/registry.hpp; null: it waited for the move).
struct CopiesEnd {
  EventRef copied;
  EventRef moved;
};
using CopiesDone = std::map<uintptr_t, CopiesEnd>;

// At the start of an offload's round, under the moves lock: drops the entries of the allocations
// another call moved while the lock was let go between rounds (their last move is no longer the one
// the offload left). For those, the offload's own copies are not all there is to wait for: its
// stream, which waited for every earlier move of its ranges as the round began, is.
void forget_moved_meanwhile(CopiesDone* done);

// After an offload or discard of `ranges` issued on `stream`: for each releasable allocation among
// them that uvm has moved entirely off its device, waits for its copies (its event in `done`, else
// `stream`, once) and gives its physical memory back to the driver, in address order. An allocation
// still holding any byte nobody moved keeps its memory.
uvm_status release_emptied(const Call& call, const std::vector<HintRange>& ranges, cudaStream_t stream,
                           const CopiesDone& done = {});

// The same without waiting: gives back only the allocations among `ranges` that uvm has moved
// entirely off their device and whose copies, by their event in `done`, have ended already. For a
// round in the middle of an offload, so that what earlier rounds emptied goes back as the offload
// goes on, not all at its end.
uvm_status release_copied_already(const Call& call, const std::vector<HintRange>& ranges, const CopiesDone& done);

// Maps new physical memory for the releasable allocation at `base` if it was released.
uvm_status restore_one(const Call& call, uintptr_t base);

// Before an onload of `ranges`: maps new physical memory for each released allocation among them.
// On failure (e.g. the device is full: UVM_ERROR_OUT_OF_MEMORY) the allocations mapped so far stay
// mapped and everything staged stays staged, so the onload can simply be tried again.
uvm_status restore_released(const Call& call, const std::vector<HintRange>& ranges);

}  // namespace uvm
