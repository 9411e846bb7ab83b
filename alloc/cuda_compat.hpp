// The managed-memory calls whose signatures changed across CUDA versions, behind one set of names.
//
//   CUDART_VERSION < 12020     int-device forms: cudaMemPrefetchAsync(ptr, n, device, stream),
//                              cudaMemAdvise(ptr, n, advice, device); CPU = cudaCpuDeviceId.
//   12020 <= VERSION < 13000   location forms with a _v2 suffix: cudaMemPrefetchAsync_v2(ptr, n,
//                              cudaMemLocation, flags, stream), cudaMemAdvise_v2(ptr, n, advice, loc).
//   VERSION >= 13000           location forms under the plain names; cudaMemDiscardBatchAsync.
#pragma once

#include <cuda_runtime_api.h>

#include <cstddef>

#include "uvm.h"

namespace uvm {

#if CUDART_VERSION >= 12020
inline cudaMemLocation location_of(int device) {
  cudaMemLocation location{};
  if (device == UVM_LOCATION_CPU) {
    location.type = cudaMemLocationTypeHost;
    location.id = 0;
  } else {
    location.type = cudaMemLocationTypeDevice;
    location.id = device;
  }
  return location;
}
#endif

inline cudaError_t prefetch_to(const void* ptr, size_t size, int device, cudaStream_t stream) {
#if CUDART_VERSION >= 13000
  return cudaMemPrefetchAsync(ptr, size, location_of(device), 0, stream);
#elif CUDART_VERSION >= 12020
  return cudaMemPrefetchAsync_v2(ptr, size, location_of(device), 0, stream);
#else
  return cudaMemPrefetchAsync(ptr, size, device, stream);
#endif
}

inline cudaError_t advise(const void* ptr, size_t size, cudaMemoryAdvise advice, int device) {
#if CUDART_VERSION >= 13000
  return cudaMemAdvise(ptr, size, advice, location_of(device));
#elif CUDART_VERSION >= 12020
  return cudaMemAdvise_v2(ptr, size, advice, location_of(device));
#else
  return cudaMemAdvise(ptr, size, advice, device);
#endif
}

}  // namespace uvm
