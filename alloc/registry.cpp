#include "registry.hpp"

#include <cuda_runtime_api.h>

#include "devices.hpp"
#include "errors.hpp"

namespace uvm {

void Registry::insert(const void* base, size_t size, int device, TagId tag, Backing backing, uintptr_t slab) {
  std::lock_guard<std::mutex> lock(mutex_);
  entries_[reinterpret_cast<uintptr_t>(base)] = Entry{size, device, tag, backing, slab, false, {}, {}};
}

bool Registry::erase(const void* base, AllocationView* removed, size_t* host_bytes, size_t* discarded_bytes) {
  std::lock_guard<std::mutex> lock(mutex_);
  auto it = entries_.find(reinterpret_cast<uintptr_t>(base));
  if (it == entries_.end()) return false;
  *removed = view_of(it->first, it->second);
  *host_bytes = it->second.host_spans.total();
  *discarded_bytes = it->second.discarded_spans.total();
  entries_.erase(it);
  return true;
}

bool Registry::find(const void* ptr, AllocationView* found) const {
  const auto address = reinterpret_cast<uintptr_t>(ptr);
  std::lock_guard<std::mutex> lock(mutex_);
  auto it = entries_.upper_bound(address);
  if (it == entries_.begin()) return false;
  --it;
  if (address - it->first >= it->second.size) return false;
  *found = view_of(it->first, it->second);
  return true;
}

long long Registry::record_move(uintptr_t base, size_t begin, size_t end, Move move) {
  std::lock_guard<std::mutex> lock(mutex_);
  auto it = entries_.find(base);
  if (it == entries_.end()) return 0;  // freed meanwhile: nothing left to account
  Entry& entry = it->second;
  const size_t host_before = entry.host_spans.total();
  const bool on_host = move == Move::to_host || move == Move::staged;
  if (on_host) entry.host_spans.add(begin, end);
  else entry.host_spans.remove(begin, end);
  if (move == Move::discarded) entry.discarded_spans.add(begin, end);
  else entry.discarded_spans.remove(begin, end);
  return static_cast<long long>(entry.host_spans.total()) - static_cast<long long>(host_before);
}

bool Registry::all_off_device(uintptr_t base) const {
  std::lock_guard<std::mutex> lock(mutex_);
  auto it = entries_.find(base);
  if (it == entries_.end()) return false;
  const Entry& entry = it->second;
  return entry.host_spans.total() + entry.discarded_spans.total() == entry.size;
}

void Registry::set_released(uintptr_t base, bool released) {
  std::lock_guard<std::mutex> lock(mutex_);
  auto it = entries_.find(base);
  if (it != entries_.end()) it->second.released = released;
}

AllocationView Registry::view_of(uintptr_t base, const Entry& entry) {
  return AllocationView{base, entry.size, entry.device, entry.backing, entry.slab};
}

bool Registry::selected(const Entry& entry, int device, bool any_tag, TagId tag) {
  return (device == UVM_ANY_DEVICE || entry.device == device) && (any_tag || entry.tag == tag);
}

std::vector<AllocationView> Registry::select(int device, bool any_tag, TagId tag) const {
  std::lock_guard<std::mutex> lock(mutex_);
  std::vector<AllocationView> found;
  for (const auto& [base, entry] : entries_) {
    if (selected(entry, device, any_tag, tag)) found.push_back(view_of(base, entry));
  }
  return found;
}

uvm_residency Registry::residency(int device, bool any_tag, TagId tag) const {
  std::lock_guard<std::mutex> lock(mutex_);
  uvm_residency total{};
  for (const auto& [base, entry] : entries_) {
    if (!selected(entry, device, any_tag, tag)) continue;
    total.allocations += 1;
    total.live_bytes += entry.size;
    total.host_bytes += entry.host_spans.total();
    total.discarded_bytes += entry.discarded_spans.total();
    if (entry.released) total.released_bytes += entry.size;
  }
  total.device_bytes = total.live_bytes - total.host_bytes - total.discarded_bytes;
  return total;
}

size_t Registry::reclaimable_managed_bytes(int device) const {
  std::lock_guard<std::mutex> lock(mutex_);
  size_t total = 0;
  for (const auto& [base, entry] : entries_) {
    if (entry.device != device || entry.backing != Backing::managed) continue;
    total += entry.host_spans.total() + entry.discarded_spans.total();
  }
  return total;
}

size_t Registry::size() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return entries_.size();
}

Registry& registry() {
  static Registry* instance = new Registry();
  return *instance;
}

bool cuda_reports_managed(const void* ptr) {
  cudaPointerAttributes attributes{};
  if (clear_cuda_error(cudaPointerGetAttributes(&attributes, ptr)) != cudaSuccess) return false;
  return attributes.type == cudaMemoryTypeManaged;
}

namespace {

// The body of uvm_allocation_ranges and uvm_list_allocations: the selected allocations, by address,
// each written to `out` as `describe` makes it.
template <typename Out, typename Describe>
uvm_status list_allocations(const Call& call, int device, const char* tag, Out* out, size_t capacity, size_t* count,
                            Describe describe) {
  if (count == nullptr) return fail(call, UVM_ERROR_INVALID_ARGUMENT, "count is NULL");
  if (out == nullptr && capacity > 0) {
    return fail(call, UVM_ERROR_INVALID_ARGUMENT, "out is NULL but capacity is %zu", capacity);
  }
  if (device != UVM_ANY_DEVICE) {
    if (uvm_status s = check_device(call, device, false)) return s;
  }
  TagId id = kUntagged;
  const bool any_tag = tag == nullptr;
  if (!any_tag && !find_tag(tag, &id)) {
    *count = 0;  // a tag never set: nothing carries it
    return UVM_OK;
  }
  const auto found = registry().select(device, any_tag, id);
  for (size_t i = 0; i < found.size() && i < capacity; ++i) out[i] = describe(found[i]);
  *count = found.size();
  return UVM_OK;
}

}  // namespace
}  // namespace uvm

extern "C" {

int uvm_is_managed(const void* ptr) {
  if (ptr == nullptr) return 0;
  try {
    uvm::AllocationView found;
    if (uvm::registry().find(ptr, &found)) return found.backing == uvm::Backing::managed ? 1 : 0;
    return uvm::cuda_reports_managed(ptr) ? 1 : 0;
  } catch (...) {
    return 0;
  }
}

uvm_status uvm_allocation_info(const void* ptr, void** base, size_t* size, int* device) {
  const uvm::Call call = uvm::Call::of("uvm_allocation_info").with_ptr(ptr);
  return uvm::guarded(call, [&] {
    uvm::AllocationView found;
    if (ptr == nullptr || !uvm::registry().find(ptr, &found)) {
      return uvm::fail(call, UVM_ERROR_NOT_MANAGED, "no live uvm allocation contains this pointer");
    }
    if (base) *base = reinterpret_cast<void*>(found.base);
    if (size) *size = found.size;
    if (device) *device = found.device;
    return UVM_OK;
  });
}

uvm_status uvm_allocation_ranges(int device, const char* tag, uvm_range* out, size_t capacity,
                                 size_t* count) {
  const uvm::Call call = uvm::Call::of("uvm_allocation_ranges").with_selection(device);
  return uvm::guarded(call, [&] {
    return uvm::list_allocations(call, device, tag, out, capacity, count, [](const uvm::AllocationView& a) {
      return uvm_range{reinterpret_cast<const void*>(a.base), a.size};
    });
  });
}

uvm_status uvm_list_allocations(int device, const char* tag, uvm_allocation* out, size_t capacity,
                                size_t* count) {
  const uvm::Call call = uvm::Call::of("uvm_list_allocations").with_selection(device);
  return uvm::guarded(call, [&] {
    return uvm::list_allocations(call, device, tag, out, capacity, count, [](const uvm::AllocationView& a) {
      return uvm_allocation{reinterpret_cast<const void*>(a.base), a.size, a.device,
                            a.backing == uvm::Backing::releasable ? 1 : 0};
    });
  });
}

}  // extern "C"
