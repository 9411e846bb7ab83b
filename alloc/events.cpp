#include "events.hpp"

#include "devices.hpp"

namespace uvm {
namespace {

// Creates an event and records it on `stream`: the event, or the CUDA error and the call that failed.
// Ordering events skip timing (cheaper to record and wait on); timing events are cudaEventCreate's
// default.
cudaError_t create_and_record(cudaStream_t stream, bool timing, EventRef* out, const char** failed_call) {
  auto event = std::make_shared<CudaEvent>();
  if (clear_cuda_error(cudaGetDevice(&event->device)) != cudaSuccess) event->device = -1;
  cudaError_t e = timing ? cudaEventCreate(&event->handle)
                         : cudaEventCreateWithFlags(&event->handle, cudaEventDisableTiming);
  if (e != cudaSuccess) {
    event->handle = nullptr;
    *failed_call = timing ? "cudaEventCreate" : "cudaEventCreateWithFlags";
    return e;
  }
  if ((e = cudaEventRecord(event->handle, stream)) != cudaSuccess) {
    *failed_call = "cudaEventRecord";
    return e;
  }
  *out = std::move(event);
  return cudaSuccess;
}

}  // namespace

CudaEvent::~CudaEvent() {
  if (handle == nullptr) return;
  ContextScope scope;
  if (device >= 0) (void)scope.enter(Call::of("cudaEventDestroy"), device, ContextScope::When::only_if_none_current);
  clear_cuda_error(cudaEventDestroy(handle));
}

EventRef try_record(cudaStream_t stream) {
  EventRef event;
  const char* failed_call = nullptr;
  clear_cuda_error(create_and_record(stream, false, &event, &failed_call));
  return event;
}

EventRef try_record_timing(cudaStream_t stream) {
  EventRef event;
  const char* failed_call = nullptr;
  clear_cuda_error(create_and_record(stream, true, &event, &failed_call));
  return event;
}

uvm_status record_event(const Call& call, cudaStream_t stream, EventRef* out) {
  const char* failed_call = nullptr;
  if (cudaError_t e = create_and_record(stream, false, out, &failed_call)) return fail_cuda(call, e, "%s", failed_call);
  return UVM_OK;
}

uvm_status mark_or_wait(const Call& call, cudaStream_t stream, EventRef* out) {
  out->reset();
  const char* failed_call = nullptr;
  const cudaError_t e = clear_cuda_error(create_and_record(stream, false, out, &failed_call));
  if (e == cudaSuccess) return UVM_OK;
  if (cudaError_t waited = cudaStreamSynchronize(stream)) {
    return fail_cuda(call, waited, "cudaStreamSynchronize (standing in for an event: %s gave %s)", failed_call,
                     cudaGetErrorName(e));
  }
  return UVM_OK;
}

}  // namespace uvm
