// Copies from pinned staging memory into device memory with the GPU's SMs instead of a copy
// engine. Right after a bulk free, copy-engine host→device copies run at half speed while a
// kernel reading the pinned memory keeps its speed; steady, the copy engine is faster
// (bench/probes/transfer_probe.cu; docs/performance.md, "The driver behaviour behind the design").
//
// The kernel is PTX in this file, loaded through the driver (cuModuleLoadData) once per device,
// since libuvm.so is built without nvcc.
#pragma once

#include <cuda_runtime_api.h>

#include <cstddef>

#include "../../alloc/errors.hpp"
#include "../../alloc/options.hpp"

namespace uvm {

// How an onload copies staged bytes back into releasable memory (OnloadCopy): UVM_ONLOAD_COPY=auto (the
// default), sm (the kernel), engine (cudaMemcpyAsync), or mixed (the kernel on every other worker
// stream, the engine on the rest). Managed memory is always copied by the engine.
// auto takes the kernel when the device has more than kAutoKernelFreeFactor times the onload's
// staged bytes free, else the engine. In the RL benchmark right after the training step's giant
// free, the engine ran at half speed and the kernel near the link's; on a full GPU the kernel
// idled while a map waited for the driver, where the engine's queue ran on. auto picks the
// kernel in the first and the engine in the second, and beat either alone in both
// (bench/results/rl/h100-sm-vs-auto-*.json; docs/measurements.md, "The RL sleep/wake cycle").
constexpr size_t kAutoKernelFreeFactor = 4;

// How an onload on `device` copies `staged_bytes` of releasable memory back, as UVM_ONLOAD_COPY
// asks, auto resolved to engine or sm; fails if an option is not understood. With no such bytes (an
// onload of managed memory only) auto asks the device nothing. auto takes the engine on a
// device the kernel cannot serve (older than sm_70, no module calls in the driver, no host-pointer
// access to registered memory) or when cudaMemGetInfo fails (its error cleared); asked for
// explicitly there, the kernel fails the onload, saying why.
uvm_status onload_copy_for(const Call& call, int device, size_t staged_bytes, OnloadCopy* out);
// What auto chooses with `free_bytes` free on the device for `staged_bytes` to copy back.
OnloadCopy auto_copy(size_t free_bytes, size_t staged_bytes);
// How the chunks of worker `worker` (0-based) are copied under `setting` (resolved: not automatic):
// engine or sm.
OnloadCopy copy_for_worker(OnloadCopy setting, int worker);

// Whether the kernel can copy these bytes: both ends 16-byte aligned and whole 16-byte words.
// Other copies (and the pageable staging of UVM_PINNED=pageable, which no kernel can read) go to
// the copy engine.
bool sm_copyable(const void* dst, const void* host, size_t bytes);

// Launches the copy of `bytes` from pinned `host` to device memory `dst` on `stream`, in the current
// context, which must be device `device`'s. The kernel is loaded the first time a device needs it;
// a failure names the driver call and its error, and the caller's copy is not issued.
uvm_status sm_copy(const Call& call, int device, void* dst, const void* host, size_t bytes, cudaStream_t stream);

}  // namespace uvm
