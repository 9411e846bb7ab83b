// Compressed backups' device side: the format of codec.hpp written and read on the GPU by uvm's
// kernels (codec_kernels.cu), so that fewer bytes cross the link and less host memory holds them.
//
// Compressing `bytes` of device memory runs in two steps on one stream: a kernel picks each chunk's
// flag (its exponent window, or raw), writing it on the device and, through mapped memory, on the
// host, which then knows the room the copy needs; then, a batch of chunks at a time, a kernel codes
// the batch into device scratch memory and a copy takes the coded bytes to the host. Decompressing
// runs the other way. The raw tail (less than a chunk) is copied as it is.
#pragma once

#include <cuda_runtime_api.h>

#include <cstddef>
#include <cstdint>
#include <functional>
#include <set>
#include <string>
#include <vector>

#include "../../alloc/errors.hpp"
#include "../../alloc/events.hpp"
#include "codec.hpp"

namespace uvm {

// Raw chunks one batch takes: 32 MiB, coded into scratch memory of that size at most.
constexpr size_t kCodecBatchChunks = 512;

// Where a compressed copy's stored bytes lie in host memory: parts, in order. A reservation of
// pinned staging may come in parts (cut where a step of its pinning ends), and one copy may not
// cross two host registrations, so every copy is cut where a part ends.
struct HostPart {
  char* host;
  size_t bytes;
};
using HostParts = std::vector<HostPart>;

// The memory and the streams the coder borrows: the chosen flags (choose_chunk_flags, on the
// device and in mapped host memory) and the choosing's own stream, so that the next piece can be
// chosen while one is coded; the flags a decode copies in, two scratch batches (one is coded while
// the other is copied) with the copy stream, and a chunk for the edges of a partial decode. Made once for a move's pieces, grown as a
// piece needs, and given back (after every stream has passed the work that used it) when it goes.
class CodecScratch {
 public:
  CodecScratch() = default;
  CodecScratch(const CodecScratch&) = delete;
  CodecScratch& operator=(const CodecScratch&) = delete;
  ~CodecScratch();
  // Room for the flags of `chunks` chunks, on `stream`; with `batches`, the batches and the copy
  // stream too; with `edge`, the edge chunk.
  uvm_status prepare(const Call& call, int device, size_t chunks, cudaStream_t stream, bool batches = true,
                     bool edge = false);
  // Room for the flags choose_chunk_flags writes (chosen()) for `chunks` chunks; with `own_stream`,
  // the choosing's own stream too (chooser()).
  uvm_status prepare_choosing(const Call& call, int device, size_t chunks, bool own_stream = false);
  uint8_t* flags() const { return flags_; }
  uint8_t* chosen() const { return chosen_; }
  // The same flags in mapped host memory, written by the same kernel.
  uint8_t* chosen_on_host() const { return chosen_on_host_; }
  cudaStream_t chooser() const { return chooser_; }
  // The scratch batch to write next, the two in turn, and in `*read` where the last work reading it
  // ends (null if none): the next writer waits for it, then records its own reader there.
  uint8_t* take_batch(EventRef** read) {
    next_ = 1 - next_;
    *read = &read_[next_];
    return batches_[next_];
  }
  uint8_t* edge() const { return edge_; }
  cudaStream_t copies() const { return copies_; }

 private:
  uint8_t* flags_ = nullptr;
  size_t flag_capacity_ = 0;
  uint8_t* chosen_ = nullptr;
  uint8_t* chosen_on_host_ = nullptr;
  size_t chosen_capacity_ = 0;  // of both
  cudaStream_t chooser_ = nullptr;
  uint8_t* batches_[2] = {nullptr, nullptr};
  EventRef read_[2];
  size_t next_ = 1;
  uint8_t* edge_ = nullptr;
  cudaStream_t stream_ = nullptr;
  cudaStream_t copies_ = nullptr;
};

// Every device pointer the coder's kernels read or write (a job's `src`, a decode's `dst` and each
// whole chunk after them) must be 16-byte aligned: they access 16 bytes a thread, and a misaligned
// access loses the context. One that is not fails UVM_ERROR_INTERNAL, with nothing launched.

// Says `what` on stderr the first time `device` meets it (`told`: the devices already told, one set
// per message): the coder's fallbacks are said once per device, not once per move.
void say_once_per_device(std::set<int>* told, int device, const std::string& what);

// Whether the coder's kernels load on `device` (current): where they cannot (a driver too old for
// their PTX), `why` names the call that failed and its error, and no CUDA error is left pending.
bool coder_loads(int device, std::string* why);

// Step one of compressing, for several sources at once: each job's `bytes` of device memory at
// `src` (on `device`, whose context is current), each whole chunk's flag chosen on the device (in
// scratch.chosen() from flag `at` on, one job's after the other's) and in host `flags`
// (codec::chunks_in(bytes) of them) once this returns, after one wait for them all, on `stream` (the
// caller's, or the scratch's chooser()). Their codec::compressed_bytes is the room step two needs.
struct ChooseJob {
  const void* src;
  size_t bytes;
  uint8_t* flags;
};
uvm_status choose_chunk_flags(const Call& call, int device, CodecScratch& scratch, const std::vector<ChooseJob>& jobs,
                              cudaStream_t stream, size_t at = 0);

// Step two for several sources at once: each job's `bytes` at device `src`, coded under its host
// `flags`, into its host memory `host` (codec::compressed_bytes(flags, bytes) of room; pinned for
// the copies to run at the link's speed), the raw tail after the chunks. The jobs' batches run in one
// pipeline, so that coding one source overlaps the copies of the one before. Returns once the bytes
// are on the host; with `copied`, once the work is issued instead, `(*copied)[j]` recorded where
// job j's copies end (its source is read no more, its host bytes are written), so that the caller
// can act on each job while the later ones still run; `stream` does not wait for them (the caller
// makes it, by the events), and the next call may begin meanwhile. The sources
// are only read. A failure names the step and the CUDA error, and returns once nothing still writes
// to the hosts; what was written there by then is not a backup of anything.
struct EncodeJob {
  const void* src;
  size_t bytes;
  const uint8_t* flags;
  HostParts host;
  // The same flags on the device, as choose_chunk_flags left them; null: copied there from `flags`
  // (a copy from pageable memory, which waits for the stream: the host could not run ahead).
  const uint8_t* device_flags = nullptr;
};
uvm_status encode_to_host(const Call& call, int device, CodecScratch& scratch, const std::vector<EncodeJob>& jobs,
                          cudaStream_t stream, std::vector<EventRef>* copied = nullptr);

// Reverses step two, job by job: the raw bytes [from, to) of the `bytes` that `host` and `flags`
// code, written into device memory `dst` (where byte `from` goes). Chunks that lie across `from`
// or `to` are decoded into the edge chunk and only their bytes inside are copied on, so no byte
// outside [dst, dst + to - from) changes. The whole chunks of every job run in one pipeline.
// With `before_writing`, before_writing(j) runs once per job, before anything that writes into job
// j's `dst` is issued (the work issued for the jobs before runs on meanwhile); a failure there ends
// the decode. Returns once every byte is there. `host` and `flags` are only read: after a failure
// they still hold the backup.
struct DecodeJob {
  HostParts host;
  const uint8_t* flags;
  size_t bytes;
  size_t from;
  size_t to;
  void* dst;
};
uvm_status decode_from_host(const Call& call, int device, CodecScratch& scratch, const std::vector<DecodeJob>& jobs,
                            cudaStream_t stream, const std::function<uvm_status(size_t job)>& before_writing = {});

// Both steps at once, into host memory `host` (room for `bytes`), the compressed size in `*stored`.
uvm_status compress_to_host(const Call& call, int device, const void* src, size_t bytes, void* host, uint8_t* flags,
                            size_t* stored, cudaStream_t stream);

// The same format written into device memory `dst` (room for `bytes`) instead of the host: the coder
// alone, with no copy (what the benchmark times against other coders; `flags` is host memory).
uvm_status compress_on_device(const Call& call, int device, const void* src, size_t bytes, void* dst, uint8_t* flags,
                              size_t* stored, cudaStream_t stream);

// Reverses compress_to_host: all `bytes` raw bytes that `host` and `flags` hold, into `dst`.
uvm_status decompress_from_host(const Call& call, int device, const void* host, const uint8_t* flags, size_t bytes,
                                void* dst, cudaStream_t stream);

}  // namespace uvm
