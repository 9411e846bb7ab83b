#include "vmm.hpp"

#include "driver_api.hpp"

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
    return a;
  }();
  return *api;
}

CUmemAllocationProp device_memory(int device) {
  CUmemAllocationProp prop{};
  prop.type = CU_MEM_ALLOCATION_TYPE_PINNED;
  prop.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
  prop.location.id = device;
  return prop;
}

// Creates physical memory on `device` for `m` and maps it at `base`, read-write for that device; on
// failure nothing stays created or mapped.
uvm_status map_physical(const Call& call, uintptr_t base, int device, Mapping* m) {
  const VmmApi& api = vmm_api();
  const CUmemAllocationProp prop = device_memory(device);
  CUmemGenericAllocationHandle handle = 0;
  if (CUresult r = api.create(&handle, m->reserved, &prop, 0)) {
    return fail_driver(call, r, "cuMemCreate(%zu bytes on device %d)", m->reserved, device);
  }
  if (CUresult r = api.map(base, m->reserved, 0, handle, 0)) {
    api.release(handle);
    return fail_driver(call, r, "cuMemMap(%p, %zu bytes)", reinterpret_cast<void*>(base), m->reserved);
  }
  CUmemAccessDesc access{};
  access.location = prop.location;
  access.flags = CU_MEM_ACCESS_FLAGS_PROT_READWRITE;
  if (CUresult r = api.set_access(base, m->reserved, &access, 1)) {
    api.unmap(base, m->reserved);
    api.release(handle);
    return fail_driver(call, r, "cuMemSetAccess(%p, %zu bytes, device %d)", reinterpret_cast<void*>(base),
                       m->reserved, device);
  }
  m->handle = handle;
  m->mapped = true;
  return UVM_OK;
}

uvm_status unmap_physical(const Call& call, uintptr_t base, Mapping* m) {
  const VmmApi& api = vmm_api();
  if (CUresult r = api.unmap(base, m->reserved)) {
    return fail_driver(call, r, "cuMemUnmap(%p, %zu bytes)", reinterpret_cast<void*>(base), m->reserved);
  }
  m->mapped = false;
  if (CUresult r = api.release(m->handle)) {
    return fail_driver(call, r, "cuMemRelease(physical memory of %p)", reinterpret_cast<void*>(base));
  }
  m->handle = 0;
  return UVM_OK;
}

}  // namespace

uvm_status vmm_allocate(const Call& call, size_t size, int device, void** out, Mapping* mapping) {
  const VmmApi& api = vmm_api();
  if (!api.available) {
    return fail(call, UVM_ERROR_UNSUPPORTED,
                "the driver lacks the virtual memory management calls (cuMemCreate, cuMemMap) that "
                "releasable allocations need; use uvm_malloc (managed memory)");
  }
  const CUmemAllocationProp prop = device_memory(device);
  size_t granularity = 0;
  if (CUresult r = api.get_granularity(&granularity, &prop, CU_MEM_ALLOC_GRANULARITY_MINIMUM)) {
    return fail_driver(call, r, "cuMemGetAllocationGranularity(device %d)", device);
  }
  Mapping m;
  m.reserved = (size + granularity - 1) / granularity * granularity;
  CUdeviceptr base = 0;
  if (CUresult r = api.address_reserve(&base, m.reserved, granularity, 0, 0)) {
    return fail_driver(call, r, "cuMemAddressReserve(%zu bytes)", m.reserved);
  }
  if (uvm_status s = map_physical(call, base, device, &m)) {
    api.address_free(base, m.reserved);
    return s;
  }
  *mapping = m;
  *out = reinterpret_cast<void*>(base);
  return UVM_OK;
}

uvm_status vmm_unmap(const Call& call, uintptr_t base, Mapping* mapping) {
  return mapping->mapped ? unmap_physical(call, base, mapping) : UVM_OK;
}

uvm_status vmm_map(const Call& call, uintptr_t base, int device, Mapping* mapping) {
  return mapping->mapped ? UVM_OK : map_physical(call, base, device, mapping);
}

uvm_status vmm_free(const Call& call, uintptr_t base, Mapping* mapping) {
  if (mapping->mapped) {
    if (uvm_status s = unmap_physical(call, base, mapping)) return s;
  } else if (mapping->handle != 0) {  // unmapped but its release failed before: try again
    if (CUresult r = vmm_api().release(mapping->handle)) {
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

}  // namespace uvm
