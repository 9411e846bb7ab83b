#include "compress.hpp"

#include <algorithm>
#include <cstdio>
#include <cstring>
#include <functional>
#include <memory>
#include <mutex>
#include <set>
#include <string>
#include <vector>

#include "../../alloc/driver_api.hpp"
#include "../../alloc/events.hpp"
#include "../../hints/moves/trace.hpp"

#include "kernels.hpp"

namespace uvm {
namespace {

#include "codec_ptx.inc"

constexpr unsigned kCodecThreads = 256;  // the kernels' block (codec_kernels.cu's kThreads)
constexpr const char* kCoderKernels[] = {"uvm_codec_choose", "uvm_codec_encode", "uvm_codec_decode"};
constexpr size_t kChunk = codec::kChunkBytes;

// A batch of chunks [first, end) of job `job`.
struct Batch {
  size_t job;
  size_t first;
  size_t end;
  size_t stored_at = 0;  // a decode's: where chunk `first` is stored in its job's host copy
};

// Cuts chunks [first, end) of job `job` into batches of at most kCodecBatchChunks, onto `batches`.
void add_batches(size_t job, size_t first, size_t end, std::vector<Batch>* batches) {
  for (size_t at = first; at < end; at += kCodecBatchChunks) batches->push_back(Batch{job, at, std::min(at + kCodecBatchChunks, end)});
}

// Batch b's stage one writes a scratch batch on `one`, its stage two reads it on `two`: batch b + 1's
// stage one runs beside batch b's stage two, and batch b + 2's waits for it (scratch.take_batch,
// over calls too: a call may begin while the last one's copies still read). Each stage gets its
// batch and the scratch batch.
using Stage = std::function<uvm_status(const Batch& batch, uint8_t* scratch_batch)>;
uvm_status run_batches(const Call& call, const std::vector<Batch>& batches, CodecScratch& scratch, cudaStream_t one,
                       const Stage& first_stage, cudaStream_t two, const Stage& second_stage) {
  for (const Batch& batch : batches) {
    EventRef* read = nullptr;  // where the last stage two reading the scratch batch ends
    uint8_t* scratch_batch = scratch.take_batch(&read);
    if (*read) {
      if (cudaError_t e = cudaStreamWaitEvent(one, (*read)->handle, 0)) {
        return fail_cuda(call, e, "cudaStreamWaitEvent(compression scratch still being read)");
      }
    }
    if (uvm_status s = first_stage(batch, scratch_batch)) return s;
    EventRef written;
    if (uvm_status s = record_event(call, one, &written)) return s;
    if (cudaError_t e = cudaStreamWaitEvent(two, written->handle, 0)) {
      return fail_cuda(call, e, "cudaStreamWaitEvent(compression scratch being written)");
    }
    if (uvm_status s = second_stage(batch, scratch_batch)) return s;
    if (uvm_status s = record_event(call, two, read)) return s;
  }
  return UVM_OK;
}

// `waiter` waits for everything issued on `stream` so far.
uvm_status wait_for_stream(const Call& call, cudaStream_t waiter, cudaStream_t stream, const char* what) {
  EventRef reached;
  if (uvm_status s = record_event(call, stream, &reached)) return s;
  if (cudaError_t e = cudaStreamWaitEvent(waiter, reached->handle, 0)) return fail_cuda(call, e, "cudaStreamWaitEvent(%s)", what);
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

// The kernels load and store 16 bytes a thread: a misaligned access would lose the context (and
// every byte on the device), so a pointer off 16 bytes is refused before any launch. The moves
// never pass one (coded.cpp copies a piece's unaligned head apart); this is the last guard.
uvm_status check_aligned(const Call& call, int device, const char* name, const void* src, const void* dst) {
  for (const void* ptr : {src, dst}) {
    if (reinterpret_cast<uintptr_t>(ptr) % 16 != 0) {
      return fail(call, UVM_ERROR_INTERNAL, "%s would access %p, which is not 16-byte aligned (device %d): not launched",
                  name, ptr, device);
    }
  }
  return UVM_OK;
}

uvm_status launch_batch(const Call& call, int device, const char* name, const void* src, const uint8_t* flags,
                        size_t first, size_t count, void* dst, cudaStream_t stream) {
  if (uvm_status s = check_aligned(call, device, name, src, dst)) return s;
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

// Copies `bytes` between device memory `on_device` and the host copy's bytes from offset `at`, one
// copy per part they reach. `what` names the bytes in messages.
uvm_status copy_parts(const Call& call, int device, const HostParts& host, size_t at, void* on_device, size_t bytes,
                      bool to_host, const char* what, cudaStream_t stream) {
  auto* device_bytes = static_cast<char*>(on_device);
  size_t part_begin = 0;
  for (const HostPart& part : host) {
    const size_t part_end = part_begin + part.bytes;
    if (bytes > 0 && at < part_end) {
      const size_t n = std::min(bytes, part_end - at);
      char* host_bytes = part.host + (at - part_begin);
      const cudaError_t e = to_host ? cudaMemcpyAsync(host_bytes, device_bytes, n, cudaMemcpyDefault, stream)
                                    : cudaMemcpyAsync(device_bytes, host_bytes, n, cudaMemcpyDefault, stream);
      if (e != cudaSuccess) {
        return fail_cuda(call, e, "cudaMemcpyAsync(%zu %s %s the host at %p, device %d)", n, what,
                         to_host ? "to" : "from", static_cast<void*>(host_bytes), device);
      }
      device_bytes += n;
      at += n;
      bytes -= n;
    }
    part_begin = part_end;
  }
  if (bytes > 0) {
    return fail(call, UVM_ERROR_INVALID_ARGUMENT, "%zu %s lie past the end of the host copy (%zu bytes)", bytes, what,
                part_begin);
  }
  return UVM_OK;
}

// Every job's flags, one after the other in the scratch's device flags (`*base`: where each job's
// start), each job's `flags` from its host copy, in one copy (a copy from pageable memory waits for
// the stream: one per job made a pause of 64 tensors wait 64 times).
template <typename Job>
uvm_status upload_flags(const Call& call, int device, CodecScratch& scratch, const std::vector<Job>& jobs,
                        std::vector<size_t>* base, cudaStream_t stream) {
  size_t total = 0;
  for (const Job& job : jobs) {
    base->push_back(total);
    total += codec::chunks_in(job.bytes);
  }
  if (total == 0) return UVM_OK;
  if (uvm_status s = scratch.prepare(call, device, total, stream)) return s;
  std::vector<uint8_t> all(total);
  for (size_t j = 0; j < jobs.size(); ++j) std::copy_n(jobs[j].flags, codec::chunks_in(jobs[j].bytes), &all[(*base)[j]]);
  if (cudaError_t e = cudaMemcpyAsync(scratch.flags(), all.data(), total, cudaMemcpyDefault, stream)) {
    return fail_cuda(call, e, "cudaMemcpyAsync(%zu chunk flags to device %d)", total, device);
  }
  return UVM_OK;
}

uvm_status wait_until_done(const Call& call, int device, const char* what, size_t bytes, const void* at,
                           cudaStream_t stream) {
  if (cudaError_t e = cudaStreamSynchronize(stream)) {
    return fail_cuda(call, e, "cudaStreamSynchronize(%s %zu bytes at %p, device %d)", what, bytes, at, device);
  }
  return UVM_OK;
}

// Reads `bytes` of a host copy's stored bytes from offset `at` into `out` (the parts are host memory).
void read_parts(const HostParts& host, size_t at, uint8_t* out, size_t bytes) {
  size_t part_begin = 0;
  for (const HostPart& part : host) {
    const size_t part_end = part_begin + part.bytes;
    if (bytes > 0 && at < part_end) {
      const size_t n = std::min(bytes, part_end - at);
      std::memcpy(out, part.host + (at - part_begin), n);
      out += n;
      at += n;
      bytes -= n;
    }
    part_begin = part_end;
  }
}

// decode_from_host where the device has no room for the coder's scratch: the reference coder
// decodes on the CPU, a batch of chunks at a time, into host memory copied to the device. Slower
// than the kernels, but a resume that plain copies could do never fails because of compression.
uvm_status decode_on_host(const Call& call, int device, const std::vector<DecodeJob>& jobs, cudaStream_t stream,
                          const std::function<uvm_status(size_t job)>& make_ready) {
  constexpr size_t kHostBatchChunks = 256;  // 16 MiB of raw bytes at a time
  std::vector<uint8_t> raw(kHostBatchChunks * kChunk), stored(kChunk);
  size_t bytes = 0;
  for (size_t j = 0; j < jobs.size(); ++j) {
    const DecodeJob& job = jobs[j];
    if (make_ready) {
      if (uvm_status s = make_ready(j)) return s;
    }
    const size_t chunks = codec::chunks_in(job.bytes);
    const size_t first = std::min(job.from / kChunk, chunks), end = std::min((job.to + kChunk - 1) / kChunk, chunks);
    size_t at = stored_run(job.flags, 0, first);
    for (size_t batch = first; batch < end; batch += kHostBatchChunks) {
      const size_t batch_end = std::min(batch + kHostBatchChunks, end);
      for (size_t c = batch; c < batch_end; ++c) {
        const size_t n = codec::stored_bytes(job.flags[c]);
        uint8_t* out = raw.data() + (c - batch) * kChunk;
        if (job.flags[c] == codec::kRaw) {
          read_parts(job.host, at, out, n);
        } else {
          read_parts(job.host, at, stored.data(), n);
          codec::decode(stored.data(), job.flags[c], reinterpret_cast<uint16_t*>(out));
        }
        at += n;
      }
      // Only the bytes inside [from, to) go to the device.
      const size_t begin = std::max(job.from, batch * kChunk), stop = std::min(job.to, batch_end * kChunk);
      void* to = static_cast<uint8_t*>(job.dst) + (begin - job.from);
      if (cudaError_t e = cudaMemcpyAsync(to, raw.data() + (begin - batch * kChunk), stop - begin, cudaMemcpyDefault,
                                          stream)) {
        return fail_cuda(call, e, "cudaMemcpyAsync(%zu bytes decoded on the host to %p, device %d)", stop - begin, to,
                         device);
      }
      if (uvm_status s = wait_until_done(call, device, "decoding on the host", stop - begin, to, stream)) return s;
    }
    const size_t tail_begin = std::max(job.from, chunks * kChunk);
    if (tail_begin < job.to) {
      void* to = static_cast<uint8_t*>(job.dst) + (tail_begin - job.from);
      const size_t tail_at = stored_run(job.flags, 0, chunks) + (tail_begin - chunks * kChunk);
      if (uvm_status s = copy_parts(call, device, job.host, tail_at, to, job.to - tail_begin, false,
                                    "bytes of the raw tail", stream)) {
        return s;
      }
    }
    bytes += job.to - job.from;
  }
  return wait_until_done(call, device, "decoding on the host", bytes, jobs.empty() ? nullptr : jobs.front().dst, stream);
}

// Whether the CPU decodes a resume's chunks on `device`: the first time, said on stderr.
void say_decoding_on_host(int device, const std::string& why) {
  static auto* told = new std::set<int>();  // never destroyed: no code runs from static destructors
  say_once_per_device(told, device, "uvm: compressed copies on device " + std::to_string(device) +
                                        " are decoded on the CPU: no room for the coder's scratch (" + why + ")");
}

}  // namespace

void say_once_per_device(std::set<int>* told, int device, const std::string& what) {
  static auto* mutex = new std::mutex();  // never destroyed: no code runs from static destructors
  std::lock_guard<std::mutex> lock(*mutex);
  if (told->insert(device).second) std::fprintf(stderr, "%s\n", what.c_str());
}

CodecScratch::~CodecScratch() {
  if (stream_ != nullptr) clear_cuda_error(cudaStreamSynchronize(stream_));
  for (cudaStream_t own : {copies_, chooser_}) {
    if (own == nullptr) continue;
    clear_cuda_error(cudaStreamSynchronize(own));
    clear_cuda_error(cudaStreamDestroy(own));
  }
  clear_cuda_error(cudaFree(flags_));
  clear_cuda_error(cudaFree(chosen_));
  clear_cuda_error(cudaFreeHost(chosen_on_host_));
  for (uint8_t* batch : batches_) clear_cuda_error(cudaFree(batch));
  clear_cuda_error(cudaFree(edge_));
}

namespace {

// Device flags `*flags` for at least `chunks` chunks (`*capacity` of them now), grown when they are
// fewer. Every operation waits for its work on them before it returns: nothing uses the smaller ones.
uvm_status grow_flags(const Call& call, int device, size_t chunks, const char* what, uint8_t** flags, size_t* capacity) {
  if (chunks <= *capacity) return UVM_OK;
  clear_cuda_error(cudaFree(*flags));
  *flags = nullptr;
  *capacity = 0;
  if (cudaError_t e = cudaMalloc(reinterpret_cast<void**>(flags), chunks)) {
    *flags = nullptr;
    return fail_cuda(call, e, "cudaMalloc(%zu bytes of %s for compression, device %d)", chunks, what, device);
  }
  *capacity = chunks;
  return UVM_OK;
}

// A stream of the scratch's own, made once.
uvm_status own_stream(const Call& call, int device, const char* what, cudaStream_t* stream) {
  if (*stream != nullptr) return UVM_OK;
  if (cudaError_t e = cudaStreamCreateWithFlags(stream, cudaStreamNonBlocking)) {
    *stream = nullptr;
    return fail_cuda(call, e, "cudaStreamCreateWithFlags(the compression's %s, device %d)", what, device);
  }
  return UVM_OK;
}

}  // namespace

uvm_status CodecScratch::prepare(const Call& call, int device, size_t chunks, cudaStream_t stream, bool batches,
                                 bool edge) {
  stream_ = stream;
  if (uvm_status s = grow_flags(call, device, chunks, "chunk flags", &flags_, &flag_capacity_)) return s;
  if (batches) {
    const size_t batch = kCodecBatchChunks * kChunk;
    for (uint8_t*& buffer : batches_) {
      if (buffer != nullptr) continue;
      if (cudaError_t e = cudaMalloc(reinterpret_cast<void**>(&buffer), batch)) {
        buffer = nullptr;
        return fail_cuda(call, e, "cudaMalloc(%zu bytes of compression scratch, device %d)", batch, device);
      }
    }
    if (uvm_status s = own_stream(call, device, "copy stream", &copies_)) return s;
  }
  if (edge && edge_ == nullptr) {
    if (cudaError_t e = cudaMalloc(reinterpret_cast<void**>(&edge_), kChunk)) {
      edge_ = nullptr;
      return fail_cuda(call, e, "cudaMalloc(%zu bytes for the edge chunk of a partial decompression, device %d)", kChunk,
                       device);
    }
  }
  return UVM_OK;
}

uvm_status CodecScratch::prepare_choosing(const Call& call, int device, size_t chunks, bool own) {
  if (chunks > chosen_capacity_) {
    clear_cuda_error(cudaFreeHost(chosen_on_host_));
    chosen_on_host_ = nullptr;
    if (uvm_status s = grow_flags(call, device, chunks, "chosen chunk flags", &chosen_, &chosen_capacity_)) return s;
    void* mapped = nullptr;
    if (cudaError_t e = cudaHostAlloc(&mapped, chunks, cudaHostAllocMapped)) {
      chosen_capacity_ = 0;  // the device flags alone: grown again, both, next time
      return fail_cuda(call, e, "cudaHostAlloc(%zu bytes of mapped memory for the chosen chunk flags, device %d)",
                       chunks, device);
    }
    chosen_on_host_ = static_cast<uint8_t*>(mapped);
  }
  return own ? own_stream(call, device, "choosing stream", &chooser_) : UVM_OK;
}

bool coder_loads(int device, std::string* why) {
  const Call call = Call::of("uvm_pause");
  for (const char* name : kCoderKernels) {
    CUfunction function = nullptr;
    if (codec_kernel(call, device, name, &function) != UVM_OK) {
      *why = uvm_last_error();
      const size_t reason = why->find("): ");  // after the call's name: the driver call and its error
      if (reason != std::string::npos) why->erase(0, reason + 3);
      return false;
    }
  }
  return true;
}

uvm_status choose_chunk_flags(const Call& call, int device, CodecScratch& scratch, const std::vector<ChooseJob>& jobs,
                              cudaStream_t stream, size_t at) {
  size_t total = 0, bytes = 0;
  for (const ChooseJob& job : jobs) {
    total += codec::chunks_in(job.bytes);
    bytes += job.bytes;
  }
  if (total == 0) return UVM_OK;
  if (uvm_status s = scratch.prepare_choosing(call, device, at + total)) return s;
  CUfunction choose = nullptr;
  if (uvm_status s = codec_kernel(call, device, "uvm_codec_choose", &choose)) return s;
  // The kernel writes each job's flags after the one before's, on the device and (with no copy, so
  // nothing waits behind the copy engine's queue of copies out) in the scratch's mapped host memory.
  size_t first_of_job = at;
  for (const ChooseJob& job : jobs) {
    const size_t chunks = codec::chunks_in(job.bytes);
    const auto* in = static_cast<const uint8_t*>(job.src);
    for (size_t first = 0; first < chunks; first += kCodecBatchChunks) {
      const size_t count = std::min(kCodecBatchChunks, chunks - first);
      const void* batch_src = in + first * kChunk;
      uint8_t* batch_flags = scratch.chosen() + first_of_job + first;
      uint8_t* batch_on_host = scratch.chosen_on_host() + first_of_job + first;
      if (uvm_status s = check_aligned(call, device, "uvm_codec_choose", batch_src, nullptr)) return s;
      void* params[] = {&batch_src, &batch_flags, &batch_on_host};
      if (CUresult r = launch_kernel(choose, static_cast<unsigned>(count), kCodecThreads, stream, params)) {
        return fail_driver(call, r, "cuLaunchKernel(uvm_codec_choose of %zu chunks at %p, device %d)", count, batch_src,
                           device);
      }
    }
    first_of_job += chunks;
  }
  if (uvm_status s = wait_until_done(call, device, "choosing how to code", bytes, jobs.front().src, stream)) return s;
  const uint8_t* from = scratch.chosen_on_host() + at;
  for (const ChooseJob& job : jobs) {
    const size_t chunks = codec::chunks_in(job.bytes);
    std::copy_n(from, chunks, job.flags);
    from += chunks;
  }
  return UVM_OK;
}

uvm_status encode_to_host(const Call& call, int device, CodecScratch& scratch, const std::vector<EncodeJob>& jobs,
                          cudaStream_t stream, std::vector<EventRef>* copied) {
  // Flags the choosing left on the device need no copy there; the scratch then only needs its batches.
  const bool flags_on_device =
      std::all_of(jobs.begin(), jobs.end(), [](const EncodeJob& job) { return job.device_flags != nullptr; });
  const bool any_chunk =
      std::any_of(jobs.begin(), jobs.end(), [](const EncodeJob& job) { return codec::chunks_in(job.bytes) > 0; });
  std::vector<size_t> base;
  if (!flags_on_device) {
    if (uvm_status s = upload_flags(call, device, scratch, jobs, &base, stream)) return s;
  } else if (any_chunk) {
    if (uvm_status s = scratch.prepare(call, device, 0, stream)) return s;
  }
  if (jobs.empty()) return UVM_OK;
  size_t bytes = 0;
  std::vector<Batch> batches;
  for (size_t j = 0; j < jobs.size(); ++j) {
    add_batches(j, 0, codec::chunks_in(jobs[j].bytes), &batches);
    bytes += jobs[j].bytes;
  }
  if (copied != nullptr) copied->assign(jobs.size(), nullptr);
  // The copies out run on the scratch's stream (made by upload_flags when there are chunks to code);
  // with none, the raw tails go on `stream`.
  const cudaStream_t out = batches.empty() ? stream : scratch.copies();
  std::vector<size_t> at(jobs.size(), 0);  // where each job's next stored chunk goes in its host copy
  // Each job's copies out, timed on `out` (the move's "code" phase): a trace shows when the first
  // began, after the choosing, and how fast each ran.
  std::vector<std::unique_ptr<StreamPhase>> timed(jobs.size());
  const auto time_from_here = [&](size_t j) {
    if (!timed[j]) timed[j] = std::make_unique<StreamPhase>(Phase::code, out, 1, reinterpret_cast<uintptr_t>(jobs[j].src));
  };
  // Once a job's chunks are out, its raw tail, read from its source on `out` (which waited for
  // `stream`'s work before it), and where its copies end.
  const auto finish_job = [&](size_t j) -> uvm_status {
    const EncodeJob& job = jobs[j];
    const size_t whole = codec::chunks_in(job.bytes) * kChunk;
    void* tail = const_cast<uint8_t*>(static_cast<const uint8_t*>(job.src) + whole);  // only read: a copy to the host
    time_from_here(j);
    if (uvm_status s = copy_parts(call, device, job.host, at[j], tail, job.bytes - whole, true, "bytes of the raw tail",
                                  out)) {
      return s;
    }
    timed[j]->finish(job.bytes);
    return copied == nullptr ? UVM_OK : record_event(call, out, &(*copied)[j]);
  };
  // Coded on `stream`, copied out on `out`; `stream` then waits for the copies.
  const Stage encode = [&](const Batch& batch, uint8_t* scratch_batch) {
    const auto* in = static_cast<const uint8_t*>(jobs[batch.job].src);
    const uint8_t* flags = jobs[batch.job].device_flags ? jobs[batch.job].device_flags : scratch.flags() + base[batch.job];
    return launch_batch(call, device, "uvm_codec_encode", in + batch.first * kChunk, flags, batch.first,
                        batch.end - batch.first, scratch_batch, stream);
  };
  const Stage copy_out = [&](const Batch& batch, uint8_t* scratch_batch) {
    const EncodeJob& job = jobs[batch.job];
    const size_t batch_bytes = stored_run(job.flags, batch.first, batch.end);
    time_from_here(batch.job);
    if (uvm_status s = copy_parts(call, device, job.host, at[batch.job], scratch_batch, batch_bytes, true, "coded bytes",
                                  out)) {
      return s;
    }
    at[batch.job] += batch_bytes;
    return batch.end == codec::chunks_in(job.bytes) ? finish_job(batch.job) : UVM_OK;
  };
  // After a failure nothing may still write into the hosts' bytes, which the caller gives back.
  const auto give_up = [&](uvm_status status) {
    clear_cuda_error(cudaStreamSynchronize(out));
    clear_cuda_error(cudaStreamSynchronize(stream));
    return status;
  };
  if (out != stream) {
    if (uvm_status s = wait_for_stream(call, out, stream, "the sources' writes before their copies")) return give_up(s);
  }
  for (size_t j = 0; j < jobs.size(); ++j) {  // a job of less than a chunk has no batch
    if (codec::chunks_in(jobs[j].bytes) > 0) continue;
    if (uvm_status s = finish_job(j)) return give_up(s);
  }
  if (uvm_status s = run_batches(call, batches, scratch, stream, encode, out, copy_out)) return give_up(s);
  if (copied != nullptr) return UVM_OK;  // the caller waits for the copies, by their events
  if (out != stream) {
    if (uvm_status s = wait_for_stream(call, stream, out, "the coded bytes' copies to the host")) return give_up(s);
  }
  return wait_until_done(call, device, "compressing", bytes, jobs.front().src, stream);
}

uvm_status decode_from_host(const Call& call, int device, CodecScratch& scratch, const std::vector<DecodeJob>& jobs,
                            cudaStream_t stream, const std::function<uvm_status(size_t job)>& before_writing) {
  for (const DecodeJob& job : jobs) {
    if (job.from >= job.to || job.to > job.bytes) {
      return fail(call, UVM_ERROR_INVALID_ARGUMENT, "bytes [%zu, %zu) of a %zu-byte compressed copy", job.from, job.to,
                  job.bytes);
    }
  }
  // Where raw byte `raw` of job j goes.
  auto out_at = [&](const DecodeJob& job, size_t raw) { return static_cast<uint8_t*>(job.dst) + (raw - job.from); };
  // Each job's chunks wholly inside [from, to), and the (at most two) it reaches only in part.
  std::vector<Batch> whole, edges;
  for (size_t j = 0; j < jobs.size(); ++j) {
    const DecodeJob& job = jobs[j];
    const size_t chunks = codec::chunks_in(job.bytes);
    const size_t first = std::min((job.from + kChunk - 1) / kChunk, chunks);
    const size_t end = std::max(std::min(job.to / kChunk, chunks), first);
    const size_t added = whole.size();
    add_batches(j, first, end, &whole);
    // Each batch's stored offset, running on from the one before (not summed again from chunk 0
    // per batch: that cost the resume of 8 GiB a pass over its flags for each of its 256 batches).
    for (size_t b = added, at = stored_run(job.flags, 0, first); b < whole.size(); ++b) {
      whole[b].stored_at = at;
      at += stored_run(job.flags, whole[b].first, whole[b].end);
    }
    for (const size_t c : {job.from / kChunk, (job.to - 1) / kChunk}) {
      const bool partial = c < chunks && (c < first || c >= end);
      if (partial && (edges.empty() || edges.back().job != j || edges.back().first != c)) {
        edges.push_back(Batch{j, c, c + 1, stored_run(job.flags, 0, c)});
      }
    }
  }
  std::vector<bool> ready(jobs.size(), !before_writing);
  const auto make_ready = [&](size_t j) {
    if (ready[j]) return UVM_OK;
    ready[j] = true;
    return before_writing(j);
  };
  // The scratch first, all of it: where the device has no room for it (a colocated process took
  // all but the paused bytes), the CPU decodes instead.
  size_t all_chunks = 0;
  for (const DecodeJob& job : jobs) all_chunks += codec::chunks_in(job.bytes);
  if (!whole.empty() || !edges.empty()) {
    if (scratch.prepare(call, device, all_chunks, stream, true, !edges.empty()) != UVM_OK) {
      say_decoding_on_host(device, uvm_last_error());
      uvm_clear_last_error();
      return decode_on_host(call, device, jobs, stream, before_writing);
    }
  }
  std::vector<size_t> base;
  if (uvm_status s = upload_flags(call, device, scratch, jobs, &base, stream)) return s;
  if (!edges.empty()) {
    if (uvm_status s = scratch.prepare(call, device, 0, stream, true, true)) return s;
  }
  // Copied in on the scratch's stream (after the flags, on `stream`), decoded on `stream`; a decode
  // writes where the batch's first chunk goes, or into the edge chunk.
  const auto run = [&](const std::vector<Batch>& batches, bool into_edge) -> uvm_status {
    if (batches.empty()) return UVM_OK;
    if (uvm_status s = wait_for_stream(call, scratch.copies(), stream, "decoding before the copies in")) return s;
    const Stage copy_in = [&](const Batch& batch, uint8_t* scratch_batch) {
      const DecodeJob& job = jobs[batch.job];
      const size_t batch_bytes = stored_run(job.flags, batch.first, batch.end);
      return copy_parts(call, device, job.host, batch.stored_at, scratch_batch, batch_bytes, false,
                        "coded bytes", scratch.copies());
    };
    const Stage decode = [&](const Batch& batch, uint8_t* scratch_batch) {
      const DecodeJob& job = jobs[batch.job];
      if (uvm_status s = make_ready(batch.job)) return s;
      uint8_t* dst = into_edge ? scratch.edge() : out_at(job, batch.first * kChunk);
      if (uvm_status s = launch_batch(call, device, "uvm_codec_decode", scratch_batch, scratch.flags() + base[batch.job],
                                      batch.first, batch.end - batch.first, dst, stream)) {
        return s;
      }
      if (!into_edge) return UVM_OK;
      // Only the edge chunk's bytes inside [from, to) go on.
      const size_t chunk_begin = batch.first * kChunk;
      const size_t begin = std::max(job.from, chunk_begin), end = std::min(job.to, chunk_begin + kChunk);
      if (cudaError_t e = cudaMemcpyAsync(out_at(job, begin), scratch.edge() + (begin - chunk_begin), end - begin,
                                          cudaMemcpyDefault, stream)) {
        return fail_cuda(call, e, "cudaMemcpyAsync(%zu bytes of a decoded edge chunk to %p, device %d)", end - begin,
                         static_cast<void*>(out_at(job, begin)), device);
      }
      return UVM_OK;
    };
    return run_batches(call, batches, scratch, scratch.copies(), copy_in, stream, decode);
  };
  if (uvm_status s = run(whole, false)) return s;
  // One at a time: each decodes into the same edge chunk, which the copy after it reads on `stream`.
  for (const Batch& edge : edges) {
    if (uvm_status s = run({edge}, true)) return s;
  }
  size_t bytes = 0;
  for (size_t j = 0; j < jobs.size(); ++j) {
    const DecodeJob& job = jobs[j];
    const size_t chunks = codec::chunks_in(job.bytes);
    const size_t tail_begin = std::max(job.from, chunks * kChunk);
    if (tail_begin < job.to) {
      if (uvm_status s = make_ready(j)) return s;
      const size_t at = stored_run(job.flags, 0, chunks) + (tail_begin - chunks * kChunk);
      if (uvm_status s = copy_parts(call, device, job.host, at, out_at(job, tail_begin), job.to - tail_begin, false,
                                    "bytes of the raw tail", stream)) {
        return s;
      }
    }
    bytes += job.to - job.from;
  }
  return wait_until_done(call, device, "decompressing", bytes, jobs.empty() ? nullptr : jobs.front().dst, stream);
}

uvm_status compress_to_host(const Call& call, int device, const void* src, size_t bytes, void* host, uint8_t* flags,
                            size_t* stored, cudaStream_t stream) {
  CodecScratch scratch;
  if (uvm_status s = choose_chunk_flags(call, device, scratch, {ChooseJob{src, bytes, flags}}, stream)) return s;
  const std::vector<EncodeJob> job = {EncodeJob{src, bytes, flags, {HostPart{static_cast<char*>(host), bytes}}}};
  if (uvm_status s = encode_to_host(call, device, scratch, job, stream)) return s;
  *stored = codec::compressed_bytes(flags, bytes);
  return UVM_OK;
}

uvm_status compress_on_device(const Call& call, int device, const void* src, size_t bytes, void* dst, uint8_t* flags,
                              size_t* stored, cudaStream_t stream) {
  CodecScratch scratch;
  if (uvm_status s = choose_chunk_flags(call, device, scratch, {ChooseJob{src, bytes, flags}}, stream)) return s;
  const size_t chunks = codec::chunks_in(bytes);
  const auto* in = static_cast<const uint8_t*>(src);
  auto* out = static_cast<uint8_t*>(dst);
  size_t at = 0;
  for (size_t first = 0; first < chunks; first += kCodecBatchChunks) {  // the flags on the device are chosen's
    const size_t end = std::min(first + kCodecBatchChunks, chunks);
    if (uvm_status s = launch_batch(call, device, "uvm_codec_encode", in + first * kChunk, scratch.chosen(), first,
                                    end - first, out + at, stream)) {
      return s;
    }
    at += stored_run(flags, first, end);
  }
  const size_t tail = bytes - chunks * kChunk;
  if (tail > 0) {
    if (cudaError_t e = cudaMemcpyAsync(out + at, in + chunks * kChunk, tail, cudaMemcpyDefault, stream)) {
      return fail_cuda(call, e, "cudaMemcpyAsync(the %zu-byte tail to %p, device %d)", tail, static_cast<void*>(out + at),
                       device);
    }
  }
  if (uvm_status s = wait_until_done(call, device, "compressing", bytes, src, stream)) return s;
  *stored = at + tail;
  return UVM_OK;
}

uvm_status decompress_from_host(const Call& call, int device, const void* host, const uint8_t* flags, size_t bytes,
                                void* dst, cudaStream_t stream) {
  if (bytes == 0) return UVM_OK;
  CodecScratch scratch;
  const HostParts parts = {HostPart{static_cast<char*>(const_cast<void*>(host)), codec::compressed_bytes(flags, bytes)}};
  return decode_from_host(call, device, scratch, {DecodeJob{parts, flags, bytes, 0, bytes, dst}}, stream);
}

}  // namespace uvm
