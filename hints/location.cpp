// uvm_query_location: where the driver prefers and last prefetched a range.
#include "moves/hint_range.hpp"

namespace uvm {
namespace {

int as_location(int cuda_device_id) {
  return cuda_device_id == cudaInvalidDeviceId ? UVM_LOCATION_NONE : cuda_device_id;
}

uvm_status query_location(const Call& call, const void* ptr, size_t size, int* preferred,
                          int* last_prefetch) {
  if (size == 0) return fail(call, UVM_ERROR_INVALID_ARGUMENT, "size is 0");
  HintRange range;
  if (uvm_status s = resolve_range(call, ptr, size, &range)) return s;
  ContextScope scope;
  if (uvm_status s = scope.enter(call, range.owner_device, ContextScope::When::only_if_none_current)) {
    return s;
  }
  // The int-valued attributes exist in every CUDA version uvm supports and report a device
  // ordinal, cudaCpuDeviceId, or cudaInvalidDeviceId when unset or mixed over the range.
  int value = cudaInvalidDeviceId;
  if (preferred) {
    if (cudaError_t e = cudaMemRangeGetAttribute(&value, sizeof value,
                                                 cudaMemRangeAttributePreferredLocation, ptr, size)) {
      return fail_cuda(call, e, "cudaMemRangeGetAttribute(PreferredLocation)");
    }
    *preferred = as_location(value);
  }
  if (last_prefetch) {
    if (cudaError_t e = cudaMemRangeGetAttribute(
            &value, sizeof value, cudaMemRangeAttributeLastPrefetchLocation, ptr, size)) {
      return fail_cuda(call, e, "cudaMemRangeGetAttribute(LastPrefetchLocation)");
    }
    *last_prefetch = as_location(value);
  }
  return UVM_OK;
}

}  // namespace
}  // namespace uvm

extern "C" uvm_status uvm_query_location(const void* ptr, size_t size, int* preferred_location,
                                         int* last_prefetch_location) {
  const uvm::Call call = uvm::Call::of("uvm_query_location").with_ptr(ptr).with_size(size);
  return uvm::guarded(call, [&] {
    return uvm::query_location(call, ptr, size, preferred_location, last_prefetch_location);
  });
}
