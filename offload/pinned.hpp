// Pinned (page-locked) host memory for staging, got the fastest way measured, with
// cudaHostAlloc as the fallback. bench/pinned_probe.cpp on an H100 (driver 580, 16 cores, 4 GiB):
//   cudaHostAlloc 2.14–2.27 s, cudaMallocHost 1.50–2.43 s, mmap + cudaHostRegister 1.30–1.79 s;
//   mmap + transparent huge pages + 8 threads faulting the pages in + cudaHostRegister 0.23–0.25 s,
//   freed in 0.09–0.10 s instead of 0.50–0.75 s. Copies run at 55 GB/s either way.
// Most of cudaHostAlloc's time is the kernel faulting 4 KiB pages in one at a time on one thread.
#pragma once

#include <cstddef>

#include "../alloc/errors.hpp"

namespace uvm {

// How staging memory is pinned. env UVM_PINNED=register (the default: mmap, huge pages, parallel
// fault-in, cudaHostRegister; cudaHostAlloc if any of that fails) or hostalloc (cudaHostAlloc only).
enum class PinnedKind { registered, host_alloc };

struct PinnedMemory {
  char* host = nullptr;
  size_t bytes = 0;
  PinnedKind kind = PinnedKind::host_alloc;
};

// `bytes` of pinned memory got the `wanted` way, portable to every device's context
// (cudaHostAllocPortable or cudaHostRegisterPortable). Fails naming cudaHostAlloc, and why
// registration did not serve.
uvm_status pin_host_memory(const Call& call, size_t bytes, PinnedKind wanted, PinnedMemory* out);

// Gives back memory from pin_host_memory (cudaHostUnregister + munmap, or cudaFreeHost).
uvm_status unpin_host_memory(const Call& call, const PinnedMemory& memory);

// The strategy env UVM_PINNED asks for, read once; a malformed value keeps the default.
PinnedKind configured_pinned_kind();
PinnedKind pinned_kind_from(const char* env_value);

}  // namespace uvm
