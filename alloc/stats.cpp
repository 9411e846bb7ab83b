#include "stats.hpp"

#include <mutex>

#include "devices.hpp"
#include "limits.hpp"
#include "vmm.hpp"

namespace uvm {
namespace {

struct Account {
  std::mutex mutex;
  uvm_stats stats{};
  size_t reserved = 0;
};

Account& account(int device) {
  static Account* accounts = new Account[kMaxDevices];
  return accounts[device];
}

void add_host_bytes(uvm_stats& stats, long long delta) {
  stats.host_resident_bytes = static_cast<size_t>(static_cast<long long>(stats.host_resident_bytes) + delta);
}

}  // namespace

bool try_reserve(int device, size_t size, size_t limit, size_t* live_and_reserved) {
  Account& a = account(device);
  std::lock_guard<std::mutex> lock(a.mutex);
  const size_t in_use = a.stats.live_bytes + a.reserved;
  *live_and_reserved = in_use;
  if (size > limit || in_use > limit - size) return false;
  a.reserved += size;
  return true;
}

void cancel_reservation(int device, size_t size) {
  Account& a = account(device);
  std::lock_guard<std::mutex> lock(a.mutex);
  a.reserved -= size;
}

void commit_reservation(int device, size_t size) {
  Account& a = account(device);
  std::lock_guard<std::mutex> lock(a.mutex);
  a.reserved -= size;
  a.stats.live_bytes += size;
  a.stats.live_allocations += 1;
  a.stats.total_allocations += 1;
  if (a.stats.live_bytes > a.stats.peak_bytes) a.stats.peak_bytes = a.stats.live_bytes;
}

void record_free(int device, size_t size, size_t host_bytes) {
  Account& a = account(device);
  std::lock_guard<std::mutex> lock(a.mutex);
  a.stats.live_bytes -= size;
  a.stats.live_allocations -= 1;
  a.stats.total_frees += 1;
  add_host_bytes(a.stats, -static_cast<long long>(host_bytes));
}

void count_move(int device, size_t bytes, bool to_host, long long host_delta, uint64_t calls) {
  Account& a = account(device);
  std::lock_guard<std::mutex> lock(a.mutex);
  (to_host ? a.stats.bytes_to_host : a.stats.bytes_to_device) += bytes;
  a.stats.prefetch_calls += calls;
  add_host_bytes(a.stats, host_delta);
}

void record_discard(int device, size_t bytes, long long host_delta) {
  Account& a = account(device);
  std::lock_guard<std::mutex> lock(a.mutex);
  a.stats.bytes_discarded += bytes;
  add_host_bytes(a.stats, host_delta);
}

void record_prefetch_calls(int device, uint64_t calls) {
  Account& a = account(device);
  std::lock_guard<std::mutex> lock(a.mutex);
  a.stats.prefetch_calls += calls;
}

void record_host_change(int device, long long host_delta) {
  Account& a = account(device);
  std::lock_guard<std::mutex> lock(a.mutex);
  add_host_bytes(a.stats, host_delta);
}

uvm_stats snapshot(int device) {
  Account& a = account(device);
  std::lock_guard<std::mutex> lock(a.mutex);
  return a.stats;
}

void reset_peak(int device) {
  Account& a = account(device);
  std::lock_guard<std::mutex> lock(a.mutex);
  a.stats.peak_bytes = a.stats.live_bytes;
}

}  // namespace uvm

extern "C" {

uvm_status uvm_get_stats(int device, uvm_stats* stats) {
  const uvm::Call call = uvm::Call::of("uvm_get_stats").with_device(device);
  return uvm::guarded(call, [&] {
    if (stats == nullptr) return uvm::fail(call, UVM_ERROR_INVALID_ARGUMENT, "stats is NULL");
    if (uvm_status s = uvm::check_device(call, device, false)) return s;
    uvm_stats result = uvm::snapshot(device);
    result.spare_bytes = uvm::vmm_spare_bytes(device);
    if (uvm_status s = uvm::effective_limit(call, device, &result.limit_bytes)) return s;
    *stats = result;
    return UVM_OK;
  });
}

uvm_status uvm_reset_peak(int device) {
  const uvm::Call call = uvm::Call::of("uvm_reset_peak").with_device(device);
  return uvm::guarded(call, [&] {
    if (uvm_status s = uvm::check_device(call, device, false)) return s;
    uvm::reset_peak(device);
    return UVM_OK;
  });
}

}  // extern "C"
