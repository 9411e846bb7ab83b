// uvm's pinned host staging memory for staged offload: blocks of pinned memory handed out by bump
// allocation, and the one record of what is staged where (the map from device byte ranges to the
// host bytes that hold their data). Residency, offload, onload, discard and free all read it here.
//
// Pinned memory is slow to allocate (0.25 s for 4 GiB on an H100 the way pinned.hpp does it, 2.1 s
// with cudaHostAlloc), so blocks are kept and reused across offload/onload cycles, and an
// offload's new block is pinned in steps that its copies use as each is done. A block's bump pointer rewinds once nothing in it is staged; the
// next writer then waits, on its stream, for every copy that was still reading the block.
#pragma once

#include <cuda_runtime_api.h>

#include <condition_variable>
#include <cstddef>
#include <map>
#include <memory>
#include <mutex>
#include <vector>

#include "../alloc/errors.hpp"
#include "../alloc/span_set.hpp"
#include "../hints/events.hpp"
#include "pinned.hpp"

namespace uvm {

// A staged piece of managed memory: its bytes are at `host` once `written` has completed.
struct StagedPiece {
  Span span;
  char* host = nullptr;
  EventRef written;
};

class Staging {
 public:
  // Host bytes for each span (same order) in the free tails of the existing blocks, and in
  // `wait_for` the reads the writer must wait for. False, reserving nothing, if they are too small:
  // the caller then lets go of its locks and grows the store (ensure_capacity) first.
  bool reserve(const std::vector<Span>& spans, std::vector<char*>* hosts, std::vector<EventRef>* wait_for);
  // Like reserve, for the longest leading run of `spans` that fits in memory already pinned (a
  // block being pinned in steps offers its steps done), in `placed` with its host bytes in `hosts`:
  // in a block pinned in steps a span is cut where a step ends, since one copy may not cross two
  // registrations (cudaErrorInvalidValue on an H100), so `placed` may hold a span's first parts.
  void reserve_prefix(const std::vector<Span>& spans, std::vector<Span>* placed, std::vector<char*>* hosts,
                      std::vector<EventRef>* wait_for);
  // Gives back a reservation that was never committed.
  void cancel(const std::vector<Span>& spans, const std::vector<char*>& hosts);
  // The spans now hold data, complete when `written` completes (null: already complete).
  void commit(const std::vector<Span>& spans, const std::vector<char*>& hosts, EventRef written);
  // The staged pieces overlapping [begin, end), clipped to it, by address.
  std::vector<StagedPiece> overlapping(uintptr_t begin, uintptr_t end) const;
  // Forgets what is staged in [begin, end); its host bytes are free once `read` (may be null)
  // completes.
  void release(uintptr_t begin, uintptr_t end, const EventRef& read);
  // Allocates, without holding any lock, the pinned block a reserve() of `spans` would have to add,
  // so that pinning memory (seconds for many GiB) blocks no other uvm call.
  // Growers take turns (growth_mutex_), so that an offload waiting for a reservation in progress
  // uses its block instead of allocating one of its own.
  // With `in_steps` (an offload: the copies into the first steps overlap the pinning of the rest),
  // a new block of the registered kind is pinned in steps on a thread of its own and this returns
  // at once; after one such pinning failed, growth pins at once again (cudaHostAlloc fallback).
  // A block still being pinned counts at its full size.
  uvm_status ensure_capacity(const Call& call, const std::vector<Span>& spans, bool in_steps = false);
  // Waits, holding no lock, until a block being pinned in steps pins more or stops; false at once
  // if none is being pinned.
  bool wait_for_pinning();
  // Frees the blocks that hold nothing, after the copies reading them finished, and the steps of a
  // block pinned in steps past the last one its bump pointer reaches (trim_steps). The blocks leave
  // the store first, so no lock is held while it waits and frees (unpinning GiBs takes
  // hundreds of ms); a block whose wait fails goes back, and the next call tries again. Frees
  // nothing while an offload holds a RoomClaim. Returns once a free in the background has ended too.
  uvm_status free_unused(const Call& call);
  // Keeps what is held near what is staged: after an offload, blocks that hold nothing (the set
  // offloaded shrank, so fewer blocks hold it) and the unused steps of a block bigger than the set
  // it now holds are freed on a thread of their own, since unpinning GiBs takes hundreds of ms.
  // Starts nothing when there is nothing to free.
  void free_unused_in_background();

  // Held by an offload from making room (ensure_capacity) until it has reserved it: the room is
  // not freed under it. Without it a release_staging loop on another thread took the room every
  // time before the offload reserved it, and the offload never finished (on an H100).
  class RoomClaim {
   public:
    explicit RoomClaim(Staging& store);
    ~RoomClaim();
    RoomClaim(const RoomClaim&) = delete;
    RoomClaim& operator=(const RoomClaim&) = delete;

   private:
    Staging& store_;
  };
  size_t capacity_bytes() const;
  size_t staged_bytes() const;
  // The held memory by kind (uvm_get_staging_info).
  uvm_staging_info info() const;
  // The staged bytes inside [begin, end).
  size_t staged_bytes_in(uintptr_t begin, uintptr_t end) const;
  // Whether [host, host + bytes) lies in one block and, for a block pinned in steps, one step: one
  // copy may then reach all of it (a copy across two host registrations fails on an H100).
  bool one_registration(const char* host, size_t bytes) const;

 private:
  struct Block {
    PinnedMemory memory;  // how it was pinned, and how far a pinning in steps has come
    size_t used = 0;  // bump pointer
    size_t live = 0;  // bytes reserved or staged
    int device = 0;   // current when it was allocated; freed in that device's context
    std::vector<EventRef> reads;  // copies out of this block that may still run
  };
  struct Entry {
    uintptr_t end;
    char* host;
    std::shared_ptr<Block> block;
    EventRef written;
  };
  std::shared_ptr<Block> block_holding(const char* host) const;
  // The bytes of `spans` no block can take (first fit); `pinning_done` counts blocks being pinned
  // at their full size instead of their steps done.
  size_t unplaced_bytes(const std::vector<Span>& spans, bool pinning_done = false) const;
  static uvm_status new_block(const Call& call, size_t bytes, bool in_steps, std::shared_ptr<Block>* out);
  static uvm_status free_block(const Call& call, const Block& block);
  void release_locked(uintptr_t begin, uintptr_t end, const EventRef& read);
  static void give_back(Block& block, size_t bytes, const EventRef& read);
  uvm_status free_unused_now(const Call& call);
  // Where a block pinned in steps could be cut: its bytes past the step that holds its bump
  // pointer, 0 for none (still pinning, a step failed, or nothing to cut). Under mutex_.
  static size_t unused_step_bytes(const Block& block);
  // Cuts those steps off every block that has them: the block shrinks under mutex_ (no reservation
  // reaches them after), then, with no lock held, the reads of the block are waited for and the
  // steps unregistered and unmapped. Holding them held pinned memory up to a whole first offload's
  // size after the set offloaded shrank. A failed wait or unregistration leaves the steps mapped
  // (lost to uvm, as they hold no data) and is reported.
  uvm_status trim_steps(const Call& call);

  mutable std::mutex mutex_;
  std::mutex growth_mutex_;  // held across pinning by ensure_capacity only; never with mutex_ waiting on it
  std::vector<std::shared_ptr<Block>> blocks_;
  std::map<uintptr_t, Entry> entries_;  // by begin; disjoint
  int room_claims_ = 0;                  // RoomClaims alive
  bool step_pinning_failed_ = false;     // then growth pins at once
  bool freeing_in_background_ = false;   // a free_unused_in_background thread runs
  std::condition_variable background_done_;
};

// The process-wide staging store (never destroyed: no CUDA calls from static destructors).
Staging& staging();

}  // namespace uvm
