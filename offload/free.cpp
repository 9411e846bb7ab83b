// The entries through which memory goes back — an allocation (uvm_free) or a block a runtime takes
// back or hands to a new owner (uvm_block_freed, uvm_block_allocated) — and with it the host copies
// of its bytes. Pinned staging memory they leave holding nothing goes back to the host at once, as
// the memory itself goes back to the driver (or to its new owner): a model freed while paused, or
// after a resume that retained its copies, leaves no pinned memory behind. Copies that end by being
// copied back keep theirs for the next cycle (uvm_release_staging gives it back).
#include "../alloc/blocks.hpp"
#include "../alloc/malloc.hpp"
#include "staging.hpp"

namespace uvm {
namespace {

uvm_status free_with_copies(const Call& call, void* ptr, size_t size, int device) {
  std::optional<Allocation> freed;
  bool exiting = false;
  const uvm_status status = free_allocation(call, ptr, size, device, &freed, &exiting);
  const bool held_pinned = freed && freed->holds_pinned_copy();
  freed.reset();  // its leases on staging memory end here
  if (status != UVM_OK || !held_pinned || exiting) return status;
  return staging().free_unused(call);
}

// A block call, then the staging memory of the pinned copies it dropped.
template <typename BlockCall>
uvm_status block_with_copies(const Call& call, const void* ptr, size_t size, BlockCall block_call) {
  bool dropped_pinned = false;
  if (uvm_status s = block_call(call, ptr, size, &dropped_pinned)) return s;
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
