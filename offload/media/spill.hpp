// Offload and onload of copies kept outside pinned staging — in pageable memory mapped for them
// (UVM_STRATEGY_MMAP) or in files on disk (UVM_STRATEGY_DISK) — through pinned bounce buffers.
// Neither can be reached by the copy engines at full speed (pageable memory goes through the
// driver's own small staging; a file not at all), so several worker threads each copy a batch
// between the device and a pinned buffer of their own and write it out (or read it in), and the
// link, the disk and the CPU's memcpy work at once.
#pragma once

#include <memory>
#include <vector>

#include "../../hints/moves/hint_range.hpp"
#include "copies.hpp"

namespace uvm {

// The pinned buffer each worker thread copies through, and the bigger one of a disk read.
constexpr size_t kBounceBytes = size_t{16} << 20;
constexpr size_t kDiskReadBytes = size_t{64} << 20;

// Both wait first for `stream` (the caller's work on the bytes), then copy on uvm's threads and
// return once done.
//
// Copies `pieces` (of `device`, sorted by address, each inside a uvm allocation whose memory is
// mapped) into new `kept` copies (Kept::pageable or Kept::disk), one per allocation, and waits for
// it: `out` gets a staged piece for each, in order. On a failure nothing is kept (mappings and files
// made are given back) and the device bytes are untouched.
uvm_status spill_out(const Call& call, int device, cudaStream_t stream, const std::vector<HintRange>& pieces,
                     Kept kept, std::vector<StagedPiece>* out);

// Copies `pieces` (pageable or disk) back into their device memory, which must be mapped, and waits
// for it. `managed[i]`: piece i is managed memory, populated on the device before its copy and
// prefetched after, as onload.cpp's copy_chunk does for the same reason. A file changed while
// offloaded fails the call before anything is copied.
uvm_status spill_in(const Call& call, int device, cudaStream_t stream, const std::vector<StagedPiece>& pieces,
                    const std::vector<bool>& managed);

// Pageable memory for a copy: mapped, with huge pages where the host allows (page faults at 2 MiB,
// not 4 KiB, while it is filled), unmapped when the last holder of `out` lets go.
uvm_status map_pageable(const Call& call, size_t bytes, std::shared_ptr<char>* out);

// Tests only: a move makes, writes and reads no more than `most` backup files at once (0, the
// default: a quarter of the descriptor limit, at most 256), so that moves of a few files run in
// several groups.
void set_files_at_once_for_test(size_t most);

// Frees the bounce buffers not in use (uvm_release_staging): each block of them whose buffers are
// all idle; the next spill pins what it lacks again, as one block.
uvm_status free_bounce_buffers(const Call& call);

}  // namespace uvm
