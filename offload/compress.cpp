#include "compress.hpp"

#include <algorithm>
#include <cstdio>
#include <functional>
#include <vector>

#include "../alloc/driver_api.hpp"
#include "../alloc/events.hpp"

#include "kernels.hpp"

namespace uvm {
namespace {

#include "codec_ptx.inc"

constexpr unsigned kCodecThreads = 256;  // the kernels' block (codec_kernels.cu's kThreads)

// What an operation borrows for its duration: device memory for the flags and two batches (one is
// coded while the other is copied), and a stream for the copies. Given back once both streams have
// passed the work that used them.
class Scratch {
 public:
  Scratch() = default;
  Scratch(const Scratch&) = delete;
  Scratch& operator=(const Scratch&) = delete;
  ~Scratch() {
    if (stream_ != nullptr) clear_cuda_error(cudaStreamSynchronize(stream_));
    if (copies_ != nullptr) {
      clear_cuda_error(cudaStreamSynchronize(copies_));
      clear_cuda_error(cudaStreamDestroy(copies_));
    }
    clear_cuda_error(cudaFree(flags_));
    for (uint8_t* batch : batches_) clear_cuda_error(cudaFree(batch));
  }
  // The flags of `chunks` chunks; with `batches`, the two scratch batches and the copy stream too.
  uvm_status allocate(const Call& call, int device, size_t chunks, cudaStream_t stream, bool batches = true) {
    stream_ = stream;
    if (cudaError_t e = cudaMalloc(reinterpret_cast<void**>(&flags_), chunks)) {
      return fail_cuda(call, e, "cudaMalloc(%zu bytes of chunk flags for compression, device %d)", chunks, device);
    }
    if (!batches) return UVM_OK;
    const size_t batch = kCodecBatchChunks * codec::kChunkBytes;
    for (uint8_t*& buffer : batches_) {
      if (cudaError_t e = cudaMalloc(reinterpret_cast<void**>(&buffer), batch)) {
        return fail_cuda(call, e, "cudaMalloc(%zu bytes of compression scratch, device %d)", batch, device);
      }
    }
    if (cudaError_t e = cudaStreamCreateWithFlags(&copies_, cudaStreamNonBlocking)) {
      copies_ = nullptr;
      return fail_cuda(call, e, "cudaStreamCreateWithFlags(the compression's copy stream, device %d)", device);
    }
    return UVM_OK;
  }
  uint8_t* flags() const { return flags_; }
  uint8_t* batch(size_t index) const { return batches_[index % 2]; }
  cudaStream_t copies() const { return copies_; }

 private:
  uint8_t* flags_ = nullptr;
  uint8_t* batches_[2] = {nullptr, nullptr};
  cudaStream_t stream_ = nullptr;
  cudaStream_t copies_ = nullptr;
};

// Batch b's stage one writes scratch batch b % 2 on `one`, its stage two reads it on `two`: batch
// b + 1's stage one runs beside batch b's stage two, and batch b + 2's waits for it. Each stage
// gets its batch's chunks [first, end) and the scratch batch.
using Stage = std::function<uvm_status(size_t first, size_t end, uint8_t* batch)>;
uvm_status run_batches(const Call& call, size_t chunks, const Scratch& scratch, cudaStream_t one, const Stage& first_stage,
                       cudaStream_t two, const Stage& second_stage) {
  EventRef read[2];  // where the last stage two reading each scratch batch ends
  for (size_t first = 0, b = 0; first < chunks; first += kCodecBatchChunks, ++b) {
    const size_t end = std::min(first + kCodecBatchChunks, chunks);
    if (read[b % 2]) {
      if (cudaError_t e = cudaStreamWaitEvent(one, read[b % 2]->handle, 0)) {
        return fail_cuda(call, e, "cudaStreamWaitEvent(compression scratch still being read)");
      }
    }
    if (uvm_status s = first_stage(first, end, scratch.batch(b))) return s;
    EventRef written;
    if (uvm_status s = record_event(call, one, &written)) return s;
    if (cudaError_t e = cudaStreamWaitEvent(two, written->handle, 0)) {
      return fail_cuda(call, e, "cudaStreamWaitEvent(compression scratch being written)");
    }
    if (uvm_status s = second_stage(first, end, scratch.batch(b))) return s;
    if (uvm_status s = record_event(call, two, &read[b % 2])) return s;
  }
  return UVM_OK;
}

uvm_status codec_kernel(const Call& call, int device, const char* name, CUfunction* out) {
  return load_kernel_function(call, device, kCodecPtx, name, "the compressed backups' coder", out);
}

// The stored bytes of chunks [first, end) under `flags`.
size_t stored_run(const uint8_t* flags, size_t first, size_t end) {
  size_t total = 0;
  for (size_t c = first; c < end; ++c) total += codec::stored_bytes(flags[c]);
  return total;
}

uvm_status launch_batch(const Call& call, int device, const char* name, const void* src, const uint8_t* flags,
                        size_t first, size_t count, void* dst, cudaStream_t stream) {
  CUfunction function = nullptr;
  if (uvm_status s = codec_kernel(call, device, name, &function)) return s;
  uint64_t first_chunk = first;
  void* params[] = {&src, &flags, &first_chunk, &dst};
  if (CUresult r = launch_kernel(function, static_cast<unsigned>(count), kCodecThreads, stream, params)) {
    return fail_driver(call, r, "cuLaunchKernel(%s of chunks %zu to %zu, %p to %p, device %d)", name, first,
                       first + count - 1, src, dst, device);
  }
  return UVM_OK;
}

// Each chunk's flag, chosen on the device into `device_flags` and copied into host `flags`; returns
// once they are on the host (the layout of the stored chunks depends on them).
uvm_status choose_flags(const Call& call, int device, const uint8_t* in, size_t chunks, uint8_t* device_flags,
                        uint8_t* flags, cudaStream_t stream) {
  CUfunction choose = nullptr;
  if (uvm_status s = codec_kernel(call, device, "uvm_codec_choose", &choose)) return s;
  for (size_t first = 0; first < chunks; first += kCodecBatchChunks) {
    const size_t count = std::min(kCodecBatchChunks, chunks - first);
    const void* batch_src = in + first * codec::kChunkBytes;
    uint8_t* batch_flags = device_flags + first;
    void* params[] = {&batch_src, &batch_flags};
    if (CUresult r = launch_kernel(choose, static_cast<unsigned>(count), kCodecThreads, stream, params)) {
      return fail_driver(call, r, "cuLaunchKernel(uvm_codec_choose of %zu chunks at %p, device %d)", count, batch_src,
                         device);
    }
  }
  if (cudaError_t e = cudaMemcpyAsync(flags, device_flags, chunks, cudaMemcpyDefault, stream)) {
    return fail_cuda(call, e, "cudaMemcpyAsync(%zu chunk flags to the host, device %d)", chunks, device);
  }
  if (cudaError_t e = cudaStreamSynchronize(stream)) {
    return fail_cuda(call, e, "cudaStreamSynchronize(choosing how %zu chunks at %p are coded, device %d)", chunks,
                     static_cast<const void*>(in), device);
  }
  return UVM_OK;
}

// Copies the raw tail (less than a chunk: `tail` bytes from `src` to `dst`) on `stream`, then waits for
// everything issued there; `what` names the operation, for messages.
uvm_status copy_tail_and_wait(const Call& call, int device, void* dst, const void* src, size_t tail, const char* what,
                              cudaStream_t stream) {
  if (tail > 0) {
    if (cudaError_t e = cudaMemcpyAsync(dst, src, tail, cudaMemcpyDefault, stream)) {
      return fail_cuda(call, e, "cudaMemcpyAsync(the %zu-byte tail from %p to %p, device %d)", tail, src, dst, device);
    }
  }
  if (cudaError_t e = cudaStreamSynchronize(stream)) {
    return fail_cuda(call, e, "cudaStreamSynchronize(%s, device %d)", what, device);
  }
  return UVM_OK;
}

// compress_to_host (`to_host`: through the scratch batches and their copies) and compress_on_device
// (each batch coded straight into `dst`).
uvm_status compress(const Call& call, int device, const void* src, size_t bytes, void* dst, uint8_t* flags,
                    size_t* stored, cudaStream_t stream, bool to_host) {
  const size_t chunks = codec::chunks_in(bytes);
  const auto* in = static_cast<const uint8_t*>(src);
  auto* out = static_cast<uint8_t*>(dst);
  size_t at = 0;  // where the next stored chunk goes in `dst`
  if (chunks > 0) {
    Scratch scratch;
    if (uvm_status s = scratch.allocate(call, device, chunks, stream, to_host)) return s;
    if (uvm_status s = choose_flags(call, device, in, chunks, scratch.flags(), flags, stream)) return s;
    const Stage encode = [&](size_t first, size_t end, uint8_t* batch) {
      return launch_batch(call, device, "uvm_codec_encode", in + first * codec::kChunkBytes, scratch.flags(), first,
                          end - first, batch, stream);
    };
    if (!to_host) {
      for (size_t first = 0; first < chunks; first += kCodecBatchChunks) {
        const size_t end = std::min(first + kCodecBatchChunks, chunks);
        if (uvm_status s = encode(first, end, out + at)) return s;
        at += stored_run(flags, first, end);
      }
    } else {
      // Coded on `stream`, copied out on the scratch's stream; `stream` then waits for the copies.
      const Stage copy_out = [&](size_t first, size_t end, uint8_t* batch) {
        const size_t batch_bytes = stored_run(flags, first, end);
        if (cudaError_t e = cudaMemcpyAsync(out + at, batch, batch_bytes, cudaMemcpyDefault, scratch.copies())) {
          return fail_cuda(call, e, "cudaMemcpyAsync(%zu coded bytes to the host at %p, device %d)", batch_bytes,
                           static_cast<void*>(out + at), device);
        }
        at += batch_bytes;
        return UVM_OK;
      };
      if (uvm_status s = run_batches(call, chunks, scratch, stream, encode, scratch.copies(), copy_out)) return s;
      EventRef copied;
      if (uvm_status s = record_event(call, scratch.copies(), &copied)) return s;
      if (cudaError_t e = cudaStreamWaitEvent(stream, copied->handle, 0)) {
        return fail_cuda(call, e, "cudaStreamWaitEvent(the coded bytes' copies to the host)");
      }
    }
  }
  const size_t tail = bytes - chunks * codec::kChunkBytes;
  char what[96];
  std::snprintf(what, sizeof what, "compressing %zu bytes at %p", bytes, src);
  if (uvm_status s = copy_tail_and_wait(call, device, out + at, in + chunks * codec::kChunkBytes, tail, what, stream)) {
    return s;
  }
  *stored = at + tail;
  return UVM_OK;
}

}  // namespace

uvm_status compress_to_host(const Call& call, int device, const void* src, size_t bytes, void* host, uint8_t* flags,
                            size_t* stored, cudaStream_t stream) {
  return compress(call, device, src, bytes, host, flags, stored, stream, true);
}

uvm_status compress_on_device(const Call& call, int device, const void* src, size_t bytes, void* dst, uint8_t* flags,
                              size_t* stored, cudaStream_t stream) {
  return compress(call, device, src, bytes, dst, flags, stored, stream, false);
}

uvm_status decompress_from_host(const Call& call, int device, const void* host, const uint8_t* flags, size_t bytes,
                                void* dst, cudaStream_t stream) {
  const size_t chunks = codec::chunks_in(bytes);
  const auto* in = static_cast<const uint8_t*>(host);
  auto* out = static_cast<uint8_t*>(dst);
  size_t at = 0;
  if (chunks > 0) {
    Scratch scratch;
    if (uvm_status s = scratch.allocate(call, device, chunks, stream)) return s;
    if (cudaError_t e = cudaMemcpyAsync(scratch.flags(), flags, chunks, cudaMemcpyDefault, stream)) {
      return fail_cuda(call, e, "cudaMemcpyAsync(%zu chunk flags to device %d)", chunks, device);
    }
    // Copied in on the scratch's stream (after the flags, on `stream`), decoded on `stream`.
    EventRef flags_copied;
    if (uvm_status s = record_event(call, stream, &flags_copied)) return s;
    if (cudaError_t e = cudaStreamWaitEvent(scratch.copies(), flags_copied->handle, 0)) {
      return fail_cuda(call, e, "cudaStreamWaitEvent(the chunk flags' copy to device %d)", device);
    }
    const Stage copy_in = [&](size_t first, size_t end, uint8_t* batch) {
      const size_t batch_bytes = stored_run(flags, first, end);
      if (cudaError_t e = cudaMemcpyAsync(batch, in + at, batch_bytes, cudaMemcpyDefault, scratch.copies())) {
        return fail_cuda(call, e, "cudaMemcpyAsync(%zu coded bytes from the host at %p, device %d)", batch_bytes,
                         static_cast<const void*>(in + at), device);
      }
      at += batch_bytes;
      return UVM_OK;
    };
    const Stage decode = [&](size_t first, size_t end, uint8_t* batch) {
      return launch_batch(call, device, "uvm_codec_decode", batch, scratch.flags(), first, end - first,
                          out + first * codec::kChunkBytes, stream);
    };
    if (uvm_status s = run_batches(call, chunks, scratch, scratch.copies(), copy_in, stream, decode)) return s;
  }
  char what[96];
  std::snprintf(what, sizeof what, "decompressing %zu bytes to %p", bytes, dst);
  return copy_tail_and_wait(call, device, out + chunks * codec::kChunkBytes, in + at, bytes - chunks * codec::kChunkBytes,
                            what, stream);
}

}  // namespace uvm
