#include "vmm.hpp"

#include <mutex>
#include <unordered_map>
#include <vector>

#include "devices.hpp"
#include "driver_api.hpp"
#include "settle.hpp"

namespace uvm {
namespace {

struct VmmApi {
  CUresult (*get_granularity)(size_t*, const CUmemAllocationProp*, CUmemAllocationGranularity_flags) = nullptr;
  CUresult (*address_reserve)(CUdeviceptr*, size_t, size_t, CUdeviceptr, unsigned long long) = nullptr;
  CUresult (*address_free)(CUdeviceptr, size_t) = nullptr;
  CUresult (*create)(CUmemGenericAllocationHandle*, size_t, const CUmemAllocationProp*, unsigned long long) = nullptr;
  CUresult (*release)(CUmemGenericAllocationHandle) = nullptr;
  CUresult (*map)(CUdeviceptr, size_t, size_t, CUmemGenericAllocationHandle, unsigned long long) = nullptr;
  CUresult (*unmap)(CUdeviceptr, size_t) = nullptr;
  CUresult (*set_access)(CUdeviceptr, size_t, const CUmemAccessDesc*, size_t) = nullptr;
  CUresult (*device_get)(CUdevice*, int) = nullptr;                             // optional: for
  CUresult (*device_attribute)(int*, CUdevice_attribute, CUdevice) = nullptr;  // memory_caps only
  // Optional: sharing with other processes (share/export.hpp).
  CUresult (*export_handle)(void*, CUmemGenericAllocationHandle, CUmemAllocationHandleType, unsigned long long) = nullptr;
  CUresult (*import_handle)(CUmemGenericAllocationHandle*, void*, CUmemAllocationHandleType) = nullptr;
  bool available = false;
};

const VmmApi& vmm_api() {
  static VmmApi* api = [] {
    auto* a = new VmmApi();
    a->available = resolve_driver("cuMemGetAllocationGranularity", &a->get_granularity) &&
                   resolve_driver("cuMemAddressReserve", &a->address_reserve) &&
                   resolve_driver("cuMemAddressFree", &a->address_free) &&
                   resolve_driver("cuMemCreate", &a->create) && resolve_driver("cuMemRelease", &a->release) &&
                   resolve_driver("cuMemMap", &a->map) && resolve_driver("cuMemUnmap", &a->unmap) &&
                   resolve_driver("cuMemSetAccess", &a->set_access);
    if (!resolve_driver("cuDeviceGet", &a->device_get) || !resolve_driver("cuDeviceGetAttribute", &a->device_attribute)) {
      a->device_get = nullptr;
      a->device_attribute = nullptr;
    }
    if (!resolve_driver("cuMemExportToShareableHandle", &a->export_handle) ||
        !resolve_driver("cuMemImportFromShareableHandle", &a->import_handle)) {
      a->export_handle = nullptr;
      a->import_handle = nullptr;
    }
    return a;
  }();
  return *api;
}

// What physical memory of a device can be asked to be, known once asked.
struct MemoryCaps {
  bool rdma = false;      // a NIC may register it (GPUDirect RDMA)
  bool exportable = false;  // another process may map it, through a POSIX file descriptor
};

// Asks `attribute` of `device`: a driver that does not know it (CUDA_ERROR_INVALID_VALUE) lacks the
// feature; any other failure is the caller's error.
uvm_status device_flag(const Call& call, CUdevice handle, int device, CUdevice_attribute attribute, const char* name,
                       bool* value) {
  int answer = 0;
  const CUresult r = vmm_api().device_attribute(&answer, attribute, handle);
  if (r != CUDA_SUCCESS && r != CUDA_ERROR_INVALID_VALUE) {
    return fail_driver(call, r, "cuDeviceGetAttribute(%s, device %d)", name, device);
  }
  *value = r == CUDA_SUCCESS && answer != 0;
  return UVM_OK;
}

// Whether the device lets a NIC register VMM memory (GPUDirect RDMA), and another process map it
// (uvm_share_export): where it does, releasable memory asks for it, as torch_memory_saver's does for
// RDMA, so that NIXL, Mooncake or NCCL over InfiniBand can register tensors made in a region, and
// torch.multiprocessing can send them. A driver without the attributes or the calls has no such
// memory; any other failure is the caller's error and is asked again next time, since memory made
// without the flag would fail only later, in the NIC's registration or the other process's import,
// far from its cause.
uvm_status memory_caps(const Call& call, int device, MemoryCaps* caps) {
  static std::mutex lock;
  static auto* known = new std::unordered_map<int, MemoryCaps>;  // never destroyed: frees run at exit
  std::lock_guard<std::mutex> hold(lock);
  if (auto it = known->find(device); it != known->end()) {
    *caps = it->second;
    return UVM_OK;
  }
  const VmmApi& api = vmm_api();
  MemoryCaps found;
  if (api.device_attribute != nullptr) {
    CUdevice handle = 0;
    if (CUresult r = api.device_get(&handle, device)) return fail_driver(call, r, "cuDeviceGet(%d)", device);
    if (uvm_status s = device_flag(call, handle, device, CU_DEVICE_ATTRIBUTE_GPU_DIRECT_RDMA_WITH_CUDA_VMM_SUPPORTED,
                                   "GPU_DIRECT_RDMA_WITH_CUDA_VMM_SUPPORTED", &found.rdma)) {
      return s;
    }
    if (uvm_status s = device_flag(call, handle, device, CU_DEVICE_ATTRIBUTE_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR_SUPPORTED,
                                   "HANDLE_TYPE_POSIX_FILE_DESCRIPTOR_SUPPORTED", &found.exportable)) {
      return s;
    }
  }
  *caps = found;
  known->emplace(device, found);
  return UVM_OK;
}

// What physical memory of `device` is asked to be; `exportable`: memory another process may map,
// where the device can export (an allocation that asked: Mapping::shared).
uvm_status device_memory(const Call& call, int device, CUmemAllocationProp* prop, bool exportable = false) {
  MemoryCaps caps;
  if (uvm_status s = memory_caps(call, device, &caps)) return s;
  *prop = CUmemAllocationProp{};
  prop->type = CU_MEM_ALLOCATION_TYPE_PINNED;
  prop->location.type = CU_MEM_LOCATION_TYPE_DEVICE;
  prop->location.id = device;
  prop->allocFlags.gpuDirectRDMACapable = caps.rdma ? 1 : 0;
  if (exportable && caps.exportable) prop->requestedHandleTypes = CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR;
  return UVM_OK;
}

// Gives physical memory of `device` back to the driver. Whoever releases pays the driver's pending
// work after a wake itself, so the polls that would have paid it end (settle.hpp).
CUresult release_physical(CUmemGenericAllocationHandle handle, int device) {
  settle_cancel(device);
  return vmm_api().release(handle);
}

// Physical memory kept for the next map (vmm.hpp, "Spare memory"). Its own lock: maps and unmaps
// run under the moves lock, new allocations outside it.
struct Spare {
  int device;
  size_t bytes;
  CUmemGenericAllocationHandle handle;
};

struct SparePool {
  std::mutex mutex;
  std::vector<Spare> kept;  // oldest first
  size_t limit[kMaxDevices] = {};
  size_t held[kMaxDevices] = {};
};

SparePool& spare_pool() {
  static auto* pool = new SparePool();  // never destroyed: no CUDA calls from static destructors
  return *pool;
}

// Gives spare memory of `device` back, oldest first, until at most `keep` bytes are held. Memory the
// driver would not take stays spare, for the next try (a later trim, or a map of its size); the
// first failure is the call's.
uvm_status trim_spares(const Call& call, SparePool& pool, int device, size_t keep) {
  uvm_status status = UVM_OK;
  size_t kept_back = 0;  // bytes whose release failed: they stay, and do not stop the others going
  for (auto it = pool.kept.begin(); it != pool.kept.end() && pool.held[device] > keep + kept_back;) {
    if (it->device != device) {
      ++it;
      continue;
    }
    if (CUresult r = release_physical(it->handle, device)) {
      if (status == UVM_OK) status = fail_driver(call, r, "cuMemRelease(%zu bytes of spare memory on device %d)", it->bytes, device);
      kept_back += it->bytes;
      ++it;
      continue;
    }
    pool.held[device] -= it->bytes;
    it = pool.kept.erase(it);
  }
  return status;
}

// A spare handle of exactly `bytes` on `device`, or 0.
CUmemGenericAllocationHandle take_spare(int device, size_t bytes) {
  SparePool& pool = spare_pool();
  std::lock_guard<std::mutex> lock(pool.mutex);
  for (auto it = pool.kept.begin(); it != pool.kept.end(); ++it) {
    if (it->device == device && it->bytes == bytes) {
      const CUmemGenericAllocationHandle handle = it->handle;
      pool.held[device] -= bytes;
      pool.kept.erase(it);
      return handle;
    }
  }
  return 0;
}

// Gives the unmapped physical memory of `m` back, or keeps it as spare memory if the device's limit
// has room for it (giving back older spares to make room). Either way it is no longer `m`'s; memory
// the driver would not take stays `m`'s (the next map maps it, the free tries again).
uvm_status release_or_keep(const Call& call, uintptr_t base, Mapping* m) {
  SparePool& pool = spare_pool();
  std::unique_lock<std::mutex> lock(pool.mutex);
  if (m->device >= 0 && m->device < kMaxDevices && m->reserved <= pool.limit[m->device]) {
    const uvm_status trimmed = trim_spares(call, pool, m->device, pool.limit[m->device] - m->reserved);
    pool.kept.push_back(Spare{m->device, m->reserved, m->handle});
    pool.held[m->device] += m->reserved;
    m->handle = 0;
    return trimmed;
  }
  lock.unlock();
  if (CUresult r = release_physical(m->handle, m->device)) {
    return fail_driver(call, r, "cuMemRelease(physical memory of %p)", reinterpret_cast<void*>(base));
  }
  m->handle = 0;
  return UVM_OK;
}

// Physical memory for `m` on `device`: spare memory of its size (never for exportable memory:
// spares are not), else new (`*created`).
uvm_status create_physical(const Call& call, int device, const CUmemAllocationProp& prop, const Mapping& m,
                           CUmemGenericAllocationHandle* out, bool* created) {
  *created = false;
  const bool exportable = prop.requestedHandleTypes != CU_MEM_HANDLE_TYPE_NONE;
  if (!exportable && (*out = take_spare(device, m.reserved)) != 0) return UVM_OK;
  CUresult r = vmm_api().create(out, m.reserved, &prop, 0);
  if (r == CUDA_ERROR_OUT_OF_MEMORY && vmm_spare_bytes(device) > 0) {  // spare memory of other sizes
    {
      SparePool& pool = spare_pool();
      std::lock_guard<std::mutex> lock(pool.mutex);
      if (uvm_status s = trim_spares(call, pool, device, 0)) return s;
    }
    r = vmm_api().create(out, m.reserved, &prop, 0);
  }
  if (r != CUDA_SUCCESS) return fail_driver(call, r, "cuMemCreate(%zu bytes on device %d)", m.reserved, device);
  *created = true;
  return UVM_OK;
}

// Maps physical memory on `device` for `m` at `base`, read-write for that device (`*created`: new
// physical memory, not spare): memory `m` still holds (its release failed) first. On failure nothing
// new stays created or mapped.
uvm_status map_physical(const Call& call, uintptr_t base, int device, Mapping* m, bool* created) {
  const VmmApi& api = vmm_api();
  *created = false;
  CUmemAllocationProp prop;
  if (uvm_status s = device_memory(call, device, &prop, m->shared)) return s;
  CUmemGenericAllocationHandle handle = m->handle;
  if (handle == 0) {
    if (uvm_status s = create_physical(call, device, prop, *m, &handle, created)) return s;
  }
  // Memory this call took (new or spare) goes back on failure; memory `m` held stays `m`'s.
  const auto give_back_taken = [&] {
    if (handle != m->handle) api.release(handle);
  };
  if (CUresult r = api.map(base, m->reserved, 0, handle, 0)) {
    give_back_taken();
    return fail_driver(call, r, "cuMemMap(%p, %zu bytes)", reinterpret_cast<void*>(base), m->reserved);
  }
  CUmemAccessDesc access{};
  access.location = prop.location;
  access.flags = CU_MEM_ACCESS_FLAGS_PROT_READWRITE;
  if (CUresult r = api.set_access(base, m->reserved, &access, 1)) {
    api.unmap(base, m->reserved);
    give_back_taken();
    return fail_driver(call, r, "cuMemSetAccess(%p, %zu bytes, device %d)", reinterpret_cast<void*>(base),
                       m->reserved, device);
  }
  if (handle != m->handle) m->exportable = prop.requestedHandleTypes != CU_MEM_HANDLE_TYPE_NONE;  // new memory
  m->handle = handle;
  m->mapped = true;
  m->device = device;
  return UVM_OK;
}

// Unmaps `m` at `base`; its physical memory is given back, or kept as spare memory if `may_keep`
// (exportable memory never is: a spare may be mapped for any allocation).
uvm_status unmap_physical(const Call& call, uintptr_t base, Mapping* m, bool may_keep) {
  const VmmApi& api = vmm_api();
  if (CUresult r = api.unmap(base, m->reserved)) {
    return fail_driver(call, r, "cuMemUnmap(%p, %zu bytes)", reinterpret_cast<void*>(base), m->reserved);
  }
  m->mapped = false;
  if (may_keep && !m->exportable) return release_or_keep(call, base, m);
  if (CUresult r = release_physical(m->handle, m->device)) {  // kept, and still exportable, for the next try
    return fail_driver(call, r, "cuMemRelease(physical memory of %p)", reinterpret_cast<void*>(base));
  }
  m->handle = 0;
  m->exportable = false;
  return UVM_OK;
}

}  // namespace

uvm_status vmm_allocate(const Call& call, size_t size, int device, bool shared, void** out, Mapping* mapping) {
  const VmmApi& api = vmm_api();
  if (!api.available) {
    return fail(call, UVM_ERROR_UNSUPPORTED,
                "the driver lacks the virtual memory management calls (cuMemCreate, cuMemMap) that "
                "releasable allocations need; use uvm_malloc (managed memory)");
  }
  CUmemAllocationProp prop;
  if (uvm_status s = device_memory(call, device, &prop)) return s;
  size_t granularity = 0;
  if (CUresult r = api.get_granularity(&granularity, &prop, CU_MEM_ALLOC_GRANULARITY_MINIMUM)) {
    return fail_driver(call, r, "cuMemGetAllocationGranularity(device %d)", device);
  }
  Mapping m;
  m.shared = shared;
  m.reserved = (size + granularity - 1) / granularity * granularity;
  CUdeviceptr base = 0;
  if (CUresult r = api.address_reserve(&base, m.reserved, granularity, 0, 0)) {
    return fail_driver(call, r, "cuMemAddressReserve(%zu bytes)", m.reserved);
  }
  bool created = false;
  if (uvm_status s = map_physical(call, base, device, &m, &created)) {  // allocates no host memory
    api.address_free(base, m.reserved);
    return s;
  }
  *mapping = m;
  *out = reinterpret_cast<void*>(base);
  return UVM_OK;
}

uvm_status vmm_unmap(const Call& call, uintptr_t base, Mapping* mapping) {
  return mapping->mapped ? unmap_physical(call, base, mapping, true) : UVM_OK;
}

uvm_status vmm_map(const Call& call, uintptr_t base, int device, Mapping* mapping) {
  if (mapping->mapped) return UVM_OK;
  bool created = false;
  const uvm_status status = map_physical(call, base, device, mapping, &created);
  if (status == UVM_OK && created) settle_after_wake(device);  // a failed map gave its new memory back
  return status;
}

uvm_status vmm_free(const Call& call, uintptr_t base, Mapping* mapping) {
  if (mapping->mapped) {
    if (uvm_status s = unmap_physical(call, base, mapping, false)) return s;
  } else if (mapping->handle != 0) {  // unmapped but its release failed before: try again
    if (CUresult r = release_physical(mapping->handle, mapping->device)) {
      return fail_driver(call, r, "cuMemRelease(physical memory of %p)", reinterpret_cast<void*>(base));
    }
    mapping->handle = 0;
  }
  if (CUresult r = vmm_api().address_free(base, mapping->reserved)) {
    return fail_driver(call, r, "cuMemAddressFree(%p, %zu bytes)", reinterpret_cast<void*>(base), mapping->reserved);
  }
  mapping->reserved = 0;
  return UVM_OK;
}

uvm_status vmm_export(const Call& call, uintptr_t base, const Mapping& mapping, int* fd) {
  const VmmApi& api = vmm_api();
  MemoryCaps caps;
  if (uvm_status s = memory_caps(call, mapping.device, &caps)) return s;
  if (api.export_handle == nullptr || !caps.exportable) {
    return fail(call, UVM_ERROR_UNSUPPORTED,
                "device %d's driver cannot export VMM memory to another process (no "
                "CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR support); the allocation at %p stays this process's",
                mapping.device, reinterpret_cast<void*>(base));
  }
  if (CUresult r = api.export_handle(fd, mapping.handle, CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR, 0)) {
    return fail_driver(call, r, "cuMemExportToShareableHandle(physical memory of %p, POSIX fd)",
                       reinterpret_cast<void*>(base));
  }
  return UVM_OK;
}

uvm_status vmm_import(const Call& call, int fd, size_t size, int device, uintptr_t* base,
                      unsigned long long* handle) {
  const VmmApi& api = vmm_api();
  if (!api.available || api.import_handle == nullptr) {
    return fail(call, UVM_ERROR_UNSUPPORTED,
                "the driver lacks cuMemImportFromShareableHandle or the virtual memory management calls");
  }
  CUmemGenericAllocationHandle imported = 0;
  if (CUresult r = api.import_handle(&imported, reinterpret_cast<void*>(static_cast<uintptr_t>(fd)),
                                     CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR)) {
    return fail_driver(call, r, "cuMemImportFromShareableHandle(fd %d, %zu bytes)", fd, size);
  }
  CUdeviceptr reserved = 0;
  if (CUresult r = api.address_reserve(&reserved, size, 0, 0, 0)) {
    api.release(imported);
    return fail_driver(call, r, "cuMemAddressReserve(%zu bytes, for memory of another process)", size);
  }
  if (CUresult r = api.map(reserved, size, 0, imported, 0)) {
    api.address_free(reserved, size);
    api.release(imported);
    return fail_driver(call, r, "cuMemMap(%p, %zu bytes of another process's memory)", reinterpret_cast<void*>(reserved),
                       size);
  }
  CUmemAccessDesc access{};
  access.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
  access.location.id = device;
  access.flags = CU_MEM_ACCESS_FLAGS_PROT_READWRITE;
  if (CUresult r = api.set_access(reserved, size, &access, 1)) {
    api.unmap(reserved, size);
    api.address_free(reserved, size);
    api.release(imported);
    return fail_driver(call, r, "cuMemSetAccess(%p, %zu bytes of another process's memory, device %d)",
                       reinterpret_cast<void*>(reserved), size, device);
  }
  *base = reserved;
  *handle = imported;
  return UVM_OK;
}

uvm_status vmm_close_import(const Call& call, uintptr_t base, size_t size, unsigned long long handle) {
  const VmmApi& api = vmm_api();
  if (CUresult r = api.unmap(base, size)) {
    return fail_driver(call, r, "cuMemUnmap(%p, %zu bytes of another process's memory)", reinterpret_cast<void*>(base),
                       size);
  }
  if (CUresult r = api.release(handle)) {
    return fail_driver(call, r, "cuMemRelease(imported memory at %p)", reinterpret_cast<void*>(base));
  }
  if (CUresult r = api.address_free(base, size)) {
    return fail_driver(call, r, "cuMemAddressFree(%p, %zu bytes)", reinterpret_cast<void*>(base), size);
  }
  return UVM_OK;
}

uvm_status vmm_set_spare_limit(const Call& call, int device, size_t bytes) {
  SparePool& pool = spare_pool();
  std::lock_guard<std::mutex> lock(pool.mutex);
  pool.limit[device] = bytes;
  return trim_spares(call, pool, device, bytes);
}

size_t vmm_spare_limit(int device) {
  SparePool& pool = spare_pool();
  std::lock_guard<std::mutex> lock(pool.mutex);
  return pool.limit[device];
}

size_t vmm_spare_bytes(int device) {
  SparePool& pool = spare_pool();
  std::lock_guard<std::mutex> lock(pool.mutex);
  return pool.held[device];
}

bool vmm_touch_driver(int device) noexcept {
  try {
    const VmmApi& api = vmm_api();
    if (!api.available) return false;
    const Call call = Call::of("uvm's settling thread");
    ContextScope scope;
    if (scope.enter(call, device, ContextScope::When::always) != UVM_OK) return false;
    CUmemAllocationProp prop;
    if (device_memory(call, device, &prop) != UVM_OK) return false;
    size_t granularity = 0;
    if (api.get_granularity(&granularity, &prop, CU_MEM_ALLOC_GRANULARITY_MINIMUM) != CUDA_SUCCESS) return false;
    CUmemGenericAllocationHandle handle = 0;
    if (api.create(&handle, granularity, &prop, 0) != CUDA_SUCCESS) return false;
    return api.release(handle) == CUDA_SUCCESS;
  } catch (...) {
    return false;
  }
}

}  // namespace uvm

extern "C" uvm_status uvm_set_spare_limit(int device, size_t bytes) {
  const uvm::Call call = uvm::Call::of("uvm_set_spare_limit").with_device(device);
  return uvm::guarded(call, [&] {
    if (uvm_status s = uvm::check_device(call, device, false)) return s;
    return uvm::vmm_set_spare_limit(call, device, bytes);
  });
}

extern "C" uvm_status uvm_get_spare_limit(int device, size_t* bytes) {
  const uvm::Call call = uvm::Call::of("uvm_get_spare_limit").with_device(device);
  return uvm::guarded(call, [&] {
    if (bytes == nullptr) return uvm::fail(call, UVM_ERROR_INVALID_ARGUMENT, "bytes is NULL");
    if (uvm_status s = uvm::check_device(call, device, false)) return s;
    *bytes = uvm::vmm_spare_limit(device);
    return UVM_OK;
  });
}
