#include "sm_copy.hpp"

#include <cuda.h>

#include <cstdint>
#include <cstdlib>
#include <map>
#include <mutex>
#include <string>
#include <utility>

#include "../../alloc/driver_api.hpp"
#include "../coder/kernels.hpp"
#include "../media/pinned.hpp"

namespace uvm {
namespace {

// uvm_copy_words(dst, src, words): each thread copies 16-byte words dst[i] = src[i], i from its global
// index in steps of the whole grid. Written for sm_70, the oldest GPU with the managed-memory
// features uvm needs; the driver compiles it for the GPU at hand.
constexpr char kCopyPtx[] = R"(
.version 7.0
.target sm_70
.address_size 64

.visible .entry uvm_copy_words(.param .u64 dst, .param .u64 src, .param .u64 words)
{
  .reg .pred %p;
  .reg .b32 %r<8>;
  .reg .b64 %rd<10>;

  ld.param.u64 %rd1, [dst];
  ld.param.u64 %rd2, [src];
  ld.param.u64 %rd3, [words];
  cvta.to.global.u64 %rd1, %rd1;
  cvta.to.global.u64 %rd2, %rd2;
  mov.u32 %r0, %ctaid.x;
  mov.u32 %r1, %ntid.x;
  mov.u32 %r2, %tid.x;
  mov.u32 %r3, %nctaid.x;
  mul.wide.u32 %rd4, %r0, %r1;
  cvt.u64.u32 %rd5, %r2;
  add.s64 %rd4, %rd4, %rd5;
  mul.wide.u32 %rd6, %r3, %r1;
  setp.ge.u64 %p, %rd4, %rd3;
  @%p bra DONE;
LOOP:
  shl.b64 %rd7, %rd4, 4;
  add.s64 %rd8, %rd2, %rd7;
  ld.global.v4.u32 {%r4, %r5, %r6, %r7}, [%rd8];
  add.s64 %rd9, %rd1, %rd7;
  st.global.v4.u32 [%rd9], {%r4, %r5, %r6, %r7};
  add.s64 %rd4, %rd4, %rd6;
  setp.lt.u64 %p, %rd4, %rd3;
  @%p bra LOOP;
DONE:
  ret;
}
)";

constexpr size_t kWordBytes = 16;
// Threads in flight per SM: two blocks of 1,024, as bench/probes/transfer_probe.cu ran it, to keep enough
// 16-byte reads in flight over PCIe.
constexpr unsigned kThreadsPerBlock = 1024;
constexpr unsigned kBlocksPerSm = 2;

// The kernel as loaded on one device, and the blocks it is launched with there.
struct LoadedKernel {
  CUfunction function = nullptr;
  unsigned blocks = 0;
};

// Why the kernel cannot serve `device` (for a message), or null when it can: the driver offers the
// module calls, the device runs sm_70 code and reads registered memory through its host pointer.
// Records no error and leaves no CUDA error pending.
const char* kernel_refusal(int device) {
  if (!kernels_available()) {
    return "the driver does not offer cuModuleLoadData, cuModuleGetFunction and cuLaunchKernel";
  }
  int major = 0, host_pointer = 0;
  if (clear_cuda_error(cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, device)) != cudaSuccess ||
      major < 7) {
    return "uvm's copy kernel needs compute capability 7.0 or newer";
  }
  if (clear_cuda_error(cudaDeviceGetAttribute(&host_pointer, cudaDevAttrCanUseHostPointerForRegisteredMem,
                                              device)) != cudaSuccess ||
      host_pointer == 0) {
    return "the device cannot read pinned memory through its host pointer "
           "(cudaDevAttrCanUseHostPointerForRegisteredMem is 0)";
  }
  return nullptr;
}

std::mutex loaded_mutex;
std::map<int, LoadedKernel>* loaded = new std::map<int, LoadedKernel>();  // by device; never destroyed

uvm_status load_kernel(const Call& call, int device, LoadedKernel* out) {
  std::lock_guard<std::mutex> lock(loaded_mutex);
  if (auto found = loaded->find(device); found != loaded->end()) {
    *out = found->second;
    return UVM_OK;
  }
  if (const char* why = kernel_refusal(device)) {
    return fail(call, UVM_ERROR_UNSUPPORTED, "UVM_ONLOAD_COPY asks for uvm's copy kernel on device %d, but %s; use "
                "UVM_ONLOAD_COPY=engine", device, why);
  }
  int sms = 0;
  if (cudaError_t e = cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, device)) {
    return fail_cuda(call, e, "cudaDeviceGetAttribute(MultiProcessorCount, device %d)", device);
  }
  LoadedKernel kernel;
  kernel.blocks = static_cast<unsigned>(sms > 0 ? sms : 1) * kBlocksPerSm;
  if (uvm_status s = load_kernel_function(call, device, kCopyPtx, "uvm_copy_words",
                                          "the SM copy kernel (UVM_ONLOAD_COPY=engine avoids it)", &kernel.function)) {
    return s;
  }
  (*loaded)[device] = kernel;
  *out = kernel;
  return UVM_OK;
}

}  // namespace

OnloadCopy auto_copy(size_t free_bytes, size_t staged_bytes) {
  return free_bytes / kAutoKernelFreeFactor > staged_bytes ? OnloadCopy::sm : OnloadCopy::engine;
}

OnloadCopy copy_for_worker(OnloadCopy setting, int worker) {
  if (setting != OnloadCopy::mixed) return setting;
  return worker % 2 == 1 ? OnloadCopy::sm : OnloadCopy::engine;
}

uvm_status onload_copy_for(const Call& call, int device, size_t staged_bytes, OnloadCopy* out) {
  if (uvm_status s = check_options(call)) return s;
  *out = options().onload_copy;
  if (*out != OnloadCopy::automatic) return UVM_OK;
  if (staged_bytes == 0 || kernel_refusal(device) != nullptr) {
    *out = OnloadCopy::engine;
    return UVM_OK;
  }
  size_t free_bytes = 0, total_bytes = 0;  // a failed query leaves 0 free: the engine
  clear_cuda_error(cudaMemGetInfo(&free_bytes, &total_bytes));
  *out = auto_copy(free_bytes, staged_bytes);
  return UVM_OK;
}

bool sm_copyable(const void* dst, const void* host, size_t bytes) {
  const auto aligned = [](const void* p) { return reinterpret_cast<uintptr_t>(p) % kWordBytes == 0; };
  return configured_pinned_kind() != PinnedKind::pageable && bytes > 0 && bytes % kWordBytes == 0 &&
         aligned(dst) && aligned(host);
}

uvm_status sm_copy(const Call& call, int device, void* dst, const void* host, size_t bytes, cudaStream_t stream) {
  LoadedKernel kernel;
  if (uvm_status s = load_kernel(call, device, &kernel)) return s;
  uint64_t words = bytes / kWordBytes;
  void* params[] = {&dst, &host, &words};
  if (CUresult r = launch_kernel(kernel.function, kernel.blocks, kThreadsPerBlock, stream, params)) {
    return fail_driver(call, r, "cuLaunchKernel(SM copy of %zu bytes from pinned %p to %p, device %d)", bytes, host,
                       dst, device);
  }
  return UVM_OK;
}

}  // namespace uvm
