// uvm_block_allocated and uvm_block_freed: the lifetimes of blocks a runtime cuts out of uvm
// allocations and reuses without uvm_free (PyTorch's caching allocator hands a freed tensor's block
// to the next tensor inside a live segment). Staged bytes belong to a block's lifetime, not to an
// address: a new block never receives what was staged for the block before it.
#include <atomic>

#include "blocks.hpp"
#include "devices.hpp"
#include "events.hpp"
#include "moves.hpp"
#include "registry.hpp"
#include "stats.hpp"
#include "vmm.hpp"

namespace uvm {
namespace {

std::atomic<bool> runtime_reports_blocks{false};

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

}  // namespace

uvm_status block_allocated(const Call& call, const void* ptr, size_t size, bool* dropped_pinned) {
  *dropped_pinned = false;
  if (ptr == nullptr || size == 0) return UVM_OK;
  BlockCall block;
  if (uvm_status s = begin_block_call(call, ptr, size, BlockChange::allocated, &block)) return s;
  const BlockState& state = block.state;
  if (!block.ours || (!state.staged && !state.retained && !state.moved && !state.released && !state.last_move)) {
    return UVM_OK;
  }
  if (uvm_status s = wait_for_last_move(call, state)) return s;
  const auto begin = reinterpret_cast<uintptr_t>(ptr), end = begin + size;
  const AllocationView& allocation = state.allocation;
  registry().set_last_move({allocation.base}, nullptr);  // complete: the next block need not wait
  registry().unstage(begin, end, false, dropped_pinned);
  const long long host_delta = registry().record_placement(allocation.base, begin, end, Move::to_device);
  record_host_change(allocation.device, host_delta);
  return state.released ? map_released(call, allocation) : UVM_OK;
}

uvm_status block_freed(const Call& call, const void* ptr, size_t size, bool* dropped_pinned) {
  *dropped_pinned = false;
  if (ptr == nullptr || size == 0) return UVM_OK;
  BlockCall block;
  if (uvm_status s = begin_block_call(call, ptr, size, BlockChange::freed, &block)) return s;
  if (!block.ours || (!block.state.staged && !block.state.retained)) return UVM_OK;
  // The staged bytes had no other copy: they are discarded, as far as anyone can tell. A retained
  // copy was of the block's last owner: it goes too.
  const auto begin = reinterpret_cast<uintptr_t>(ptr), end = begin + size;
  const std::vector<StagedPiece> pieces = registry().staged(begin, end);
  registry().unstage(begin, end, false, dropped_pinned);  // first: the books never show more staged than on the host
  long long host_delta = 0;
  for (const StagedPiece& piece : pieces) {
    host_delta += registry().record_placement(block.state.allocation.base, piece.span.begin, piece.span.end, Move::discarded);
  }
  record_host_change(block.state.allocation.device, host_delta);
  return UVM_OK;
}

bool blocks_are_reported() { return runtime_reports_blocks.load(std::memory_order_relaxed); }

}  // namespace uvm

extern "C" {

uvm_status uvm_report_blocks(int enabled) {
  uvm::runtime_reports_blocks = enabled != 0;
  return UVM_OK;
}

}  // extern "C"
