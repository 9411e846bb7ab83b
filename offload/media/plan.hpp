// Planning for offload and onload, kept free of CUDA calls so that it is tested on its own: which
// strategy runs, which bytes still need moving, and how the onload pipeline cuts its work.
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <vector>

#include "../../alloc/span_set.hpp"
#include "uvm.h"

namespace uvm {

// AUTO becomes STAGED where discard works (several times faster than migration: docs/performance.md,
// "The driver behaviour behind the design"), else MIGRATE. Others stay as asked.
uvm_strategy choose_strategy(uvm_strategy requested, bool discard_supported);

// The parts of `range` that no span of `covered` (sorted, disjoint) covers.
std::vector<Span> subtract(const Span& range, const std::vector<Span>& covered);

// The one rule both moves split a range by: its staged pieces (bytes with a host copy), its free
// space (bytes outside every block a reporting runtime handed out, which hold nothing to keep), and
// the rest. Offload leaves the staged pieces (off the device already), drops the free space, and
// stages or migrates the rest; onload copies the staged pieces back, leaves the free space, and
// prefetches the rest. `staged` and `free` lie inside `range`, disjoint, in any order.
struct RangeSplit {
  std::vector<Span> staged;
  std::vector<Span> free;
  std::vector<Span> rest;  // in address order
};
RangeSplit split_range(const Span& range, std::vector<Span> staged, std::vector<Span> free);

}  // namespace uvm

namespace uvm {

// A staged piece to copy back: its managed bytes, the uvm allocation holding them, its host copy,
// and the driver allocation holding them (a slab of small-tensor segments, or the allocation).
struct CopyPiece {
  Span span;
  uintptr_t allocation = 0;
  const char* host = nullptr;
  uintptr_t memory = 0;
};

// One step of an onload on one worker stream: `populate` is prefetched to the device, each of
// `copies` (pieces of pieces, inside `populate`) is copied back, and `populate` is prefetched again.
struct OnloadChunk {
  Span populate;
  std::vector<CopyPiece> copies;
};

// Cuts `pieces` (sorted by address, disjoint) into chunks of at most `chunk_bytes`; pieces that
// touch inside one driver allocation share a chunk, including pieces of neighbouring slots of a
// slab (alloc/slabs.hpp), so that one prefetch populates them. A gap between pieces is never
// populated: prefetching a gap together with the pieces around it lost data (zeros from
// a 64 KiB boundary on, 1 run in 12), where prefetching exactly the copied bytes never did.
// Chunks do not cross driver allocations (the driver refuses such a prefetch). Filling them across
// separate allocations, with one cudaMemPrefetchBatchAsync a chunk, made the onload slower: the
// driver still pays per range, batched or not (docs/measurements.md, "Small tensors").
std::vector<OnloadChunk> plan_onload(const std::vector<CopyPiece>& pieces, size_t chunk_bytes);

// One copy between the device and staging, for both directions: pieces[first, end), `bytes` long.
struct CopyRun {
  size_t first;
  size_t end;
  size_t bytes;
};

// The copies that move `pieces` (sorted by address): a copy takes the pieces after its first while
// each starts where the one before ends, both on the device (in one driver allocation) and in
// staging, and `one_registration(host, bytes)` says one copy may reach that many staging bytes (a
// copy across two host registrations fails). The 2 MiB segments of a slab then take 32
// copies, not 1,024.
std::vector<CopyRun> copy_runs(const std::vector<CopyPiece>& pieces,
                               const std::function<bool(const char* host, size_t bytes)>& one_registration);

}  // namespace uvm

namespace uvm {

// Copies kept outside pinned staging (pageable memory, disk) move through pinned bounce buffers.
// Each item is device bytes `span` kept at `offset` in copy `target` (a mapping or a file).
struct SpillItem {
  Span span;
  size_t target = 0;
  uint64_t offset = 0;
};

// One copy between the device and a bounce buffer, and the I/O that moves it to or from its target:
// the target's bytes [io_begin, io_begin + io_bytes) — `offset`'s bytes widened to the alignment,
// for O_DIRECT — sit at `bounce` in the buffer, so the chunk's own bytes start at
// bounce + (offset - io_begin).
struct SpillChunk {
  Span span;
  size_t item = 0;  // the item it is cut from
  size_t target = 0;
  uint64_t offset = 0;
  uint64_t io_begin = 0;
  size_t io_bytes = 0;
  size_t bounce = 0;
};

// The chunks one worker moves with one buffer: copied together, then written (or read) together.
struct SpillBatch {
  std::vector<SpillChunk> chunks;
};

// Cuts `items` into chunks that fit a `buffer_bytes` buffer with their I/O widened to `align`
// (a power of two dividing buffer_bytes), and packs chunks that follow each other into batches.
// Items written at aligned offsets stay aligned: an item's chunks fill the buffer but its last,
// whose I/O runs into the padding lay_out_copies leaves after every item (a chunk starting
// unaligned is buffer_bytes - align long, the room its widening needs). A 64 MiB item moves in
// four 16 MiB batches, not four of 16 MiB - 64 bytes and a fifth of 256 bytes.
std::vector<SpillBatch> plan_spill(const std::vector<SpillItem>& items, size_t buffer_bytes, size_t align);

// Where an offload's pieces (sorted by address; `allocations[i]` holds piece i) go: one copy per
// allocation, each piece at the next `align`ed offset of its allocation's copy. `targets` gets each
// copy's allocation and size (a multiple of align), in the order first seen.
struct CopyLayout {
  std::vector<SpillItem> items;
  std::vector<uintptr_t> target_allocations;
  std::vector<uint64_t> target_bytes;
};
CopyLayout lay_out_copies(const std::vector<Span>& pieces, const std::vector<uintptr_t>& allocations, size_t align);

}  // namespace uvm
