// The CUDA driver functions uvm calls, resolved through the runtime (cudaGetDriverEntryPoint*) so
// that libuvm.so links only against cudart, and the one way their failures are reported.
#pragma once

#include <cuda.h>  // driver types only

#include "errors.hpp"

namespace uvm {

// The driver's `symbol` in its CUDA 12.0 form, or null if the driver lacks it. Leaves no CUDA error
// pending.
void* driver_symbol(const char* symbol);

template <typename Fn>
bool resolve_driver(const char* symbol, Fn* fn) {
  void* address = driver_symbol(symbol);
  if (address == nullptr) return false;
  *fn = reinterpret_cast<Fn>(address);
  return true;
}

// The driver error's name, e.g. "CUDA_ERROR_OUT_OF_MEMORY" ("CUresult <n>" if unknown).
const char* driver_error_name(CUresult result);

// Records a failed driver call as "<call>: <what> failed: CUDA_ERROR_…" and maps it to a status
// (out of memory, else UVM_ERROR_CUDA). The driver API leaves no runtime error pending.
uvm_status fail_driver(const Call& call, CUresult result, const char* what_format, ...)
    __attribute__((format(printf, 3, 4)));

}  // namespace uvm
