#include "devices.hpp"

#include "driver_api.hpp"

#include <atomic>
#include <mutex>

namespace uvm {
namespace {

struct DeviceCountProbe {
  std::once_flag once;
  int count = 0;
  cudaError_t error = cudaSuccess;
};

DeviceCountProbe& device_count_probe() {
  // Leaked on purpose: uvm_free may run from other libraries' static destructors at exit.
  static DeviceCountProbe* probe = new DeviceCountProbe();
  return *probe;
}

// A device's capabilities, asked until a query succeeds: a failed query (a driver busy resetting, an
// injected failure) is the caller's error, not the device's for the life of the process.
struct CapsProbe {
  std::mutex mutex;
  std::atomic<bool> known{false};
  DeviceCaps caps;  // written once, under `mutex`, before `known`
};

CapsProbe* caps_probes() {
  static CapsProbe* probes = new CapsProbe[kMaxDevices];
  return probes;
}

int attribute(cudaDeviceAttr attr, int device, cudaError_t* error) {
  int value = 0;
  const cudaError_t e = cudaDeviceGetAttribute(&value, attr, device);
  if (e != cudaSuccess && *error == cudaSuccess) *error = e;
  return value;
}

bool discard_available(bool concurrent_managed_access) {
#if CUDART_VERSION >= 13000
  int runtime = 0, driver = 0;
  if (clear_cuda_error(cudaRuntimeGetVersion(&runtime)) != cudaSuccess) return false;
  if (clear_cuda_error(cudaDriverGetVersion(&driver)) != cudaSuccess) return false;
  return concurrent_managed_access && runtime >= 13000 && driver >= 13000;
#else
  (void)concurrent_managed_access;
  return false;  // cudaMemDiscardBatchAsync first appears in CUDA 13.0
#endif
}

// The few driver functions the context scope needs, resolved through the runtime so that uvm links
// only against cudart.
struct DriverApi {
  CUresult (*ctx_get_current)(CUcontext*) = nullptr;
  CUresult (*ctx_set_current)(CUcontext) = nullptr;
  CUresult (*device_get)(CUdevice*, int) = nullptr;
  CUresult (*primary_ctx_retain)(CUcontext*, CUdevice) = nullptr;
  bool available = false;
};

const DriverApi& driver_api() {
  static DriverApi* api = [] {
    auto* d = new DriverApi();
    d->available = resolve_driver("cuCtxGetCurrent", &d->ctx_get_current) &&
                   resolve_driver("cuCtxSetCurrent", &d->ctx_set_current) &&
                   resolve_driver("cuDeviceGet", &d->device_get) &&
                   resolve_driver("cuDevicePrimaryCtxRetain", &d->primary_ctx_retain);
    return d;
  }();
  return *api;
}

// Each device's primary context, retained once and held for the life of the process: releasing it
// would mean a CUDA call from a static destructor.
std::atomic<CUcontext>* primary_contexts() {
  static auto* contexts = new std::atomic<CUcontext>[kMaxDevices]();
  return contexts;
}

uvm_status primary_context(const Call& call, int device, CUcontext* out) {
  std::atomic<CUcontext>& slot = primary_contexts()[device];
  CUcontext context = slot.load(std::memory_order_acquire);
  if (context == nullptr) {
    const DriverApi& d = driver_api();
    CUdevice handle = 0;
    if (CUresult r = d.device_get(&handle, device)) return fail_driver(call, r, "cuDeviceGet(%d)", device);
    if (CUresult r = d.primary_ctx_retain(&context, handle)) {
      return fail_driver(call, r, "cuDevicePrimaryCtxRetain(device %d)", device);
    }
    CUcontext expected = nullptr;
    if (!slot.compare_exchange_strong(expected, context)) context = expected;  // another thread won
  }
  *out = context;
  return UVM_OK;
}

}  // namespace

uvm_status device_count(const Call& call, int* count) {
  DeviceCountProbe& probe = device_count_probe();
  std::call_once(probe.once, [&probe] {
    probe.error = clear_cuda_error(cudaGetDeviceCount(&probe.count));
    if (probe.error != cudaSuccess) probe.count = 0;
  });
  *count = probe.count;
  if (probe.error != cudaSuccess) return fail_cuda(call, probe.error, "cudaGetDeviceCount");
  if (probe.count == 0) {
    return fail(call, UVM_ERROR_NO_DEVICE, "no CUDA device is present (cudaGetDeviceCount = 0)");
  }
  return UVM_OK;
}

uvm_status check_device(const Call& call, int device, bool allow_cpu) {
  if (allow_cpu && device == UVM_LOCATION_CPU) return UVM_OK;
  int count = 0;
  if (uvm_status s = device_count(call, &count)) return s;
  if (device < 0 || device >= count || device >= kMaxDevices) {
    return fail(call, UVM_ERROR_INVALID_ARGUMENT, "device %d is not a CUDA device (there are %d%s)",
                device, count, allow_cpu ? "; use -1 for the CPU" : "");
  }
  return UVM_OK;
}

uvm_status device_caps(const Call& call, int device, DeviceCaps* caps) {
  if (uvm_status s = check_device(call, device, false)) return s;
  CapsProbe& probe = caps_probes()[device];
  if (!probe.known.load(std::memory_order_acquire)) {
    std::lock_guard<std::mutex> hold(probe.mutex);
    if (!probe.known.load(std::memory_order_relaxed)) {
      DeviceCaps found;
      cudaError_t error = cudaSuccess;
      found.managed_memory = attribute(cudaDevAttrManagedMemory, device, &error) != 0;
      found.concurrent_managed_access = attribute(cudaDevAttrConcurrentManagedAccess, device, &error) != 0;
      found.pageable_memory_access = attribute(cudaDevAttrPageableMemoryAccess, device, &error) != 0;
      if (error != cudaSuccess) return fail_cuda(call, error, "cudaDeviceGetAttribute(device %d)", device);
      cudaDeviceProp properties{};
      if (cudaError_t e = cudaGetDeviceProperties(&properties, device)) {
        return fail_cuda(call, e, "cudaGetDeviceProperties(device %d)", device);
      }
      found.total_memory = properties.totalGlobalMem;
      found.discard_supported = discard_available(found.concurrent_managed_access);
      probe.caps = found;
      probe.known.store(true, std::memory_order_release);
    }
  }
  *caps = probe.caps;
  return UVM_OK;
}

uvm_status ContextScope::enter(const Call& call, int device, When when) {
  const DriverApi& d = driver_api();
  if (!d.available) {
    // No driver entry points: the runtime's own device switch, restored the same way.
    int current = 0;
    cudaError_t e = cudaGetDevice(&current);
    if (e != cudaSuccess) return fail_cuda(call, e, "cudaGetDevice");
    if (current == device || when == When::only_if_none_current) return UVM_OK;
    e = cudaSetDevice(device);
    if (e != cudaSuccess) return fail_cuda(call, e, "cudaSetDevice(%d)", device);
    saved_device_ = current;
    used_runtime_fallback_ = true;
    switched_ = true;
    return UVM_OK;
  }
  CUcontext current = nullptr;
  if (CUresult r = d.ctx_get_current(&current)) {
    return fail(call, UVM_ERROR_CUDA, "cuCtxGetCurrent failed: CUresult %d", static_cast<int>(r));
  }
  if (current != nullptr && when == When::only_if_none_current) return UVM_OK;
  CUcontext target = nullptr;
  if (uvm_status s = primary_context(call, device, &target)) return s;
  if (target == current) return UVM_OK;
  if (CUresult r = d.ctx_set_current(target)) {
    return fail(call, UVM_ERROR_CUDA, "cuCtxSetCurrent(device %d) failed: CUresult %d", device,
                static_cast<int>(r));
  }
  saved_context_ = current;
  switched_ = true;
  return UVM_OK;
}

ContextScope::~ContextScope() {
  if (!switched_) return;
  if (used_runtime_fallback_) {
    clear_cuda_error(cudaSetDevice(saved_device_));
  } else {
    driver_api().ctx_set_current(static_cast<CUcontext>(saved_context_));
  }
}

}  // namespace uvm

extern "C" {

int uvm_device_count(void) {
  const uvm::Call call = uvm::Call::of("uvm_device_count");
  int count = 0;
  (void)uvm::guarded(call, [&] { return uvm::device_count(call, &count); });
  return count;
}

uvm_status uvm_device_capabilities(int device, uvm_device_caps* caps) {
  const uvm::Call call = uvm::Call::of("uvm_device_capabilities").with_device(device);
  return uvm::guarded(call, [&] {
    if (caps == nullptr) return uvm::fail(call, UVM_ERROR_INVALID_ARGUMENT, "caps is NULL");
    uvm::DeviceCaps found;
    if (uvm_status s = uvm::device_caps(call, device, &found)) return s;
    caps->managed_memory = found.managed_memory;
    caps->concurrent_managed_access = found.concurrent_managed_access;
    caps->pageable_memory_access = found.pageable_memory_access;
    caps->discard_supported = found.discard_supported;
    caps->total_memory = found.total_memory;
    return UVM_OK;
  });
}

uvm_status uvm_device_synchronize(int device) {
  const uvm::Call call = uvm::Call::of("uvm_device_synchronize").with_device(device);
  return uvm::guarded(call, [&] {
    if (uvm_status s = uvm::check_device(call, device, false)) return s;
    uvm::ContextScope scope;
    if (uvm_status s = scope.enter(call, device, uvm::ContextScope::When::always)) return s;
    if (cudaError_t e = cudaDeviceSynchronize()) return uvm::fail_cuda(call, e, "cudaDeviceSynchronize");
    return UVM_OK;
  });
}

}  // extern "C"
