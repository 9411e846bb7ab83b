#include "registry.hpp"

#include <cuda_runtime_api.h>

#include "errors.hpp"

namespace uvm {

void Registry::insert(const void* base, size_t size, int device) {
  std::lock_guard<std::mutex> lock(mutex_);
  entries_[reinterpret_cast<uintptr_t>(base)] = Entry{size, device, SpanSet{}};
}

bool Registry::erase(const void* base, AllocationView* removed, size_t* host_bytes) {
  std::lock_guard<std::mutex> lock(mutex_);
  auto it = entries_.find(reinterpret_cast<uintptr_t>(base));
  if (it == entries_.end()) return false;
  *removed = AllocationView{it->first, it->second.size, it->second.device};
  *host_bytes = it->second.host_spans.total();
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
  *found = AllocationView{it->first, it->second.size, it->second.device};
  return true;
}

long long Registry::record_move(uintptr_t base, size_t begin, size_t end, Move move) {
  std::lock_guard<std::mutex> lock(mutex_);
  auto it = entries_.find(base);
  if (it == entries_.end()) return 0;  // freed meanwhile: nothing left to account
  SpanSet& spans = it->second.host_spans;
  if (move == Move::to_host) return static_cast<long long>(spans.add(begin, end));
  return -static_cast<long long>(spans.remove(begin, end));
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

}  // namespace uvm

extern "C" {

int uvm_is_managed(const void* ptr) {
  if (ptr == nullptr) return 0;
  try {
    uvm::AllocationView found;
    if (uvm::registry().find(ptr, &found)) return 1;
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

}  // extern "C"
