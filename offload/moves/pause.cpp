// uvm_pause and uvm_resume: whole tags off the GPU and back, each allocation kept or dropped as its
// backup (recorded when it was made) says. What is paused lives in each allocation's record, so a
// runtime on top (uvm.memory_saver) keeps no state of its own, and a freed allocation takes its
// mark with it.
#include <algorithm>
#include <atomic>
#include <mutex>
#include <optional>
#include <set>
#include <string>
#include <vector>

#include "../../alloc/devices.hpp"
#include "../../alloc/registry.hpp"
#include "../../hints/discard_batch.hpp"
#include "../../hints/moves/trace.hpp"
#include "offload.hpp"
#include "onload.hpp"
#include "prepare.hpp"

namespace uvm {
namespace {

// Pause and resume take turns, so that a resume never meets a pause of the same tag half-way.
std::mutex& pause_turns() {
  static auto* turns = new std::mutex();  // never destroyed: no code runs from static destructors
  return *turns;
}

// uvm_set_retain_backups: whether a resume keeps the host copies it brought back.
std::atomic<bool> retain_backups{false};

// Runs one of uvm's own entries; its failure becomes `call`'s, its message kept after `call`'s name.
uvm_status run(const Call& call, uvm_status status) {
  if (status == UVM_OK) return UVM_OK;
  const std::string inner = uvm_last_error();
  return fail(call, status, "%s", inner.c_str());
}

// What each backup keeps, the offload that keeps it, and where its compressed copies go.
struct KeptBackup {
  uvm_backup backup;
  uvm_strategy strategy;
  Kept kept;
};
constexpr KeptBackup kKeptBackups[] = {{UVM_BACKUP_HOST, UVM_STRATEGY_AUTO, Kept::pinned},
                                       {UVM_BACKUP_MMAP, UVM_STRATEGY_MMAP, Kept::pageable},
                                       {UVM_BACKUP_DISK, UVM_STRATEGY_DISK, Kept::disk}};

// The backups that allocations of `selection` have, and whether compressed, read without the moves
// lock: only whether, and which, moves to begin. Each move selects again, under the lock, and
// marks what it moved.
std::set<std::pair<uvm_backup, bool>> backups_of(const Selection& selection) {
  std::set<std::pair<uvm_backup, bool>> backups;
  for (const AllocationView& found : registry().select(selection)) backups.insert({found.backup, found.compressed});
  return backups;
}

// One device: each backup's allocations in one move, marked paused by it once it is issued, so that
// a later group's failure leaves the earlier ones paused (resume brings them back) and its own on
// the device. An allocation freed meanwhile is not moved, and one made at its address is not taken
// for it (begin.hpp).
uvm_status pause_device(const Call& call, const Selection& of_device) {
  Selection unpaused = of_device;
  unpaused.paused = false;
  const std::set<std::pair<uvm_backup, bool>> backups = backups_of(unpaused);
  if (backups.empty()) return UVM_OK;
  std::optional<PauseUnderway> staging_for;  // a preparation of these allocations would pin beside it
  if (std::any_of(backups.begin(), backups.end(), [](const auto& b) { return b.first != UVM_BACKUP_NONE; })) {
    staging_for.emplace(unpaused);
  }
  ContextScope scope;  // the legacy stream below is this device's
  if (uvm_status s = scope.enter(call, of_device.device, ContextScope::When::always)) return s;
  if (uvm_status s = run(call, uvm_device_synchronize(of_device.device))) return s;  // kernels may still use them
  MoveRecord record(call.name);
  Selection group = unpaused;
  if (backups.count({UVM_BACKUP_NONE, false}) || backups.count({UVM_BACKUP_NONE, true})) {  // first: nothing to copy
    group.backup = UVM_BACKUP_NONE;
    if (uvm_status s = discard_moves(call, MoveArgs::selected(group).marking_paused(true), nullptr)) {
      return record.done(s);
    }
  }
  for (const KeptBackup& kept : kKeptBackups) {
    for (const bool compressed : {false, true}) {
      if (!backups.count({kept.backup, compressed})) continue;
      group.backup = kept.backup;
      group.compressed = compressed;
      const MoveArgs args = MoveArgs::selected(group).marking_paused(true);
      const uvm_status s = compressed ? offload_compressed(call, args, kept.kept, nullptr)
                                      : offload_moves(call, args, kept.strategy, nullptr);
      if (s != UVM_OK) return record.done(s);
    }
  }
  record.done(UVM_OK);
  return run(call, uvm_device_synchronize(of_device.device));
}

uvm_status resume_device(const Call& call, const Selection& of_device) {
  Selection paused = of_device;
  paused.paused = true;
  if (registry().select(paused).empty()) return UVM_OK;
  ContextScope scope;
  if (uvm_status s = scope.enter(call, of_device.device, ContextScope::When::always)) return s;
  OnloadMode mode;
  mode.name = call.name;
  mode.retain = retain_backups.load();
  MoveRecord record(call.name);
  // Marked not paused once issued: a resume whose onload fails leaves them all paused.
  if (uvm_status s = record.done(onload_moves(call, MoveArgs::selected(paused).marking_paused(false), nullptr, mode))) {
    return s;
  }
  return run(call, uvm_device_synchronize(of_device.device));
}

// The devices holding allocations of the selection, each with the selection narrowed to it.
template <typename PerDevice>
uvm_status for_each_device(const Call& call, int device, const char* tag, PerDevice per_device) {
  std::lock_guard<std::mutex> turn(pause_turns());
  Selection selection;
  if (uvm_status s = select_arguments(call, device, tag, &selection)) return s;
  for (int on : registry().devices_of(selection)) {
    Selection of_device = selection;
    of_device.device = on;
    if (uvm_status s = per_device(call, of_device)) return s;
  }
  return UVM_OK;
}

}  // namespace
}  // namespace uvm

extern "C" {

uvm_status uvm_pause(int device, const char* tag) {
  const uvm::Call call = uvm::Call::of("uvm_pause").with_selection(device).with_tag(tag);
  return uvm::guarded(call, [&] { return uvm::for_each_device(call, device, tag, uvm::pause_device); });
}

uvm_status uvm_resume(int device, const char* tag) {
  const uvm::Call call = uvm::Call::of("uvm_resume").with_selection(device).with_tag(tag);
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
  const uvm::Call call = uvm::Call::of("uvm_paused_count").with_selection(device).with_tag(tag);
  return uvm::guarded(call, [&] {
    if (count == nullptr) return uvm::fail(call, UVM_ERROR_INVALID_ARGUMENT, "count is NULL");
    uvm::Selection paused;
    if (uvm_status s = uvm::select_arguments(call, device, tag, &paused)) return s;
    paused.paused = true;
    *count = uvm::registry().select(paused).size();
    return UVM_OK;
  });
}

uvm_status uvm_set_backup(int device, const char* tag, uvm_backup backup, int compress, size_t* changed) {
  const uvm::Call call = uvm::Call::of("uvm_set_backup").with_selection(device).with_tag(tag);
  return uvm::guarded(call, [&] {
    const int raw = uvm::raw_enum(backup);
    if (raw < UVM_BACKUP_NONE || raw > UVM_BACKUP_DISK) return uvm::fail(call, UVM_ERROR_INVALID_ARGUMENT, "backup is %d, not a uvm_backup", raw);
    if (compress != 0 && compress != 1) return uvm::fail(call, UVM_ERROR_INVALID_ARGUMENT, "compress is %d, not 0 or 1", compress);
    std::lock_guard<std::mutex> turn(uvm::pause_turns());  // a pause under way moves each allocation as it found it
    uvm::Selection awake;  // a paused allocation keeps what it was paused with: its resume brings that back
    if (uvm_status s = uvm::select_arguments(call, device, tag, &awake)) return s;
    awake.paused = false;
    const size_t set = uvm::registry().set_backup(awake, backup, compress == 1 && backup != UVM_BACKUP_NONE);
    if (changed) *changed = set;
    return UVM_OK;
  });
}

uvm_status uvm_set_allocation_tag(const void* ptr, const char* tag) {
  const uvm::Call call = uvm::Call::of("uvm_set_allocation_tag").with_ptr(ptr).with_tag(tag);
  return uvm::guarded(call, [&] {
    uvm::TagId id = uvm::kUntagged;
    if (uvm_status s = uvm::intern_tag(call, tag, &id)) return s;
    std::lock_guard<std::mutex> turn(uvm::pause_turns());  // never half-way through a pause of either tag
    uvm::AllocationView found;
    if (ptr == nullptr || !uvm::registry().find(ptr, &found)) {
      return uvm::fail(call, UVM_ERROR_NOT_MANAGED, "no live uvm allocation contains this pointer");
    }
    if (found.paused) {
      return uvm::fail(call, UVM_ERROR_INVALID_ARGUMENT, "the allocation at %p is paused: resume it first (its tag's resume brings it back)",
                       reinterpret_cast<const void*>(found.base));
    }
    uvm::registry().set_tag(found.base, id);
    return UVM_OK;
  });
}

uvm_status uvm_get_allocation_state(const void* ptr, uvm_allocation_state* state) {
  const uvm::Call call = uvm::Call::of("uvm_get_allocation_state").with_ptr(ptr);
  return uvm::guarded(call, [&] {
    if (state == nullptr) return uvm::fail(call, UVM_ERROR_INVALID_ARGUMENT, "state is NULL");
    uvm::AllocationView found;
    if (ptr == nullptr || !uvm::registry().find(ptr, &found)) {
      return uvm::fail(call, UVM_ERROR_NOT_MANAGED, "no live uvm allocation contains this pointer");
    }
    *state = uvm_allocation_state{};
    state->base = reinterpret_cast<const void*>(found.base);
    state->size = found.size;
    state->device = found.device;
    state->paused = found.paused ? 1 : 0;
    state->released = uvm::registry().released(found.base) ? 1 : 0;
    state->backup = found.backup;
    state->compressed = found.compressed ? 1 : 0;
    return UVM_OK;
  });
}

}  // extern "C"
