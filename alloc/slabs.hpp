// Slabs: PyTorch's small-tensor segments carved from shared managed allocations.
//
// PyTorch serves every tensor up to 1 MiB from 2 MiB segments, so a model's norms, biases and small
// projections become thousands of uvm allocations. The driver pays a fixed cost for each range it
// prefetches, batched or not, and an onload prefetches each range twice, so small tensors came back
// at half the speed of the same bytes in big ones (docs/measurements.md, "Small tensors"). So uvm_malloc
// serves requests of exactly kSlotBytes from slabs of kSlotsPerSlab slots, one cudaMallocManaged
// each. A slot is still its own uvm allocation (freed, tagged, advised, moved and counted alone);
// only the driver sees the slab, so that an onload populates neighbouring slots with one prefetch.
// UVM_SLABS=0 gives every segment its own cudaMallocManaged again.
#pragma once

#include <cstddef>
#include <cstdint>

#include "errors.hpp"

namespace uvm {

constexpr size_t kSlotBytes = size_t{2} << 20;  // PyTorch's small-pool segment
constexpr size_t kSlotsPerSlab = 32;

// Whether uvm_malloc serves `size` from a slab: exactly kSlotBytes, unless UVM_SLABS=0 (alloc/options.hpp).
bool slab_serves(size_t size);

// A free slot of one of `device`'s slabs, or of a new slab (cudaMallocManaged, in the current
// context, which must be the device's). `slab` receives its slab's base.
uvm_status take_slot(const Call& call, int device, void** slot, uintptr_t* slab);

// Returns the slot at `ptr` to the slab at `slab`. `reusable`: false when the driver may still count
// some of its pages as discarded (staged or discarded when it was freed): a copy into such a page
// leaves it discardable, so a later owner could lose data it copied in; such a slot waits for its
// slab to be freed. Once none of its slots is in use the slab hands out no slot and `emptied` is
// set: the caller then frees it (cudaFree), which ends any discard state with it, and says how that
// went with close_slab. The caller has waited for the work that may still use the slot, as cudaFree
// would.
uvm_status give_back_slot(const Call& call, uintptr_t slab, void* ptr, bool reusable, bool* emptied);

// The end of freeing an emptied slab: `freed`, it leaves the books; else (cudaFree failed) it stays,
// empty, to serve the next slot, and goes with the next free that empties it.
void close_slab(uintptr_t slab, bool freed);

// Slabs alive (all devices), for tests and doctor.
size_t live_slabs();

}  // namespace uvm
