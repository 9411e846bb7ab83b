// Copies from pinned staging memory into device memory with the GPU's SMs instead of a copy
// engine. bench/transfer_probe.cu on an H100: right after a bulk free, copy-engine host→device
// copies run at half speed (26.8–27.3 GB/s) while a kernel reading the pinned memory keeps
// 49–51 GB/s; steady, the copy engine is faster (53–55 against 50 GB/s). The RL benchmark's wake
// after a 70 GB free (releasable memory) copied at 19–27 GB/s with the copy engine.
//
// The kernel is PTX in this file, loaded through the driver (cuModuleLoadData) once per device,
// since libuvm.so is built without nvcc.
#pragma once

#include <cuda_runtime_api.h>

#include <cstddef>

#include "../alloc/errors.hpp"

namespace uvm {

// How an onload copies staged bytes back into releasable memory. env UVM_ONLOAD_COPY=sm (the
// default: the kernel), engine (cudaMemcpyAsync), or mixed (the kernel on every other worker stream,
// the engine on the rest). Managed memory is always copied by the engine. The RL benchmark on an
// H100 (bench/results-rl-h100-sm-copy.json): after the training step's 70 GB free the wake copies at
// 43.7–44.5 GB/s with sm, 24.3–27.2 with engine, 37.1 mixed; on a full GPU with no such free,
// 41.2–42.4 against 44.6–45.7 — the steady cycle 0.23 s against 0.28–0.31 s, and 0.18 against
// 0.17–0.20 s.
enum class OnloadCopy { engine, sm, mixed };

// How an onload on `device` copies, as env UVM_ONLOAD_COPY asks (read once). Any other value than
// engine, sm or mixed fails the onload, naming it: a misspelt setting must not pass silently for the
// default. With the variable unset, a device the kernel cannot serve (older than sm_70, no module
// calls in the driver, no host-pointer access to registered memory) gets the engine; asked for
// explicitly there, the kernel fails the onload, saying why.
uvm_status onload_copy_for(const Call& call, int device, OnloadCopy* out);
// Parses a value of UVM_ONLOAD_COPY (null or empty: sm); false for an unknown one.
bool onload_copy_from(const char* env_value, OnloadCopy* out);
// How the chunks of worker `worker` (0-based) are copied under `setting`: engine or sm.
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
