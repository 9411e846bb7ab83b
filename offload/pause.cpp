// uvm_pause and uvm_resume: whole tags off the GPU and back, each allocation kept or dropped as its
// backup (recorded when it was made) says. What is paused lives in each allocation's record, so a
// runtime on top (uvm.memory_saver) keeps no state of its own, and a freed allocation takes its
// mark with it.
#include <atomic>
#include <map>
#include <mutex>
#include <string>
#include <vector>

#include "../alloc/devices.hpp"
#include "../alloc/registry.hpp"
#include "onload.hpp"

namespace uvm {
namespace {

// Pause and resume take turns, so that a resume never meets a pause of the same tag half-way.
std::mutex& pause_turns() {
  static auto* turns = new std::mutex();  // never destroyed: no code runs from static destructors
  return *turns;
}

// uvm_set_retain_backups: whether a resume keeps the host copies it brought back.
std::atomic<bool> retain_backups{false};

// The live allocations of the selection, by device.
uvm_status select(const Call& call, int device, const char* tag, std::map<int, std::vector<AllocationView>>* out) {
  Selection selection;
  if (uvm_status s = select_arguments(call, device, tag, &selection)) return s;
  for (const AllocationView& found : registry().select(selection)) (*out)[found.device].push_back(found);
  return UVM_OK;
}

std::vector<uvm_range> ranges_of(const std::vector<AllocationView>& allocations) {
  std::vector<uvm_range> ranges;
  for (const AllocationView& a : allocations) ranges.push_back(uvm_range{reinterpret_cast<void*>(a.base), a.size});
  return ranges;
}

std::vector<uintptr_t> bases_of(const std::vector<AllocationView>& allocations) {
  std::vector<uintptr_t> bases;
  for (const AllocationView& a : allocations) bases.push_back(a.base);
  return bases;
}

// Runs one of uvm's own entries; its failure becomes `call`'s, its message kept after `call`'s name.
uvm_status run(const Call& call, uvm_status status) {
  if (status == UVM_OK) return UVM_OK;
  const std::string inner = uvm_last_error();
  return fail(call, status, "%s", inner.c_str());
}

// What each backup keeps, and the offload that keeps it.
struct KeptBackup {
  uvm_backup backup;
  uvm_strategy strategy;
};
constexpr KeptBackup kKeptBackups[] = {
    {UVM_BACKUP_HOST, UVM_STRATEGY_AUTO}, {UVM_BACKUP_MMAP, UVM_STRATEGY_MMAP}, {UVM_BACKUP_DISK, UVM_STRATEGY_DISK}};

// Each group is marked paused once its move is issued, so that a later group's failure leaves
// the earlier ones paused (resume brings them back) and its own on the device.
uvm_status pause_device(const Call& call, int device, const std::vector<AllocationView>& selected) {
  std::map<uvm_backup, std::vector<AllocationView>> by_backup;
  for (const AllocationView& a : selected) {
    if (!a.paused) by_backup[a.backup].push_back(a);
  }
  if (by_backup.empty()) return UVM_OK;
  ContextScope scope;  // the legacy stream below is this device's
  if (uvm_status s = scope.enter(call, device, ContextScope::When::always)) return s;
  if (uvm_status s = run(call, uvm_device_synchronize(device))) return s;  // kernels may still use them
  const auto dropped = by_backup.find(UVM_BACKUP_NONE);
  if (dropped != by_backup.end()) {  // first: nothing to copy, so its memory is free at once
    const auto ranges = ranges_of(dropped->second);
    if (uvm_status s = run(call, uvm_discard_ranges(ranges.data(), ranges.size(), nullptr))) return s;
    registry().set_paused(bases_of(dropped->second), true);
  }
  for (const KeptBackup& kept : kKeptBackups) {
    const auto group = by_backup.find(kept.backup);
    if (group == by_backup.end()) continue;
    const auto ranges = ranges_of(group->second);
    if (uvm_status s = run(call, uvm_offload_ranges(ranges.data(), ranges.size(), kept.strategy, nullptr))) return s;
    registry().set_paused(bases_of(group->second), true);
  }
  return run(call, uvm_device_synchronize(device));
}

uvm_status resume_device(const Call& call, int device, const std::vector<AllocationView>& selected) {
  std::vector<AllocationView> paused;
  for (const AllocationView& a : selected) {
    if (a.paused) paused.push_back(a);
  }
  if (paused.empty()) return UVM_OK;
  ContextScope scope;
  if (uvm_status s = scope.enter(call, device, ContextScope::When::always)) return s;
  const auto ranges = ranges_of(paused);
  OnloadMode mode;
  mode.retain = retain_backups.load();
  if (uvm_status s = run(call, onload_ranges(ranges.data(), ranges.size(), nullptr, mode))) return s;
  if (uvm_status s = run(call, uvm_device_synchronize(device))) return s;
  registry().set_paused(bases_of(paused), false);
  return UVM_OK;
}

template <typename PerDevice>
uvm_status for_each_device(const Call& call, int device, const char* tag, PerDevice per_device) {
  std::lock_guard<std::mutex> turn(pause_turns());
  std::map<int, std::vector<AllocationView>> by_device;
  if (uvm_status s = select(call, device, tag, &by_device)) return s;
  for (const auto& [on, allocations] : by_device) {
    if (uvm_status s = per_device(call, on, allocations)) return s;
  }
  return UVM_OK;
}

}  // namespace
}  // namespace uvm

extern "C" {

uvm_status uvm_pause(int device, const char* tag) {
  const uvm::Call call = uvm::Call::of("uvm_pause").with_selection(device);
  return uvm::guarded(call, [&] { return uvm::for_each_device(call, device, tag, uvm::pause_device); });
}

uvm_status uvm_resume(int device, const char* tag) {
  const uvm::Call call = uvm::Call::of("uvm_resume").with_selection(device);
  return uvm::guarded(call, [&] { return uvm::for_each_device(call, device, tag, uvm::resume_device); });
}

uvm_status uvm_set_retain_backups(int retain) {
  const uvm::Call call = uvm::Call::of("uvm_set_retain_backups");
  return uvm::guarded(call, [&] {
    if (retain != 0 && retain != 1) return uvm::fail(call, UVM_ERROR_INVALID_ARGUMENT, "retain is %d, not 0 or 1", retain);
    uvm::retain_backups.store(retain == 1);
    return UVM_OK;
  });
}

int uvm_get_retain_backups(void) { return uvm::retain_backups.load() ? 1 : 0; }

uvm_status uvm_paused_count(int device, const char* tag, size_t* count) {
  const uvm::Call call = uvm::Call::of("uvm_paused_count").with_selection(device);
  return uvm::guarded(call, [&] {
    if (count == nullptr) return uvm::fail(call, UVM_ERROR_INVALID_ARGUMENT, "count is NULL");
    std::map<int, std::vector<uvm::AllocationView>> by_device;
    if (uvm_status s = uvm::select(call, device, tag, &by_device)) return s;
    *count = 0;
    for (const auto& [on, allocations] : by_device) {
      for (const uvm::AllocationView& a : allocations) *count += a.paused ? 1 : 0;
    }
    return UVM_OK;
  });
}

}  // extern "C"
