// uvm.h from strict C++17: the types and values users compile against are the documented ones.
#include "uvm.h"

#include <cstdio>
#include <type_traits>

static_assert(UVM_OK == 0, "UVM_OK is 0");
static_assert(UVM_ERROR_INTERNAL == 9, "status values are stable ABI");
static_assert(UVM_LOCATION_CPU == cudaCpuDeviceId, "CPU location is cudaCpuDeviceId");
static_assert(UVM_LOCATION_NONE == cudaInvalidDeviceId, "no location is cudaInvalidDeviceId");
static_assert(std::is_same<decltype(&uvm_malloc), void* (*)(size_t, int, cudaStream_t)>::value,
              "uvm_malloc has the signature CUDAPluggableAllocator calls");
static_assert(std::is_same<decltype(&uvm_free), void (*)(void*, size_t, int, cudaStream_t)>::value,
              "uvm_free has the signature CUDAPluggableAllocator calls");
static_assert(std::is_standard_layout<uvm_stats>::value && std::is_standard_layout<uvm_range>::value,
              "C structs");

int main() {
  std::printf("uvm %s: All tests passed (C++17 ABI)\n", uvm_version());
  return uvm_status_string(UVM_OK)[0] == 'U' ? 0 : 1;
}
