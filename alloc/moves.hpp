// The moves lock: where allocation meets the moves made above it (hints/, offload/).
#pragma once

#include <mutex>

namespace uvm {

// Held by prefetch, offload, onload and discard from resolving their ranges to recording what
// they did, by uvm_free while it erases a record, and by the block calls (blocks.cpp) while they
// change one, so that each sees the registry as one consistent state: an offload cannot stage
// bytes of an allocation being freed or of a block being handed out, and two moves of the same
// bytes never interleave on the host. Never held across cudaHostAlloc or cudaFreeHost (seconds for
// GiBs), nor across cudaFree.
std::unique_lock<std::mutex> lock_moves();

}  // namespace uvm
