// A test double of the few CUDA runtime (and driver entry-point) calls uvm makes, linked only into
// the CPU test programs in place of libcudart. It models devices, contexts (the thread's current
// context vs its selected device), the thread's pending error, managed allocations in host memory,
// and a log of every hint call, so uvm's logic can be checked exactly without a GPU.
//
// Devices are fixed per process, because uvm caches device probes for the life of a process:
//   device 0: managed, concurrentManagedAccess, 1 GiB      device 1: same, 512 MiB
//   device 2: managed, no concurrentManagedAccess, 256 MiB
// env FAKE_CUDA_SCENARIO picks a different world at start-up:
//   no_driver       cudaGetDeviceCount fails with cudaErrorInsufficientDriver
//   no_entry_points the driver entry points cannot be resolved (uvm's runtime fallback)
//   cuda12          driver and runtime report 12.8 (no discard)
//   pre_volta       the devices report compute capability 6.x (9.x otherwise): uvm's copy kernel
//                   cannot run there
#pragma once

#include <cuda_runtime_api.h>

#include <cstddef>
#include <ostream>
#include <string>
#include <vector>

namespace fake {

constexpr int kNoContext = -1;

// The byte new physical memory (cuMemMap) is filled with, so that data a test expects back is
// never there by accident.
constexpr unsigned char kFreshPhysical = 0xA5;

// Live virtual-memory reservations (releasable allocations) and how many are mapped.
size_t live_reservations();
size_t mapped_reservations();
// The next cuMemAddressReserve asks for the range at `address` (when free, the kernel gives it), as
// the driver hands a freed range out again; so a test can have a new allocation where a freed one was.
void reserve_next_at(const void* address);
// Physical memory created (cuMemCreate) and not given back, mapped or not: handles and bytes.
size_t physical_handles();
size_t physical_bytes();
// Whether the last physical memory created (cuMemCreate) asked to be GPUDirect RDMA capable.
bool last_created_rdma_capable();
// Whether the physical memory mapped at `ptr` was made exportable (what cuMemRetainAllocationHandle
// and cuMemExportToShareableHandle, NCCL's way of registering a peer's buffer, would succeed on).
bool exportable_at(const void* ptr);

// What a logged call did. An enum, not a string, so that a test naming an op that does not exist
// fails to compile instead of finding none (and passing a check that none happened).
enum class OpKind {
  prefetch, advise_preferred, advise_accessed_by, discard, malloc, free,
  copy_to_host, copy_to_device,  // ptr: the device side
  host_alloc, host_free, host_register, host_unregister, event_record, event_sync, wait_event,  // event ops: ptr is the event
  stream_sync, device_sync, vmm_create, vmm_map, vmm_unmap,
  timing_mark,  // a record of a timing event (cudaEventCreate); fail_next("cudaEventRecord(timing)") fails one
  sm_copy,      // uvm's copy kernel launched (cuLaunchKernel): ptr is the device side, size the bytes
  vmm_release,  // physical memory given back to the driver (cuMemRelease): size its bytes
  codec_kernel  // a kernel of the compressed backups' coder launched: ptr its source, size its chunks
};

// How fast the virtual clock that timing events read says copies and prefetches run (every op
// also takes a microsecond): 10 and 20 GB/s.
constexpr double kCopyBytesPerMicrosecond = 10e3;
constexpr double kPrefetchBytesPerMicrosecond = 20e3;

// The kind's name, for failure messages.
const char* name(OpKind kind);
std::ostream& operator<<(std::ostream& out, OpKind kind);

struct Op {
  OpKind call;
  const void* ptr;
  size_t size;
  int location;       // device ordinal or -1 (CPU); for malloc/free the context's device
  cudaStream_t stream;
  int context_device; // the device whose context was current when the call ran
};

// Forgets allocations, the op log, injected failures and capture state, and lets go of a call held
// or armed to be held (a test that failed before its release_held leaves the next test nothing to
// wait on); keeps contexts, this thread's current context, pinned memory and events (uvm keeps its
// staging memory for the life of the process).
void reset();

// The next call to `call_name` (e.g. "cudaMallocManaged") returns `error` instead of running;
// `skip` calls of it pass first (fail_next("cudaHostUnregister", e, 1) fails the second).
void fail_next(const std::string& call_name, cudaError_t error, int skip = 0);
// Whether a failure asked for with fail_next has not happened yet (its calls never came), and
// forgetting every such failure.
bool injection_left(const std::string& call_name);
void clear_injections();

// The next call to `call_name` ("cudaHostAlloc", "cudaHostRegister", "cudaFreeHost" or
// "cudaHostUnregister", which take long on a real machine, "cudaDeviceSynchronize", "cuMemCreate",
// which can wait for the driver after a large free, or "cudaMemcpyAsync", which the driver issued
// slowly beside a registration) waits, holding no lock of the double's, until release_held(); so a test can check what
// other threads can do meanwhile. wait_until_held gives true once a call is waiting there; its
// bound is one only a failing test reaches: a suite under a sanitizer on a loaded 2-core host takes
// seconds to get a held call there, so a shorter one fails tests that are right.
// `skip` calls of it pass first (hold_next("cudaHostRegister", 1) holds the second).
void hold_next(const std::string& call_name, int skip = 0);
constexpr int kHeldWithinMs = 300000;
bool wait_until_held(int timeout_ms = kHeldWithinMs);
void release_held();
// Two calls held at once: hold_next the second once the first waits (hold_next arms one call at a
// time); then wait for, and let go of, one by its name while the other stays held.
bool wait_until_held(const std::string& call_name, int timeout_ms = kHeldWithinMs);
void release_held(const std::string& call_name);

// Forgets the op log only.
void reset_ops();

// The GPU wrote [ptr, ptr + size) of managed memory (a kernel, or a copy from elsewhere): discarded
// bytes hold data again, but the driver still counts them as discarded, as after a copy into them
// (measured for copies; assumed for kernels) until a prefetch to the device.
void device_wrote(const void* ptr, size_t size);

// From now on, events recorded stay not reached (cudaEventQuery: cudaErrorNotReady) until
// cudaEventSynchronize waits for them, as if the GPU were still running the work before them;
// false: recorded events complete at once again. reset() sets it back to false.
void set_events_pending(bool pending_from_now);
bool event_pending(cudaEvent_t event);

// Marks a stream as being captured in the global mode (cudaStreamIsCapturing reports Active).
// While any is, event queries and waits from a thread whose capture mode is not relaxed
// (cudaThreadExchangeStreamCaptureMode) fail and invalidate the capture, as on the driver.
void set_capturing(cudaStream_t stream, bool capturing);
bool capture_invalidated();

// A distinct stream handle (never dereferenced).
cudaStream_t make_stream();

std::vector<Op> ops();
size_t live_allocations();
size_t live_events();

// This thread's current context (device ordinal or kNoContext), and whether a device's context
// exists. set_thread_context(kNoContext) simulates a fresh thread.
// The number of pinned host blocks alive (cudaHostAlloc'ed or cudaHostRegister'ed).
size_t pinned_blocks();

int current_context();
void set_thread_context(int device);
bool context_created(int device);

}  // namespace fake
