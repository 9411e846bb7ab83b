// PyTorch's blocks, reported to uvm: the caching allocator hands a freed tensor's block to the next
// tensor inside a live segment without calling uvm_free, so every block it hands out or takes back
// is passed to uvm_block_allocated / uvm_block_freed (uvm.h, "Blocks"), through the allocator's own
// trace hook, in every pool of the process. Staged bytes then die with the block they were staged
// for.
//
// Built against one torch minor release's c10 headers and libraries: the wheel carries one per
// supported release (setup.py, scripts/torch_headers.py), a source tree builds one against the
// installed torch (_build.py). The shim attaches it, then probes it: while probing it only records
// what it reads off the trace entries, and the shim compares that with a tensor it makes and frees.
// Only a hook that read them right is armed; one that did not stays attached and inert (torch has no
// way to detach a tracker), and the shim says so.
//
// Armed, the hook runs inside the allocator, under its lock, before the block reaches its tensor. A
// block that cannot get memory (a released allocation that cannot be mapped again) is refused with
// an exception, which PyTorch raises as the allocation's error: the tensor is never made, so no
// kernel can touch unmapped memory.
#include <c10/cuda/CUDACachingAllocator.h>

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <mutex>

namespace {

using BlockCall = int (*)(const void* ptr, size_t size);
using LastError = const char* (*)();

std::atomic<BlockCall> block_allocated{nullptr};  // set once, when armed
BlockCall block_freed = nullptr;
LastError last_error = nullptr;

constexpr int kOutOfMemory = 7;  // UVM_ERROR_OUT_OF_MEMORY

// The caching allocator reports the size asked for; its blocks are rounded up to 512 bytes, and a
// tensor's bytes (what the shim moves: torch.py's _block_span) end within that.
constexpr size_t kBlockBytes = 512;
size_t block_bytes(size_t requested) { return (requested + kBlockBytes - 1) / kBlockBytes * kBlockBytes; }

// What the probe saw: the entries read while probing, the last kSeen of them (other threads may
// allocate meanwhile, so the shim looks for its own tensor among them).
constexpr int kActionAlloc = 1, kActionFree = 2;
constexpr size_t kSeen = 64;
struct Seen {
  int action = 0;
  uintptr_t addr = 0;
  size_t size = 0;
};
std::atomic<bool> probing{false};
std::mutex seen_lock;
Seen seen[kSeen];
size_t seen_count = 0;

void record(int action, uintptr_t addr, size_t size) {
  std::lock_guard<std::mutex> hold(seen_lock);
  seen[seen_count % kSeen] = Seen{action, addr, size};
  ++seen_count;
}

// The trace entry's type moved between releases (c10::cuda::CUDACachingAllocator::TraceEntry up to
// 2.10, c10::CachingDeviceAllocator::TraceEntry from 2.11): the hook takes whichever the release's
// tracker type names.
template <typename TraceEntry>
void on_trace(const TraceEntry& entry) {
  using Action = typename TraceEntry::Action;
  const bool alloc = entry.action_ == Action::ALLOC, freed = entry.action_ == Action::FREE_REQUESTED;
  if (!alloc && !freed) return;
  if (probing.load(std::memory_order_acquire)) {
    record(alloc ? kActionAlloc : kActionFree, static_cast<uintptr_t>(entry.addr_), entry.size_);
  }
  const BlockCall allocated = block_allocated.load(std::memory_order_acquire);
  if (allocated == nullptr) return;  // not armed
  const void* ptr = reinterpret_cast<const void*>(entry.addr_);
  if (alloc) {
    const int status = allocated(ptr, block_bytes(entry.size_));
    if (status == kOutOfMemory) {
      TORCH_CHECK_WITH(OutOfMemoryError, false, "uvm: the block at ", ptr, " (", entry.size_,
                       " bytes) lies in released memory that cannot be mapped again: ", last_error());
    }
    TORCH_CHECK(status == 0, "uvm: the block at ", ptr, " (", entry.size_, " bytes) cannot be handed out: ",
                last_error());
  } else {
    (void)block_freed(ptr, block_bytes(entry.size_));  // no CUDA call, and a free cannot fail
  }
}

}  // namespace

#define UVM_HOOK_API extern "C" __attribute__((visibility("default")))

// Attaches the hook, inert, to the device allocators torch has made (call it after
// torch.cuda.init()); later calls do nothing. Returns 0.
UVM_HOOK_API int uvm_torch_blocks_attach() {
  static std::once_flag attached;
  std::call_once(attached, [] {
    c10::cuda::CUDACachingAllocator::attachAllocatorTraceTracker([](const auto& entry) { on_trace(entry); });
  });
  return 0;
}

// Starts (1) or stops (0) recording what the hook reads off ALLOC and FREE_REQUESTED entries;
// starting forgets what was recorded before.
UVM_HOOK_API void uvm_torch_blocks_probe(int on) {
  if (on) {
    std::lock_guard<std::mutex> hold(seen_lock);
    seen_count = 0;
  }
  probing.store(on != 0, std::memory_order_release);
}

// Whether the probe recorded an entry of `action` (1 ALLOC, 2 FREE_REQUESTED) for `addr` with
// `size` bytes asked for: 1 or 0.
UVM_HOOK_API int uvm_torch_blocks_saw(int action, uintptr_t addr, size_t size) {
  std::lock_guard<std::mutex> hold(seen_lock);
  const size_t kept = seen_count < kSeen ? seen_count : kSeen;
  for (size_t i = 0; i < kept; ++i) {
    if (seen[i].action == action && seen[i].addr == addr && seen[i].size == size) return 1;
  }
  return 0;
}

// Arms the attached hook with uvm's entries: from now on every block handed out or taken back, in
// any pool, is reported. Returns 0, or 1 if an entry is missing (nothing armed).
UVM_HOOK_API int uvm_torch_blocks_arm(BlockCall allocated, BlockCall freed, LastError error) {
  if (allocated == nullptr || freed == nullptr || error == nullptr) return 1;
  static std::once_flag armed;
  std::call_once(armed, [&] {
    block_freed = freed;
    last_error = error;
    block_allocated.store(allocated, std::memory_order_release);  // last: it arms the others
  });
  return 0;
}
