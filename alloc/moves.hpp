// Where allocation meets the moves made above it (hints/, offload/): the lock under which both see
// one state, and the one hook that forgets what the moves keep about some bytes.
#pragma once

#include <cstdint>
#include <mutex>

namespace uvm {

// Held by prefetch, offload, onload, discard and by uvm_free while it forgets an allocation, so
// that each sees the registry and what the moves keep (staged copies, last moves) as one
// consistent state: an offload cannot stage bytes of an allocation being freed, and two moves of
// the same bytes never interleave on the host. Never held across cudaHostAlloc or cudaFreeHost
// (seconds for GiBs), nor across cudaFree.
std::unique_lock<std::mutex> lock_moves();

// Forgets everything the moves keep about [begin, end): the staged host copies of those bytes and
// the last move of any allocation starting there. uvm_malloc (new memory), uvm_free and discard
// (bytes no longer wanted) call it; the caller holds lock_moves(), or owns the bytes alone. Defined
// by the offload room (offload/forget.cpp), which owns that state: alloc/ includes nothing from
// above it.
void forget_moved_state(uintptr_t begin, uintptr_t end);

}  // namespace uvm
