// uvm_discard: cudaMemDiscardBatchAsync (CUDA 13), with the legacy NULL stream made usable.
#include <atomic>

#include "../alloc/stats.hpp"
#include "target.hpp"

namespace uvm {
namespace {

#if CUDART_VERSION >= 13000
bool is_legacy_stream(cudaStream_t stream) {
  return stream == nullptr || stream == cudaStreamLegacy;
}

// The driver rejects the legacy NULL stream for discard (cudaErrorInvalidValue, measured on an
// H100). A blocking stream of uvm's own synchronizes with the legacy stream both ways, so a discard
// issued on it keeps the caller's legacy-stream order exactly. One per device, created on first use
// in that device's primary context and kept for the life of the process.
uvm_status ordering_stream(const Call& call, cudaStream_t* out) {
  static auto* streams = new std::atomic<cudaStream_t>[kMaxDevices]();
  int device = 0;
  if (cudaError_t e = cudaGetDevice(&device)) return fail_cuda(call, e, "cudaGetDevice");
  std::atomic<cudaStream_t>& slot = streams[device];
  cudaStream_t stream = slot.load(std::memory_order_acquire);
  if (stream == nullptr) {
    if (cudaError_t e = cudaStreamCreateWithFlags(&stream, cudaStreamDefault)) {
      return fail_cuda(call, e, "cudaStreamCreateWithFlags (uvm's ordering stream)");
    }
    cudaStream_t expected = nullptr;
    if (!slot.compare_exchange_strong(expected, stream)) {
      clear_cuda_error(cudaStreamDestroy(stream));
      stream = expected;
    }
  }
  *out = stream;
  return UVM_OK;
}
#endif

uvm_status discard(const Call& call, const void* ptr, size_t size, cudaStream_t stream) {
  if (size == 0) return UVM_OK;
  HintRange range;
  if (uvm_status s = resolve_range(call, ptr, size, &range)) return s;
  DeviceCaps caps;
  if (uvm_status s = check_hint_support(call, range.owner_device, &caps)) return s;
  if (!caps.discard_supported) {
    return fail(call, UVM_ERROR_UNSUPPORTED,
                "discard needs a CUDA 13 runtime and driver (cudaMemDiscardBatchAsync); this "
                "build or driver is older");
  }
#if CUDART_VERSION >= 13000
  ContextScope scope;
  if (uvm_status s = scope.enter(call, range.owner_device, ContextScope::When::only_if_none_current)) {
    return s;
  }
  if (uvm_status s = check_not_capturing(call, stream)) return s;
  if (is_legacy_stream(stream)) {
    if (uvm_status s = ordering_stream(call, &stream)) return s;
  }
  void* pointers[1] = {const_cast<void*>(ptr)};
  size_t sizes[1] = {size};
  if (cudaError_t e = cudaMemDiscardBatchAsync(pointers, sizes, 1, 0, stream)) {
    return fail_cuda(call, e, "cudaMemDiscardBatchAsync");
  }
  if (range.allocation != 0) {
    const long long host_delta = registry().record_move(
        range.allocation, range.begin - range.allocation, range.end - range.allocation,
        Move::discarded);
    record_discard(range.owner_device, size, host_delta);
  }
  return UVM_OK;
#else
  (void)stream;
  return fail(call, UVM_ERROR_UNSUPPORTED, "uvm was built against CUDA < 13, which has no discard");
#endif
}

}  // namespace
}  // namespace uvm

extern "C" uvm_status uvm_discard(const void* ptr, size_t size, cudaStream_t stream) {
  const uvm::Call call = uvm::Call::of("uvm_discard").with_ptr(ptr).with_size(size);
  return uvm::guarded(call, [&] { return uvm::discard(call, ptr, size, stream); });
}
