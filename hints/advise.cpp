// uvm_advise_preferred_location and uvm_advise_accessed_by: cudaMemAdvise with validation.
#include "../alloc/cuda_compat.hpp"
#include "moves/hint_range.hpp"

namespace uvm {
namespace {

uvm_status advise_range(const Call& call, const void* ptr, size_t size, cudaMemoryAdvise advice,
                        const char* advice_name, int location, bool allow_cpu) {
  if (size == 0) return UVM_OK;
  HintRange range;
  if (uvm_status s = resolve_range(call, ptr, size, &range)) return s;
  if (uvm_status s = check_all_managed(call, {range}, "advise")) return s;
  if (uvm_status s = check_device(call, location, allow_cpu)) return s;
  if (uvm_status s = check_hint_support(call, deciding_device(location, range))) return s;
  ContextScope scope;
  if (uvm_status s = scope.enter(call, deciding_device(location, range),
                                 ContextScope::When::only_if_none_current)) {
    return s;
  }
  if (cudaError_t e = advise(ptr, size, advice, location)) {
    return fail_cuda(call, e, "cudaMemAdvise(%s)", advice_name);
  }
  return UVM_OK;
}

}  // namespace
}  // namespace uvm

extern "C" {

uvm_status uvm_advise_preferred_location(const void* ptr, size_t size, int device) {
  const uvm::Call call =
      uvm::Call::of("uvm_advise_preferred_location").with_ptr(ptr).with_size(size).with_location(device);
  return uvm::guarded(call, [&] {
    return uvm::advise_range(call, ptr, size, cudaMemAdviseSetPreferredLocation,
                             "SetPreferredLocation", device, true);
  });
}

uvm_status uvm_advise_accessed_by(const void* ptr, size_t size, int device) {
  const uvm::Call call =
      uvm::Call::of("uvm_advise_accessed_by").with_ptr(ptr).with_size(size).with_location(device);
  return uvm::guarded(call, [&] {
    // The CPU always has access to managed memory; accessed-by is a device mapping.
    return uvm::advise_range(call, ptr, size, cudaMemAdviseSetAccessedBy, "SetAccessedBy", device,
                             false);
  });
}

}  // extern "C"
