// CUDA events that mark where work on a stream ends, shared by whoever must wait for it (the next
// move of the same bytes, a reader of staging memory, a release of physical memory).
#pragma once

#include <cuda_runtime_api.h>

#include <memory>

#include "errors.hpp"

namespace uvm {

// A CUDA event owned by whoever still needs to wait on it; destroyed with its last owner, in its
// device's context when the destroying thread has none current (a runtime call with no context
// current would create the selected device's, usually device 0's: a GPU run found a move on
// device 1 doing that).
struct CudaEvent {
  cudaEvent_t handle = nullptr;
  int device = -1;  // whose context was current when it was created
  CudaEvent() = default;
  CudaEvent(const CudaEvent&) = delete;
  CudaEvent& operator=(const CudaEvent&) = delete;
  ~CudaEvent();
};
using EventRef = std::shared_ptr<CudaEvent>;

// An event (no timing) of the current context recorded on `stream` now, or null if none could be
// created or recorded; records no error and leaves none pending.
EventRef try_record(cudaStream_t stream);

// The same with timing (cudaEventCreate), for cudaEventElapsedTime: the marks of trace.hpp.
EventRef try_record_timing(cudaStream_t stream);

// An event recorded on `stream` now; fails naming the CUDA call that failed.
uvm_status record_event(const Call& call, cudaStream_t stream, EventRef* out);

// An event recorded where the work issued on `stream` so far ends. If none can be had, waits for
// the stream instead and gives null ("already complete"), recording no error; fails only if that
// wait fails.
uvm_status mark_or_wait(const Call& call, cudaStream_t stream, EventRef* out);

// While alive, this thread may make the calls a capture in the global mode forbids (event queries
// and waits, which were seen to invalidate a capture on another stream). For calls that touch
// only uvm's own events and memory, never a capturing stream: the caller's capture survives.
class RelaxedCapture {
 public:
  RelaxedCapture() { changed_ = clear_cuda_error(cudaThreadExchangeStreamCaptureMode(&mode_)) == cudaSuccess; }
  ~RelaxedCapture() {
    if (changed_) clear_cuda_error(cudaThreadExchangeStreamCaptureMode(&mode_));
  }
  RelaxedCapture(const RelaxedCapture&) = delete;
  RelaxedCapture& operator=(const RelaxedCapture&) = delete;

 private:
  cudaStreamCaptureMode mode_ = cudaStreamCaptureModeRelaxed;
  bool changed_ = false;
};

}  // namespace uvm
