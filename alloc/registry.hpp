// The registry of live uvm allocations: base → size, device and the bytes last moved to the host.
#pragma once

#include <cstddef>
#include <cstdint>
#include <map>
#include <mutex>

#include "span_set.hpp"

namespace uvm {

struct AllocationView {
  uintptr_t base = 0;
  size_t size = 0;
  int device = 0;
};

enum class Move { to_device, to_host, discarded };

class Registry {
 public:
  void insert(const void* base, size_t size, int device);
  // Removes the allocation that starts at `base`; fills `removed` and the bytes it had on the host.
  bool erase(const void* base, AllocationView* removed, size_t* host_bytes);
  // The allocation holding byte `ptr`, if any.
  bool find(const void* ptr, AllocationView* found) const;
  // Records that [begin, end) of the allocation at `base` moved; returns the signed change in its
  // host-resident bytes.
  long long record_move(uintptr_t base, size_t begin, size_t end, Move move);
  size_t size() const;

 private:
  struct Entry {
    size_t size;
    int device;
    SpanSet host_spans;
  };
  mutable std::mutex mutex_;
  std::map<uintptr_t, Entry> entries_;
};

// The process-wide registry (never destroyed: frees may arrive from static destructors at exit).
Registry& registry();

// True if CUDA reports `ptr` as managed memory (any allocator). Leaves no CUDA error pending.
bool cuda_reports_managed(const void* ptr);

}  // namespace uvm
