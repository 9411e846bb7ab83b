#include "streams.hpp"

#include <atomic>

#include "../../alloc/devices.hpp"

namespace uvm {
namespace {

constexpr int kSlotsPerDevice = 1 + kMaxWorkerStreams;  // the ordering stream, then the workers

// Returns the stream in `slot` of the current device, creating it with `flags` on first use.
uvm_status stream_in_slot(const Call& call, int slot, unsigned flags, cudaStream_t* out) {
  static auto* streams = new std::atomic<cudaStream_t>[kMaxDevices * kSlotsPerDevice]();
  int device = 0;
  if (cudaError_t e = cudaGetDevice(&device)) return fail_cuda(call, e, "cudaGetDevice");
  std::atomic<cudaStream_t>& cell = streams[device * kSlotsPerDevice + slot];
  cudaStream_t stream = cell.load(std::memory_order_acquire);
  if (stream == nullptr) {
    if (cudaError_t e = cudaStreamCreateWithFlags(&stream, flags)) {
      return fail_cuda(call, e, "cudaStreamCreateWithFlags (a stream of uvm's own on device %d)", device);
    }
    cudaStream_t expected = nullptr;
    if (!cell.compare_exchange_strong(expected, stream)) {
      clear_cuda_error(cudaStreamDestroy(stream));
      stream = expected;
    }
  }
  *out = stream;
  return UVM_OK;
}

}  // namespace

uvm_status ordering_stream(const Call& call, cudaStream_t* out) {
  return stream_in_slot(call, 0, cudaStreamDefault, out);
}

uvm_status worker_streams(const Call& call, int count, cudaStream_t* out) {
  for (int i = 0; i < count && i < kMaxWorkerStreams; ++i) {
    if (uvm_status s = stream_in_slot(call, 1 + i, cudaStreamNonBlocking, &out[i])) return s;
  }
  return UVM_OK;
}

}  // namespace uvm
