// uvm's pinned host staging memory for staged offload: blocks of pinned memory handed out by bump
// allocation, and the map from managed byte ranges to the host bytes that hold their data.
//
// Pinned memory is slow to allocate (1.6–2.2 s for 4 GiB on an H100), so blocks are kept and reused
// across offload/onload cycles. A block's bump pointer rewinds once nothing in it is staged; the
// next writer then waits, on its stream, for every copy that was still reading the block.
#pragma once

#include <cuda_runtime_api.h>

#include <cstddef>
#include <map>
#include <memory>
#include <mutex>
#include <vector>

#include "errors.hpp"
#include "span_set.hpp"

namespace uvm {

// A CUDA event owned by whoever still needs to wait on it; destroyed with its last owner.
struct CudaEvent {
  cudaEvent_t handle = nullptr;
  CudaEvent() = default;
  CudaEvent(const CudaEvent&) = delete;
  CudaEvent& operator=(const CudaEvent&) = delete;
  ~CudaEvent();
};
using EventRef = std::shared_ptr<CudaEvent>;

// Creates an event (no timing) in the current context, not yet recorded.
uvm_status create_event(const Call& call, EventRef* out);

// Creates an event (no timing) in the current context and records it on `stream`.
uvm_status record_event(const Call& call, cudaStream_t stream, EventRef* out);

// An event recorded where the work issued on `stream` so far ends. If none can be created or
// recorded, waits for the stream instead and gives null ("already complete"), recording no error;
// fails only if that wait fails.
uvm_status mark_or_wait(const Call& call, cudaStream_t stream, EventRef* out);

// A staged piece of managed memory: its bytes are at `host` once `written` has completed.
struct StagedPiece {
  Span span;
  char* host = nullptr;
  EventRef written;
};

class Staging {
 public:
  // Host bytes for each span (same order), adding one pinned block if the free tails of the
  // existing ones are too small. Fills `wait_for` with the reads the writer must wait for.
  uvm_status reserve(const Call& call, const std::vector<Span>& spans, std::vector<char*>* hosts,
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
  // Forgets everything uvm knew about [begin, end): what is staged there and the last move of any
  // allocation starting there. uvm_free and uvm_malloc call it, so no host copy outlives its memory.
  void forget(uintptr_t begin, uintptr_t end);
  // Allocates, without holding any lock, the pinned block a reserve() of `spans` would have to add,
  // so that cudaHostAlloc (1.6–2.3 s for 4 GiB on an H200) blocks no other uvm call.
  // Growers take turns (growth_mutex_), so that an offload waiting for a reservation in progress
  // uses its block instead of allocating one of its own.
  uvm_status ensure_capacity(const Call& call, const std::vector<Span>& spans);
  // Frees the blocks that hold nothing, after the copies reading them finished.
  uvm_status free_unused(const Call& call);
  // The events that the last move of each allocation (by base) ends with, without duplicates;
  // a move issued on another stream must wait for them before touching the same bytes.
  std::vector<EventRef> last_moves(const std::vector<uintptr_t>& allocations) const;
  // Sets the last move of each allocation; a null event means it has completed.
  void set_last_move(const std::vector<uintptr_t>& allocations, const EventRef& done);
  size_t capacity_bytes() const;
  size_t staged_bytes() const;

 private:
  struct Block {
    char* host = nullptr;
    size_t capacity = 0;
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
  size_t unplaced_bytes(const std::vector<Span>& spans) const;
  static uvm_status new_block(const Call& call, size_t bytes, std::shared_ptr<Block>* out);
  void release_locked(uintptr_t begin, uintptr_t end, const EventRef& read);
  static void give_back(Block& block, size_t bytes, const EventRef& read);

  mutable std::mutex mutex_;
  std::mutex growth_mutex_;  // held across cudaHostAlloc by ensure_capacity only; never with mutex_ waiting on it
  std::vector<std::shared_ptr<Block>> blocks_;
  std::map<uintptr_t, Entry> entries_;  // by begin; disjoint
  std::map<uintptr_t, EventRef> last_move_;  // by allocation base
};

// The process-wide staging store (never destroyed: no CUDA calls from static destructors).
Staging& staging();

// Held by offload, onload, discard, release_staging and by uvm_free while it forgets an allocation,
// so that each sees the registry and the staging store as one consistent state: an offload cannot
// stage bytes of an allocation being freed, and two moves of the same bytes never interleave on the
// host. Never held across cudaHostAlloc in the common case (Staging::ensure_capacity runs first)
// nor across cudaFree.
std::unique_lock<std::mutex> lock_moves();

}  // namespace uvm
