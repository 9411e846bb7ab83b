#include "hint_range.hpp"

namespace uvm {

uvm_status resolve_range(const Call& call, const void* ptr, size_t size, HintRange* range) {
  if (ptr == nullptr) return fail(call, UVM_ERROR_INVALID_ARGUMENT, "ptr is NULL");
  const auto begin = reinterpret_cast<uintptr_t>(ptr);
  if (size > UINTPTR_MAX - begin) {
    return fail(call, UVM_ERROR_INVALID_ARGUMENT, "range wraps around the address space");
  }
  AllocationView allocation;
  if (registry().find(ptr, &allocation)) {
    if (begin + size > allocation.base + allocation.size) {
      return fail(call, UVM_ERROR_INVALID_ARGUMENT,
                  "range ends %zu bytes past the end of its uvm allocation (%p, %zu bytes)",
                  static_cast<size_t>(begin + size - allocation.base - allocation.size),
                  reinterpret_cast<void*>(allocation.base), allocation.size);
    }
    *range = HintRange{begin, begin + size, allocation.base, allocation.device,
                       allocation.backing == Backing::releasable, allocation.memory()};
    return UVM_OK;
  }
  const void* last = reinterpret_cast<const void*>(begin + size - 1);
  // A query that fails for another reason than the pointer (which older drivers refuse with
  // cudaErrorInvalidValue for host memory) is the caller's to know, not "not managed".
  bool managed[2] = {false, false};
  const void* ends[2] = {ptr, last};
  for (int i = 0; i < 2; ++i) {
    if (cudaError_t e = cuda_reports_managed(ends[i], &managed[i]); e != cudaSuccess && e != cudaErrorInvalidValue) {
      return fail_cuda(call, e, "cudaPointerGetAttributes(%p)", ends[i]);
    }
  }
  if (!managed[0] || !managed[1]) {
    return fail(call, UVM_ERROR_NOT_MANAGED,
                "not CUDA managed memory (neither a uvm allocation nor cudaMallocManaged memory); "
                "allocate it with uvm_malloc or a uvm pool");
  }
  int current = 0;
  if (cudaError_t e = cudaGetDevice(&current)) return fail_cuda(call, e, "cudaGetDevice");
  *range = HintRange{begin, begin + size, 0, current};
  return UVM_OK;
}

uvm_status check_all_managed(const Call& call, const std::vector<HintRange>& ranges, const char* what) {
  for (const HintRange& range : ranges) {
    if (!range.releasable) continue;
    return fail(call, UVM_ERROR_NOT_MANAGED,
                "%p is in a releasable allocation (%p, device memory from uvm_malloc_releasable), not "
                "managed memory: %s does not apply to it; move it with uvm_offload_ranges and "
                "uvm_onload_ranges",
                reinterpret_cast<void*>(range.begin), reinterpret_cast<void*>(range.allocation), what);
  }
  return UVM_OK;
}

uvm_status check_not_capturing(const Call& call, cudaStream_t stream) {
  cudaStreamCaptureStatus capture = cudaStreamCaptureStatusNone;
  const cudaError_t e = cudaStreamIsCapturing(stream, &capture);
  if (e == cudaErrorStreamCaptureImplicit) {
    return fail_cuda(call, e, "cudaStreamIsCapturing (the legacy stream, while another stream "
                              "captures): prefetch, advise and discard cannot be captured");
  }
  if (e != cudaSuccess) return fail_cuda(call, e, "cudaStreamIsCapturing");
  if (capture != cudaStreamCaptureStatusNone) {
    return fail(call, UVM_ERROR_CAPTURING,
                "the stream is being captured into a CUDA graph; prefetch, advise and discard "
                "cannot be captured (call it before capture or after replay)");
  }
  return UVM_OK;
}

uvm_status check_hint_support(const Call& call, int device, DeviceCaps* caps) {
  DeviceCaps found;
  if (uvm_status s = device_caps(call, device, &found)) return s;
  if (!found.concurrent_managed_access) {
    return fail(call, UVM_ERROR_UNSUPPORTED,
                "device %d lacks concurrentManagedAccess, so the driver cannot prefetch or advise "
                "managed memory on it",
                device);
  }
  if (caps) *caps = found;
  return UVM_OK;
}

}  // namespace uvm
