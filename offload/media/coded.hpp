// Compressed copies (uvm_set_thread_compression): what uvm_pause keeps of a compressed allocation's
// bytes, and the moves that write and read them. The coder (compress.hpp) codes whole chunks, so a
// compressed copy cannot be cut at any byte the way a plain one is; instead every staged piece cut
// from it (StagedPiece::part) keeps the whole copy and narrows its span, and bringing a piece back
// decodes the chunks its span reaches, writing only its own bytes. The copy's host memory goes
// back with the last piece holding it.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <vector>

#include "../../hints/moves/hint_range.hpp"
#include "../coder/compress.hpp"
#include "copies.hpp"

namespace uvm {

struct CodedCopy {
  Span raw;                    // the device bytes it codes
  std::vector<uint8_t> flags;  // each whole chunk's flag (codec.hpp)
  size_t stored = 0;           // its bytes: the coded chunks, then the raw tail
  Kept kept = Kept::pinned;
  HostParts parts;             // pinned and pageable: where the stored bytes lie, in order
  std::vector<std::shared_ptr<char>> leases;  // holding them (staging leases, or the mapping)
  std::shared_ptr<BackupFile> file;           // disk: the file holding them from offset 0
};

// Copies `pieces` (of `device`, whose context is current; sorted by address, each inside a uvm
// allocation whose memory is mapped) into new compressed copies kept as `kept` (pinned staging,
// pageable memory or a file), one per piece (two where a piece starts off a 16-byte boundary: its
// bytes up to it are a raw copy of their own, since the kernels access 16 bytes at a time), on
// `stream` (after the caller's work there), `out` holding a staged piece for each copy. Returns once the copies are issued: `(*copied)[i]` marks where
// piece i's copy ends (null for a disk copy, complete on return), and `stream` waits for them all,
// so that a piece's memory can go back once its own copy has ended. `scratch` is the coder's
// device memory and streams; it must outlive the copies (its end waits for them). Retained
// copies of those bytes are dropped first (out of date, and their host memory is what the new
// copies reuse). On a failure nothing is kept, nothing still writes to the host, and the device
// bytes are untouched.
uvm_status code_out(const Call& call, int device, cudaStream_t stream, const std::vector<HintRange>& pieces, Kept kept,
                    CodecScratch& scratch, std::vector<StagedPiece>* out, std::vector<EventRef>* copied);

// Decodes compressed `pieces` back into their device memory on `stream`; returns once done.
// `make_ready(i)` runs once per piece, before anything that writes into piece i is issued (mapping
// its memory: while it runs, the pieces before it go on decoding). `managed[i]`: piece i is managed
// memory, populated on the device before its decode and prefetched after, as onload.cpp's
// copy_chunk does for the same reason. The copies are only read: after a failure they still hold
// every byte.
uvm_status code_in(const Call& call, int device, cudaStream_t stream, const std::vector<StagedPiece>& pieces,
                   const std::vector<bool>& managed, const std::function<uvm_status(size_t piece)>& make_ready);

// Whether the coder can run on `device` (current). The first time it cannot there, says why on
// stderr, once: its pauses keep plain copies instead.
bool coder_usable(int device);

// Makes `scratch` ready for code_out of `pieces` (its device memory, mapped flags and streams), all
// before anything is moved; false where it cannot (a device with no room for 64 MiB of scratch, say),
// with nothing pending and the failure said on stderr once per device: the pause then keeps plain
// copies, since a pause that plain copies can do must never fail because of compression.
bool coder_scratch_ready(const Call& call, int device, cudaStream_t stream, const std::vector<HintRange>& pieces,
                         CodecScratch& scratch);

}  // namespace uvm
