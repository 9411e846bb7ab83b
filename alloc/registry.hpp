// The registry of live uvm allocations: base → size, device, tag, and where uvm last moved each
// byte (to the host or discarded). Which host bytes hold a staged copy is the staging store's to
// say (offload/staging.hpp), the one record of it.
#pragma once

#include <cstddef>
#include <cstdint>
#include <map>
#include <mutex>
#include <vector>

#include "span_set.hpp"
#include "tags.hpp"
#include "uvm.h"

namespace uvm {

// managed: cudaMallocManaged (uvm_malloc). releasable: device memory mapped through CUDA virtual
// memory management (uvm_malloc_releasable), whose physical memory uvm returns to the driver once
// all of its bytes are off the device (alloc/vmm.hpp).
enum class Backing : uint8_t { managed, releasable };

struct AllocationView {
  uintptr_t base = 0;
  size_t size = 0;
  int device = 0;
  Backing backing = Backing::managed;
  uintptr_t slab = 0;  // the slab holding it (alloc/slabs.hpp), 0 if it is a driver allocation of its own
  // The driver allocation holding it: where one prefetch or copy may reach.
  uintptr_t memory() const { return slab != 0 ? slab : base; }
};

// to_host: migrated to the CPU. staged: copied to pinned staging and discarded on the device
// (host-resident, like to_host). discarded: no copy kept. to_device: back where it was allocated.
enum class Move { to_device, to_host, staged, discarded };

class Registry {
 public:
  void insert(const void* base, size_t size, int device, TagId tag, Backing backing, uintptr_t slab = 0);
  // Removes the allocation that starts at `base`; fills `removed`, the bytes it had on the host
  // (staged included) and those it had discarded.
  bool erase(const void* base, AllocationView* removed, size_t* host_bytes, size_t* discarded_bytes);
  // The allocation holding byte `ptr`, if any.
  bool find(const void* ptr, AllocationView* found) const;
  // Records that [begin, end) of the allocation at `base` moved; returns the signed change in its
  // host-resident bytes.
  long long record_move(uintptr_t base, size_t begin, size_t end, Move move);
  // True if uvm moved every byte of the allocation at `base` off its device (offloaded, staged or
  // discarded): its device copy holds nothing anyone asked to keep.
  bool all_off_device(uintptr_t base) const;
  // Marks whether the physical memory of the releasable allocation at `base` was given back.
  void set_released(uintptr_t base, bool released);
  // Allocations of `device` (UVM_ANY_DEVICE: all) with `tag`; any_tag ignores the tag.
  std::vector<AllocationView> select(int device, bool any_tag, TagId tag) const;
  // Bytes of managed allocations on `device` that uvm moved off it (to the host, staged or
  // discarded): the driver reclaims them when someone allocates.
  size_t reclaimable_managed_bytes(int device) const;
  // Residency totals over the same selection, but for staged_bytes (the staging store has them).
  uvm_residency residency(int device, bool any_tag, TagId tag) const;
  size_t size() const;

 private:
  struct Entry {
    size_t size;
    int device;
    TagId tag;
    Backing backing;
    uintptr_t slab;
    bool released;            // releasable only: its physical memory is given back
    SpanSet host_spans;       // includes the staged ones
    SpanSet discarded_spans;
  };
  static bool selected(const Entry& entry, int device, bool any_tag, TagId tag);
  static AllocationView view_of(uintptr_t base, const Entry& entry);
  mutable std::mutex mutex_;
  std::map<uintptr_t, Entry> entries_;
};

// The process-wide registry (never destroyed: frees may arrive from static destructors at exit).
Registry& registry();

// True if CUDA reports `ptr` as managed memory (any allocator). Leaves no CUDA error pending.
bool cuda_reports_managed(const void* ptr);

}  // namespace uvm
