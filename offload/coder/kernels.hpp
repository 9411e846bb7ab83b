// uvm's own GPU kernels: PTX text built into the library (libuvm.so is compiled without nvcc),
// loaded through the driver once per device and launched there. The SM copy (sm_copy.hpp) and the
// compressed backups' coder (compress.hpp) are such kernels.
#pragma once

#include <cuda.h>
#include <cuda_runtime_api.h>

#include "../../alloc/errors.hpp"

namespace uvm {

// Whether the driver offers cuModuleLoadData, cuModuleGetFunction and cuLaunchKernel.
bool kernels_available();

// Function `name` of the module `ptx` (a string with static storage) on `device`, whose context must
// be current: loaded the first time it is asked for on that device, then remembered. Modules are
// never unloaded: they die with their context, and no CUDA call may run from a static destructor.
// `what` names the kernel in messages. A failure names the driver call and its error.
uvm_status load_kernel_function(const Call& call, int device, const char* ptx, const char* name, const char* what,
                                CUfunction* out);

// Launches `function` as `blocks` blocks of `threads` on `stream` with `params` (cuLaunchKernel's),
// and returns the driver's result: the caller names what failed (fail_driver), so that a launch
// formats no message unless it fails.
// Tests only: forgets every function and module loaded (they stay loaded in the driver), so the next
// load_kernel_function loads again and a test can make that load fail.
void forget_loaded_kernels_for_test();

CUresult launch_kernel(CUfunction function, unsigned blocks, unsigned threads, cudaStream_t stream, void** params);

}  // namespace uvm
