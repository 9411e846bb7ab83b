// PyTorch's blocks, reported to uvm: the caching allocator hands a freed tensor's block to the next
// tensor inside a live segment without calling uvm_free, so every block it hands out or takes back
// is passed to uvm_block_allocated / uvm_block_freed (uvm.h, "Blocks"), through the allocator's own
// trace hook, in every pool of the process. Staged bytes then die with the block they were staged
// for. Compiled by the shim against the installed torch's headers (_build.py) and loaded once.
//
// The hook runs inside the allocator, under its lock, before the block reaches its tensor. A block
// that cannot get memory (a released allocation that cannot be mapped again) is refused with an
// exception, which PyTorch raises as the allocation's error: the tensor is never made, so no kernel
// can touch unmapped memory.
#include <c10/cuda/CUDACachingAllocator.h>

#include <cstddef>
#include <mutex>
#include <string>

namespace {

using BlockCall = int (*)(const void* ptr, size_t size);
using LastError = const char* (*)();

BlockCall block_allocated = nullptr;
BlockCall block_freed = nullptr;
LastError last_error = nullptr;

constexpr int kOutOfMemory = 7;  // UVM_ERROR_OUT_OF_MEMORY

// The caching allocator reports the size asked for; its blocks are rounded up to 512 bytes, and a
// tensor's bytes (what the shim moves: torch.py's _block_span) end within that.
constexpr size_t kBlockBytes = 512;
size_t block_bytes(size_t requested) { return (requested + kBlockBytes - 1) / kBlockBytes * kBlockBytes; }

void on_trace(const c10::CachingDeviceAllocator::TraceEntry& entry) {
  using Action = c10::CachingDeviceAllocator::TraceEntry::Action;
  const void* ptr = reinterpret_cast<const void*>(entry.addr_);
  if (entry.action_ == Action::ALLOC) {
    const int status = block_allocated(ptr, block_bytes(entry.size_));
    if (status == kOutOfMemory) {
      TORCH_CHECK_WITH(OutOfMemoryError, false, "uvm: the block at ", ptr, " (", entry.size_,
                       " bytes) lies in released memory that cannot be mapped again: ", last_error());
    }
    TORCH_CHECK(status == 0, "uvm: the block at ", ptr, " (", entry.size_, " bytes) cannot be handed out: ",
                last_error());
  } else if (entry.action_ == Action::FREE_REQUESTED) {
    (void)block_freed(ptr, block_bytes(entry.size_));  // no CUDA call, and a free cannot fail
  }
}

}  // namespace

// Attaches the hook once per process, to the device allocators torch has made (call it after
// torch.cuda.init()). Returns 0, or 1 if the arguments are missing.
extern "C" __attribute__((visibility("default"))) int uvm_torch_watch_blocks(BlockCall allocated, BlockCall freed,
                                                                              LastError error) {
  if (allocated == nullptr || freed == nullptr || error == nullptr) return 1;
  static std::once_flag attached;
  std::call_once(attached, [&] {
    block_allocated = allocated;
    block_freed = freed;
    last_error = error;
    c10::cuda::CUDACachingAllocator::attachAllocatorTraceTracker(on_trace);
  });
  return 0;
}
