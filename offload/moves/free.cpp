// The entries through which memory goes back — an allocation (uvm_free; uvm_malloc is in
// alloc/malloc.cpp) or a block a runtime takes back or hands to a new owner (uvm_block_freed,
// uvm_block_allocated: staged bytes belong to a block's lifetime, not to an address, so a new block
// never receives what was staged for the block before it) — and with it the host copies of its
// bytes. Pinned staging memory they leave holding nothing goes back to the host at once, as the
// memory itself goes back to the driver (or to its new owner): a model freed while paused, or after
// a resume that retained its copies, leaves no pinned memory behind. Copies that end by being copied
// back keep theirs for the next cycle (uvm_release_staging gives it back).
#include "../../alloc/devices.hpp"
#include "../../alloc/events.hpp"
#include "../../alloc/malloc.hpp"
#include "../../alloc/moves.hpp"
#include "../../alloc/registry.hpp"
#include "../../alloc/stats.hpp"
#include "../../alloc/vmm.hpp"
#include "../media/copies.hpp"
#include "../media/staging.hpp"

namespace uvm {
namespace {

uvm_status check_block(const Call& call, const void* ptr, size_t size, const BlockState& state) {
  const auto begin = reinterpret_cast<uintptr_t>(ptr);
  const AllocationView& allocation = state.allocation;
  if (size > allocation.base + allocation.size - begin) {
    return fail(call, UVM_ERROR_INVALID_ARGUMENT,
                "the block ends %zu bytes past the end of its uvm allocation (%p, %zu bytes)",
                static_cast<size_t>(begin + size - allocation.base - allocation.size),
                reinterpret_cast<void*>(allocation.base), allocation.size);
  }
  return UVM_OK;
}

// Waits on the host for the allocation's last move, so that no copy or discard of the block's
// earlier owner lands on what its new owner writes (the runtime gives no stream to order on). A
// capture on this thread's stream stays valid: the wait touches only uvm's event.
uvm_status wait_for_last_move(const Call& call, const BlockState& state) {
  if (!state.last_move) return UVM_OK;
  const RelaxedCapture relaxed;
  if (cudaError_t e = cudaEventSynchronize(state.last_move->handle)) {
    return fail_cuda(call, e, "cudaEventSynchronize (the last move of the allocation at %p)",
                     reinterpret_cast<void*>(state.allocation.base));
  }
  return UVM_OK;
}

// Maps physical memory again under a released allocation, in its device's context.
uvm_status map_released(const Call& call, const AllocationView& allocation) {
  Mapping mapping;
  if (!registry().mapping(allocation.base, &mapping) || mapping.mapped) return UVM_OK;
  ContextScope scope;
  if (uvm_status s = scope.enter(call, allocation.device, ContextScope::When::always)) return s;
  const RelaxedCapture relaxed;
  const uvm_status status = vmm_map(call, allocation.base, allocation.device, &mapping);
  registry().set_mapping(allocation.base, mapping);
  return status;
}

// A block call on uvm's memory, from its preamble on: the block's state once `change` is recorded,
// under the moves lock. Both calls take it, so that a block handed out while a move of its
// allocation is being issued on another thread comes after it, and then waits for that move (a
// pool offloaded while a tensor is made in it either stages the tensor or does not touch it).
struct BlockCall {
  bool ours = false;  // uvm's memory, still allocated once the lock was had
  BlockState state;
  std::unique_lock<std::mutex> moves;
};

uvm_status begin_block_call(const Call& call, const void* ptr, size_t size, BlockChange change, BlockCall* out) {
  const auto begin = reinterpret_cast<uintptr_t>(ptr), end = begin + size;
  if (!registry().block_state(begin, end, &out->state)) return UVM_OK;  // not uvm's memory: nothing to do
  if (uvm_status s = check_block(call, ptr, size, out->state)) return s;
  out->moves = lock_moves();
  out->ours = registry().block_state(begin, end, &out->state, change);  // false: freed meanwhile
  return UVM_OK;
}

// A block [ptr, ptr + size) handed out by the runtime: what uvm kept of the bytes' earlier owner
// goes. `dropped_pinned`: a copy of them in pinned staging memory went.
uvm_status block_allocated(const Call& call, const void* ptr, size_t size, bool* dropped_pinned) {
  *dropped_pinned = false;
  if (ptr == nullptr || size == 0) return UVM_OK;
  BlockCall block;
  if (uvm_status s = begin_block_call(call, ptr, size, BlockChange::allocated, &block)) return s;
  const BlockState& state = block.state;
  if (!block.ours || (!state.copied && !state.moved && !state.released && !state.last_move)) {
    return UVM_OK;
  }
  if (uvm_status s = wait_for_last_move(call, state)) return s;
  const auto begin = reinterpret_cast<uintptr_t>(ptr), end = begin + size;
  const AllocationView& allocation = state.allocation;
  registry().set_last_move({allocation.base}, nullptr);  // complete: the next block need not wait
  unstage_copies(begin, end, false, dropped_pinned);
  const long long host_delta = registry().record_placement(allocation.base, begin, end, Move::to_device);
  record_host_change(allocation.device, host_delta);
  return state.released ? map_released(call, allocation) : UVM_OK;
}

// A block taken back by the runtime: its staged bytes had no other copy, so they are discarded.
uvm_status block_freed(const Call& call, const void* ptr, size_t size, bool* dropped_pinned) {
  *dropped_pinned = false;
  if (ptr == nullptr || size == 0) return UVM_OK;
  BlockCall block;
  if (uvm_status s = begin_block_call(call, ptr, size, BlockChange::freed, &block)) return s;
  if (!block.ours || !block.state.copied) return UVM_OK;
  // The staged bytes had no other copy: they are discarded, as far as anyone can tell. A retained
  // copy was of the block's last owner: it goes too.
  const auto begin = reinterpret_cast<uintptr_t>(ptr), end = begin + size;
  const std::vector<StagedPiece> pieces = staged_copies(begin, end);
  unstage_copies(begin, end, false, dropped_pinned);  // first: the books never show more staged than on the host
  long long host_delta = 0;
  for (const StagedPiece& piece : pieces) {
    host_delta += registry().record_placement(block.state.allocation.base, piece.span.begin, piece.span.end, Move::discarded);
  }
  record_host_change(block.state.allocation.device, host_delta);
  return UVM_OK;
}

uvm_status free_with_copies(const Call& call, void* ptr, size_t size, int device) {
  std::optional<Allocation> freed;
  bool exiting = false;
  const uvm_status status = free_allocation(call, ptr, size, device, &freed, &exiting);
  const bool held_pinned = freed && holds_pinned_copy(*freed);
  freed.reset();  // its leases on staging memory end here
  if (status != UVM_OK || !held_pinned || exiting) return status;
  return staging().free_unused(call);
}

// A block call, then the staging memory of the pinned copies it dropped.
template <typename Body>
uvm_status block_with_copies(const Call& call, const void* ptr, size_t size, Body body) {
  bool dropped_pinned = false;
  if (uvm_status s = body(call, ptr, size, &dropped_pinned)) return s;
  return dropped_pinned ? staging().free_unused(call) : UVM_OK;
}

}  // namespace
}  // namespace uvm

extern "C" {

void uvm_free(void* ptr, size_t size, int device, cudaStream_t /*stream*/) {
  if (ptr == nullptr) return;
  const uvm::Call call = uvm::Call::of("uvm_free").with_ptr(ptr).with_size(size).with_device(device);
  (void)uvm::guarded(call, [&] { return uvm::free_with_copies(call, ptr, size, device); });
}

uvm_status uvm_block_allocated(const void* ptr, size_t size) {
  const uvm::Call call = uvm::Call::of("uvm_block_allocated").with_ptr(ptr).with_size(size);
  return uvm::guarded(call, [&] { return uvm::block_with_copies(call, ptr, size, uvm::block_allocated); });
}

uvm_status uvm_block_freed(const void* ptr, size_t size) {
  const uvm::Call call = uvm::Call::of("uvm_block_freed").with_ptr(ptr).with_size(size);
  return uvm::guarded(call, [&] { return uvm::block_with_copies(call, ptr, size, uvm::block_freed); });
}

}  // extern "C"
