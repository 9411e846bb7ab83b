#include "registry.hpp"

#include <cuda_runtime_api.h>

#include <algorithm>
#include <set>
#include <thread>

#include "devices.hpp"
#include "errors.hpp"

namespace uvm {

void Registry::insert(uintptr_t base, Allocation allocation) {
  std::lock_guard<std::mutex> lock(mutex_);
  allocations_[base] = std::move(allocation);
}

bool Registry::lock_is_free_for_test() const {
  bool free = false;
  std::thread([&] {
    free = mutex_.try_lock();
    if (free) mutex_.unlock();
  }).join();
  return free;
}

std::optional<Allocation> Registry::erase(uintptr_t base) {
  std::lock_guard<std::mutex> lock(mutex_);
  auto it = allocations_.find(base);
  if (it == allocations_.end()) return std::nullopt;
  std::optional<Allocation> removed(std::move(it->second));
  allocations_.erase(it);
  return removed;
}

bool Registry::find(const void* ptr, AllocationView* found) const {
  const auto address = reinterpret_cast<uintptr_t>(ptr);
  std::lock_guard<std::mutex> lock(mutex_);
  auto it = allocations_.upper_bound(address);
  if (it == allocations_.begin()) return false;
  --it;
  if (address - it->first >= it->second.size) return false;
  *found = view_of(it->first, it->second);
  return true;
}

long long Registry::record_placement(uintptr_t base, uintptr_t begin, uintptr_t end, Move move) {
  std::lock_guard<std::mutex> lock(mutex_);
  auto it = allocations_.find(base);
  if (it == allocations_.end()) return 0;  // freed meanwhile: nothing left to account
  Allocation& allocation = it->second;
  const size_t from = begin - base, to = end - base;
  const size_t host_before = allocation.host.total();
  if (move == Move::to_host || move == Move::staged) allocation.host.add(from, to);
  else allocation.host.remove(from, to);
  if (move == Move::discarded) allocation.discarded.add(from, to);
  else allocation.discarded.remove(from, to);
  return static_cast<long long>(allocation.host.total()) - static_cast<long long>(host_before);
}

bool Registry::all_off_device(uintptr_t base) const {
  std::lock_guard<std::mutex> lock(mutex_);
  auto it = allocations_.find(base);
  if (it == allocations_.end()) return false;
  const Allocation& allocation = it->second;
  return allocation.host.total() + allocation.discarded.total() == allocation.size;
}

void Registry::mark_discarded(uintptr_t base, uintptr_t begin, uintptr_t end) {
  std::lock_guard<std::mutex> lock(mutex_);
  auto it = allocations_.find(base);
  if (it != allocations_.end()) it->second.marked.add(begin - base, end - base);
}

std::vector<Span> Registry::marked(uintptr_t base, uintptr_t begin, uintptr_t end) const {
  std::lock_guard<std::mutex> lock(mutex_);
  std::vector<Span> found;
  auto it = allocations_.find(base);
  if (it == allocations_.end()) return found;
  for (const auto& [from, to] : it->second.marked.spans()) {
    const uintptr_t b = std::max(begin, base + from), e = std::min(end, base + to);
    if (b < e) found.push_back(Span{b, e});
  }
  return found;
}

void Registry::unmark(uintptr_t base, uintptr_t begin, uintptr_t end) {
  std::lock_guard<std::mutex> lock(mutex_);
  auto it = allocations_.find(base);
  if (it != allocations_.end()) it->second.marked.remove(begin - base, end - base);
}

Allocation* Registry::Records::holding(uintptr_t address) {
  auto it = all_.upper_bound(address);
  if (it == all_.begin()) return nullptr;
  --it;
  return address - it->first < it->second.size ? &it->second : nullptr;
}

void Registry::forget(uintptr_t begin, uintptr_t end) {
  std::vector<std::unique_ptr<RoomPart>> forgotten;  // destroyed after the lock (RoomPart::forget)
  std::lock_guard<std::mutex> lock(mutex_);
  Records(allocations_).each_overlapping(begin, end, [&](Allocation& allocation) {
    if (!allocation.offload) return;
    if (std::unique_ptr<RoomPart> gone = allocation.offload->forget(begin, end)) forgotten.push_back(std::move(gone));
  });
}

std::vector<EventRef> Registry::last_move_events(const std::vector<uintptr_t>& bases) const {
  std::lock_guard<std::mutex> lock(mutex_);
  std::vector<EventRef> events;
  for (uintptr_t base : bases) {
    auto it = allocations_.find(base);
    if (it == allocations_.end() || !it->second.last_move) continue;
    if (std::find(events.begin(), events.end(), it->second.last_move) == events.end()) {
      events.push_back(it->second.last_move);  // one event often ends the moves of many allocations
    }
  }
  return events;
}

void Registry::set_last_move(const std::vector<uintptr_t>& bases, const EventRef& done) {
  std::lock_guard<std::mutex> lock(mutex_);
  for (uintptr_t base : bases) {
    auto it = allocations_.find(base);
    if (it != allocations_.end()) it->second.last_move = done;
  }
}

void Registry::set_paused(const std::vector<uintptr_t>& bases, bool paused) {
  std::lock_guard<std::mutex> lock(mutex_);
  for (uintptr_t base : bases) {
    auto it = allocations_.find(base);
    if (it != allocations_.end()) it->second.paused = paused;
  }
}

void Registry::set_tag(uintptr_t base, TagId tag) {
  std::lock_guard<std::mutex> lock(mutex_);
  auto it = allocations_.find(base);
  if (it != allocations_.end()) it->second.tag = tag;
}

size_t Registry::set_backup(const Selection& selection, uvm_backup backup, bool compressed) {
  std::lock_guard<std::mutex> lock(mutex_);
  size_t changed = 0;
  for (auto& [base, allocation] : allocations_) {
    if (!selection.includes(allocation)) continue;
    allocation.backup = backup;
    allocation.compressed = compressed;
    ++changed;
  }
  return changed;
}

bool Registry::block_state(uintptr_t begin, uintptr_t end, BlockState* out, BlockChange change) {
  std::lock_guard<std::mutex> lock(mutex_);
  auto it = allocations_.upper_bound(begin);
  if (it == allocations_.begin()) return false;
  --it;
  Allocation& allocation = it->second;
  if (begin - it->first >= allocation.size) return false;
  out->allocation = view_of(it->first, allocation);
  const size_t from = begin - it->first, to = std::min<size_t>(end - it->first, allocation.size);
  if (change != BlockChange::none && allocation.reported_runtime) {
    allocation.blocks_reported = true;
    if (change == BlockChange::allocated) allocation.blocks.add(from, to);
    else allocation.blocks.remove(from, to);
  }
  out->on_host = allocation.host.overlaps(from, to);
  out->moved = out->on_host || allocation.discarded.overlaps(from, to);
  out->copied = allocation.offload && allocation.offload->keeps(begin, end);
  out->released = allocation.released();
  out->last_move = allocation.last_move;
  return true;
}

std::vector<Span> Registry::free_space(uintptr_t base, uintptr_t begin, uintptr_t end) const {
  std::lock_guard<std::mutex> lock(mutex_);
  std::vector<Span> free;
  auto it = allocations_.find(base);
  if (it == allocations_.end() || !it->second.blocks_reported) return free;
  const SpanSet& blocks = it->second.blocks;
  uintptr_t at = begin;
  for (auto span = blocks.first_ending_after(begin - base); span != blocks.spans().end(); ++span) {
    const uintptr_t b = base + span->first, e = base + span->second;
    if (b >= end) break;
    if (b > at) free.push_back(Span{at, b});
    at = std::max(at, e);
  }
  if (at < end) free.push_back(Span{at, end});
  return free;
}

bool Registry::released(uintptr_t base) const {
  std::lock_guard<std::mutex> lock(mutex_);
  auto it = allocations_.find(base);
  return it != allocations_.end() && it->second.released();
}

bool Registry::mapping(uintptr_t base, Mapping* out) const {
  std::lock_guard<std::mutex> lock(mutex_);
  auto it = allocations_.find(base);
  if (it == allocations_.end() || it->second.backing != Backing::releasable) return false;
  *out = it->second.mapping;
  return true;
}

void Registry::set_mapping(uintptr_t base, const Mapping& mapping) {
  std::lock_guard<std::mutex> lock(mutex_);
  auto it = allocations_.find(base);
  if (it != allocations_.end()) it->second.mapping = mapping;
}

AllocationView Registry::view_of(uintptr_t base, const Allocation& allocation) {
  return AllocationView{base,           allocation.size,   allocation.device,
                        allocation.backing, allocation.slab, allocation.backup, allocation.paused,
                        allocation.compressed};
}

bool Selection::includes(const Allocation& allocation) const {
  return (device == UVM_ANY_DEVICE || allocation.device == device) &&
         (any_tag || std::find(tags.begin(), tags.end(), allocation.tag) != tags.end()) &&
         (!backup || allocation.backup == *backup) && (!paused || allocation.paused == *paused) &&
         (!compressed || allocation.compressed == *compressed);
}

std::vector<AllocationView> Registry::select(const Selection& selection) const {
  std::lock_guard<std::mutex> lock(mutex_);
  std::vector<AllocationView> found;
  for (const auto& [base, allocation] : allocations_) {
    if (selection.includes(allocation)) found.push_back(view_of(base, allocation));
  }
  return found;
}

std::vector<int> Registry::devices_of(const Selection& selection) const {
  std::lock_guard<std::mutex> lock(mutex_);
  std::set<int> devices;
  for (const auto& [base, allocation] : allocations_) {
    if (selection.includes(allocation)) devices.insert(allocation.device);
  }
  return std::vector<int>(devices.begin(), devices.end());
}

size_t Registry::reclaimable_managed_bytes(int device) const {
  std::lock_guard<std::mutex> lock(mutex_);
  size_t total = 0;
  for (const auto& [base, allocation] : allocations_) {
    if (allocation.device != device || allocation.backing != Backing::managed) continue;
    total += allocation.host.total() + allocation.discarded.total();
  }
  return total;
}

Registry& registry() {
  static Registry* instance = new Registry();
  return *instance;
}

uvm_status select_arguments(const Call& call, int device, const char* tag, Selection* out) {
  return select_arguments(call, device, tag == nullptr ? nullptr : &tag, tag == nullptr ? 0 : 1, out);
}

uvm_status select_arguments(const Call& call, int device, const char* const* tags, size_t count, Selection* out) {
  if (device != UVM_ANY_DEVICE) {
    if (uvm_status s = check_device(call, device, false)) return s;
  }
  if (tags == nullptr && count > 0) return fail(call, UVM_ERROR_INVALID_ARGUMENT, "tags is NULL but tag_count is %zu", count);
  *out = Selection{};
  out->device = device;
  out->any_tag = count == 0;
  for (size_t i = 0; i < count; ++i) {
    if (tags[i] == nullptr) return fail(call, UVM_ERROR_INVALID_ARGUMENT, "tags[%zu] is NULL", i);
    TagId id = kUntagged;
    if (find_tag(tags[i], &id)) out->tags.push_back(id);
  }
  return UVM_OK;
}

cudaError_t cuda_reports_managed(const void* ptr, bool* managed) {
  cudaPointerAttributes attributes{};
  const cudaError_t e = clear_cuda_error(cudaPointerGetAttributes(&attributes, ptr));
  *managed = e == cudaSuccess && attributes.type == cudaMemoryTypeManaged;
  return e;
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
  Selection selection;
  if (uvm_status s = select_arguments(call, device, tag, &selection)) return s;
  const auto found = registry().select(selection);
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
    bool managed = false;
    (void)uvm::cuda_reports_managed(ptr, &managed);  // a failed query says "no": the int has no error to give
    return managed ? 1 : 0;
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
