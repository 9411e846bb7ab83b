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

// Creates an event (no timing) in the current context and records it on `stream`.
uvm_status record_event(const Call& call, cudaStream_t stream, EventRef* out);

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
  // Frees the blocks that hold nothing, after the copies reading them finished.
  uvm_status free_unused(const Call& call);
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
  void release_locked(uintptr_t begin, uintptr_t end, const EventRef& read);
  static void give_back(Block& block, size_t bytes, const EventRef& read);

  mutable std::mutex mutex_;
  std::vector<std::shared_ptr<Block>> blocks_;
  std::map<uintptr_t, Entry> entries_;  // by begin; disjoint
};

// The process-wide staging store (never destroyed: no CUDA calls from static destructors).
Staging& staging();

}  // namespace uvm
