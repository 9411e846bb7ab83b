// A range a hint acts on, and what every hint checks before it reaches the driver: the range is managed memory (inside one
// uvm allocation, or memory CUDA reports as managed), the device has the capability, and the stream
// is not being captured. The raw driver would say only "invalid argument" for most of these.
#pragma once

#include <cstddef>
#include <cstdint>
#include <vector>

#include "../../alloc/devices.hpp"
#include "../../alloc/registry.hpp"

namespace uvm {

struct HintRange {
  uintptr_t begin = 0;
  uintptr_t end = 0;
  uintptr_t allocation = 0;  // base of the uvm allocation, 0 for other managed memory
  int owner_device = 0;      // the uvm allocation's device, else the caller's current device
  bool releasable = false;   // a uvm_malloc_releasable allocation (device memory, not managed)
  uintptr_t memory = 0;      // the driver allocation holding it (a slab, or the uvm allocation), 0 if unknown
};

// Validates [ptr, ptr + size) (size > 0) and fills `range`.
uvm_status resolve_range(const Call& call, const void* ptr, size_t size, HintRange* range);

// UVM_ERROR_NOT_MANAGED if any range is releasable device memory, which `what` (prefetch, advise)
// cannot act on.
uvm_status check_all_managed(const Call& call, const std::vector<HintRange>& ranges, const char* what);

// UVM_ERROR_CAPTURING if `stream` is being captured into a graph (checked before any call that
// cannot be captured, so the capture stays valid).
uvm_status check_not_capturing(const Call& call, cudaStream_t stream);

// UVM_ERROR_UNSUPPORTED unless `device` has concurrent managed access. Fills `caps` if not null.
uvm_status check_hint_support(const Call& call, int device, DeviceCaps* caps = nullptr);

// The device whose capabilities decide a hint to `location`: the location itself, or for the CPU
// the device that owns the range.
inline int deciding_device(int location, const HintRange& range) {
  return location == UVM_LOCATION_CPU ? range.owner_device : location;
}

}  // namespace uvm
