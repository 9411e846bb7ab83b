// Compressed backups' device side: the format of codec.hpp written and read on the GPU by uvm's
// kernels (codec_kernels.cu), so that fewer bytes cross the link and less host memory holds them.
//
// Compressing `bytes` of device memory runs in three steps on one stream: a kernel picks each
// chunk's flag (its exponent window, or raw); the flags come to the host, which lays the chunks out;
// then, a batch of chunks at a time, a kernel codes the batch into device scratch memory and a copy
// takes the coded bytes to the host. Decompressing runs the other way. The raw tail (less than a
// chunk) is copied as it is.
#pragma once

#include <cuda_runtime_api.h>

#include <cstddef>
#include <cstdint>

#include "../alloc/errors.hpp"
#include "codec.hpp"

namespace uvm {

// Raw chunks one batch takes: 32 MiB, coded into scratch memory of that size at most.
constexpr size_t kCodecBatchChunks = 512;

// Compresses the `bytes` of device memory at `src` (on `device`, whose context is current) into host
// memory `host` (room for `bytes`; pinned for the copies to run at the link's speed), writing each
// chunk's flag into host memory `flags` (codec::chunks_in(bytes) of them) and the compressed size into
// `*stored`. Work is issued on `stream`, which has reached its end when this returns. The
// bytes at `src` are only read. A failure names the step and the CUDA error; what was written to
// `host` by then is not a backup of anything.
uvm_status compress_to_host(const Call& call, int device, const void* src, size_t bytes, void* host, uint8_t* flags,
                            size_t* stored, cudaStream_t stream);

// The same format written into device memory `dst` (room for `bytes`) instead of the host: the coder
// alone, with no copy (what the benchmark times against other coders; `flags` is host memory).
uvm_status compress_on_device(const Call& call, int device, const void* src, size_t bytes, void* dst, uint8_t* flags,
                              size_t* stored, cudaStream_t stream);

// Reverses compress_to_host: the `bytes` raw bytes that `host` and `flags` hold, written into device
// memory `dst` on `device`. `host` and `flags` are only read: after a failure they still hold the
// backup, and `dst` holds part of it at most.
uvm_status decompress_from_host(const Call& call, int device, const void* host, const uint8_t* flags, size_t bytes,
                                void* dst, cudaStream_t stream);

}  // namespace uvm
