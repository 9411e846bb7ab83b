// Helpers for the GPU suite. Every test keeps its managed memory within managed_budget(): 25% of
// the card, so no test can oversubscribe a shared GPU.
#pragma once

#include <cuda_runtime_api.h>

#include <cstddef>
#include <string>

#include "uvm_test.hpp"

namespace gpu {

constexpr size_t MiB = size_t{1} << 20;
constexpr size_t GiB = size_t{1} << 30;

inline size_t total_memory() {
  uvm_device_caps caps{};
  return uvm_device_capabilities(0, &caps) == UVM_OK ? caps.total_memory : 0;
}

inline size_t managed_budget() { return total_memory() / 4; }

inline bool concurrent_managed_access() {
  uvm_device_caps caps{};
  return uvm_device_capabilities(0, &caps) == UVM_OK && caps.concurrent_managed_access;
}

// A uvm allocation on GPU 0 that the test owns; refuses sizes past the managed budget.
struct Managed {
  explicit Managed(size_t bytes) : size(bytes) {
    REQUIRE(bytes <= managed_budget());
    ptr = static_cast<unsigned char*>(uvm_malloc(bytes, 0, nullptr));
    INFO(uvm_last_error());
    REQUIRE(ptr != nullptr);
  }
  ~Managed() { uvm_free(ptr, size, 0, nullptr); }
  Managed(const Managed&) = delete;
  Managed& operator=(const Managed&) = delete;
  unsigned char* ptr;
  size_t size;
};

inline int last_prefetch_location(const void* ptr, size_t size) {
  int location = -99;
  REQUIRE(cudaMemRangeGetAttribute(&location, sizeof location,
                                   cudaMemRangeAttributeLastPrefetchLocation, ptr, size) == cudaSuccess);
  return location;
}

// A driver API function, resolved through the runtime as uvm does (the suite links only cudart).
inline void* driver_entry_point(const char* symbol) {
  void* fn = nullptr;
  cudaDriverEntryPointQueryResult found{};
#if CUDART_VERSION >= 12050
  const cudaError_t e = cudaGetDriverEntryPointByVersion(symbol, &fn, 12000, cudaEnableDefault, &found);
#else  // the by-version form first appears in CUDA 12.5
  const cudaError_t e = cudaGetDriverEntryPoint(symbol, &fn, cudaEnableDefault, &found);
#endif
  INFO(symbol << " -> " << cudaGetErrorName(e));
  REQUIRE(e == cudaSuccess);
  REQUIRE(found == cudaDriverEntryPointSuccess);
  REQUIRE(fn != nullptr);
  return fn;
}

}  // namespace gpu

#define CUDA_REQUIRE(call)                                         \
  do {                                                             \
    const cudaError_t cuda_require_error = (call);                 \
    INFO(#call << " -> " << cudaGetErrorName(cuda_require_error)); \
    REQUIRE(cuda_require_error == cudaSuccess);                    \
  } while (0)
