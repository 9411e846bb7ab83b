// uvm's pinned host staging memory for staged offload: blocks of pinned memory whose bytes are lent
// by bump allocation. What is staged where is not kept here but in each allocation's record
// (alloc/registry.hpp): a staged piece holds a lease on the host bytes it lives in, and the bytes
// go back to their block when the last piece holding the lease is dropped (onloaded, discarded,
// freed, or its block handed to a new owner).
//
// Pinned memory is slow to allocate, even the way pinned.hpp does it (docs/performance.md, "The
// driver behaviour behind the design"), so blocks are kept and reused across offload/onload cycles, and an
// offload's new block is pinned in steps that its copies use as each is done. A block's bump
// pointer rewinds once no lease on it is held; the next writer then waits, on its stream, for every
// copy that may still use the block (copies into it that were still running when their pieces were
// dropped, and copies out of it).
#pragma once

#include <cuda_runtime_api.h>

#include <condition_variable>
#include <cstddef>
#include <memory>
#include <mutex>
#include <vector>

#include "../../alloc/errors.hpp"
#include "../../alloc/events.hpp"
#include "../../alloc/span_set.hpp"
#include "pinned.hpp"

namespace uvm {

// A block being pinned in steps that a reservation reached into, up to `through` bytes from its
// start: once the copies into them are issued (note_copies_issued), its next step may register.
struct StepsTaken {
  std::shared_ptr<StepPinning> pinning;
  size_t through;
};

// Host bytes reserved for an offload's staged pieces.
struct Reservation {
  std::vector<Span> spans;                    // the pieces placed, in order
  std::vector<std::shared_ptr<char>> leases;  // a lease on each one's host bytes, at leases[i].get()
  std::vector<EventRef> reused;               // copies still using those bytes: the writer waits for them
  std::vector<StepsTaken> steps_taken;        // blocks pinned in steps that the pieces reach into (a
                                              // pinning that has ended ignores what it is told)
};

class Staging {
 public:
  // Host bytes for the longest leading run of `spans` that fits in memory already pinned (a block
  // being pinned in steps offers its steps done). In a block pinned in steps a span is cut where a
  // step ends, since one copy may not cross two registrations (cudaErrorInvalidValue),
  // so the reservation may hold a span's first parts. Dropping a lease that was never staged gives
  // its bytes back.
  Reservation reserve_prefix(const std::vector<Span>& spans);
  // Whether every span fits in the blocks held, counting a block being pinned at its full size:
  // else ensure_capacity would add a block.
  bool has_room(const std::vector<Span>& spans) const;
  // The bytes at `hosts` are used by GPU work that ends with `use` (a copy into them or out of
  // them): the blocks holding them are not handed out again before it completes.
  void note_use(const std::vector<const char*>& hosts, const EventRef& use);
  // Allocates, without holding any lock, the pinned block a reservation of `spans` would have to add,
  // so that pinning memory (seconds for many GiB) blocks no other uvm call.
  // Growers take turns (growth_mutex_), so that an offload waiting for a reservation in progress
  // uses its block instead of allocating one of its own.
  // With `in_steps` (an offload: the copies into the first steps overlap the pinning of the rest),
  // a new block of the registered kind is pinned in steps on a thread of its own and this returns
  // at once; after one such pinning failed, growth pins at once again (cudaHostAlloc fallback).
  // A block still being pinned counts at its full size. A block that must be added anyway is made
  // `ahead` bytes bigger (a group of moves expects more). A block pinned in steps is paced
  // (StepPinning): `paced` receives its pinning, whose pacing the offload ends when it takes no
  // more of its steps.
  // `added` (may be null): the bytes of the block it added, 0 for none.
  uvm_status ensure_capacity(const Call& call, const std::vector<Span>& spans, bool in_steps = false,
                             size_t ahead = 0, std::shared_ptr<StepPinning>* paced = nullptr, size_t* added = nullptr);
  // Waits, holding no lock, until a block being pinned in steps pins more or stops; false at once
  // if none is being pinned.
  bool wait_for_pinning();
  // Frees the blocks that hold nothing, after the copies reading them finished, and the steps of a
  // block pinned in steps past the last one its bump pointer reaches (trim_steps). A block that holds
  // nothing and is still being pinned in steps stays (freeing it would wait for its pinning). The blocks leave
  // the store first, so no lock is held while it waits and frees (unpinning GiBs takes
  // hundreds of ms); a block whose wait fails goes back, and the next call tries again. Frees
  // nothing while an offload holds a RoomClaim. Returns once a free in the background has ended too.
  uvm_status free_unused(const Call& call);
  // Keeps what is held near what is staged: after an offload, blocks that hold nothing (the set
  // offloaded shrank, so fewer blocks hold it) and the unused steps of a block bigger than the set
  // it now holds are freed on a thread of their own, since unpinning GiBs takes hundreds of ms.
  // Starts nothing when there is nothing to free; while a thread runs, it frees once more.
  // uvm_release_staging_async is this.
  void free_unused_in_background();
  // uvm_release_staging: the blocks that hold nothing and are still being pinned in steps (a
  // uvm_prepare_pause's, or the rest of a block an offload pinned more of than it used) stop after
  // the step in flight. Returns at once, with their pinnings, for a caller to wait for their end.
  std::vector<std::shared_ptr<StepPinning>> stop_unused_pinnings();
  // How many times free_unused_in_background found something to free (started a thread, or asked
  // the running one to free again): tests check that a call asked for none, without waiting to see.
  uint64_t background_frees_asked() const;
  // Returns once no free in the background runs (it frees nothing itself).
  void wait_for_background_free();

  // Held by an offload from making room (ensure_capacity) until it has reserved it: the room is
  // not freed under it. Without it a release_staging loop on another thread took the room every
  // time before the offload reserved it, and the offload never finished.
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
  // The held memory by kind (uvm_get_staging_info), but for staged_bytes (the registry has them).
  uvm_staging_info info() const;
  // Whether [host, host + bytes) lies in one block and, for a block pinned in steps, one step: one
  // copy may then reach all of it (a copy across two host registrations fails).
  bool one_registration(const char* host, size_t bytes) const;

 private:
  struct Block {
    PinnedMemory memory;  // how it was pinned, and how far a pinning in steps has come
    size_t used = 0;  // bump pointer
    size_t live = 0;  // bytes lent and not given back
    int device = 0;   // current when it was allocated; freed in that device's context
    std::vector<EventRef> reads;  // copies into or out of this block that may still run
  };
  std::shared_ptr<Block> block_holding(const char* host) const;
  // The bytes of `spans` no block can take (first fit); `pinning_done` counts blocks being pinned
  // at their full size instead of their steps done.
  size_t unplaced_bytes(const std::vector<Span>& spans, bool pinning_done = false) const;
  static uvm_status new_block(const Call& call, size_t bytes, bool in_steps, std::shared_ptr<Block>* out);
  // Frees an unused block; on failure the block holds what is left, for the next try.
  static uvm_status free_block(const Call& call, Block& block);
  // A lease on [host, host + bytes) of `block`: the bytes count as lent until it is dropped.
  std::shared_ptr<char> lend(const std::shared_ptr<Block>& block, char* host, size_t bytes);
  uvm_status free_unused_now(const Call& call);
  // Whether `block` is being pinned in steps still. Under mutex_ or not: it reads the pinning's own state.
  static bool still_pinning(const Block& block);
  // Where a block pinned in steps could be cut: its bytes past the step that holds its bump
  // pointer, 0 for none (still pinning, a step failed, or nothing to cut). Under mutex_.
  static size_t unused_step_bytes(const Block& block);
  // Cuts those steps off every block that has them: the block shrinks under mutex_ (no reservation
  // reaches them after), then, with no lock held, the reads of the block are waited for and the
  // steps unregistered and unmapped. Holding them held pinned memory up to a whole first offload's
  // size after the set offloaded shrank. A failed wait or unregistration is reported, and the steps
  // not given back become a block of their own (keep_as_block): counted, usable, and freed with the
  // next unused blocks.
  uvm_status trim_steps(const Call& call);
  // Adopts pinned steps [host, host + bytes) that could not be given back as an unused block.
  void keep_as_block(char* host, size_t bytes, int device, std::vector<EventRef> reads);

  mutable std::mutex mutex_;
  std::mutex growth_mutex_;  // held across pinning by ensure_capacity only; never with mutex_ waiting on it
  std::vector<std::shared_ptr<Block>> blocks_;
  int room_claims_ = 0;                  // RoomClaims alive
  bool step_pinning_failed_ = false;     // then growth pins at once
  bool freeing_in_background_ = false;   // a free_unused_in_background thread runs
  bool free_again_ = false;              // asked again while it ran: it frees once more
  uint64_t background_frees_asked_ = 0;
  std::condition_variable background_done_;
};

// The process-wide staging store (never destroyed: no CUDA calls from static destructors).
Staging& staging();

// uvm_release_staging was called: a uvm_prepare_pause in progress stops after its batch (prepare.cpp).
void note_staging_released();

}  // namespace uvm
