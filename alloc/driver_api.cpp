#include "driver_api.hpp"

#include <cuda_runtime_api.h>

#include <cstdarg>
#include <cstdio>

namespace uvm {

void* driver_symbol(const char* symbol) {
  void* address = nullptr;
  cudaDriverEntryPointQueryResult found = cudaDriverEntryPointSymbolNotFound;
#if CUDART_VERSION >= 12050
  const cudaError_t e = cudaGetDriverEntryPointByVersion(symbol, &address, 12000, cudaEnableDefault, &found);
#else
  const cudaError_t e = cudaGetDriverEntryPoint(symbol, &address, cudaEnableDefault, &found);
#endif
  clear_cuda_error(e);
  if (e != cudaSuccess || found != cudaDriverEntryPointSuccess) return nullptr;
  return address;
}

const char* driver_error_name(CUresult result) {
  using GetErrorName = CUresult (*)(CUresult, const char**);
  static GetErrorName get_name = [] {
    GetErrorName fn = nullptr;
    resolve_driver("cuGetErrorName", &fn);
    return fn;
  }();
  const char* name = nullptr;
  if (get_name != nullptr && get_name(result, &name) == CUDA_SUCCESS && name != nullptr) return name;
  thread_local char unknown[32];
  std::snprintf(unknown, sizeof unknown, "CUresult %d", static_cast<int>(result));
  return unknown;
}

uvm_status fail_driver(const Call& call, CUresult result, const char* what_format, ...) {
  char what[256];
  va_list args;
  va_start(args, what_format);
  std::vsnprintf(what, sizeof what, what_format, args);
  va_end(args);
  const uvm_status status = result == CUDA_ERROR_OUT_OF_MEMORY ? UVM_ERROR_OUT_OF_MEMORY : UVM_ERROR_CUDA;
  fail(call, status, "%s failed: %s", what, driver_error_name(result));
  note_cuda_error(static_cast<int>(result));
  return status;
}

}  // namespace uvm
