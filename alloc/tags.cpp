#include "tags.hpp"

#include <array>
#include <atomic>
#include <cstring>
#include <mutex>

namespace uvm {
namespace {

// Slot 0 is the untagged name "". Slots are written once, under the mutex, before `count` publishes
// them, so readers need no lock.
struct TagTable {
  std::mutex mutex;
  std::array<std::array<char, UVM_TAG_MAX_LENGTH + 1>, UVM_MAX_TAGS + 1> names{};
  std::atomic<size_t> count{1};
};

TagTable& table() {
  static TagTable* instance = new TagTable();
  return *instance;
}

thread_local TagId current_thread_tag = kUntagged;
thread_local uvm_backup current_thread_backup = UVM_BACKUP_NONE;
thread_local bool current_thread_compression = false;
thread_local bool current_thread_exportable = false;

bool lookup(const TagTable& t, const char* name, size_t count, TagId* id) {
  for (size_t i = 1; i < count; ++i) {
    if (std::strcmp(t.names[i].data(), name) == 0) {
      *id = static_cast<TagId>(i);
      return true;
    }
  }
  return false;
}

}  // namespace

uvm_status intern_tag(const Call& call, const char* name, TagId* id) {
  if (name == nullptr || name[0] == '\0') {
    *id = kUntagged;
    return UVM_OK;
  }
  const size_t length = strnlen(name, UVM_TAG_MAX_LENGTH + 1);
  if (length > UVM_TAG_MAX_LENGTH) {
    return fail(call, UVM_ERROR_INVALID_ARGUMENT, "tag is longer than %d bytes", UVM_TAG_MAX_LENGTH);
  }
  TagTable& t = table();
  std::lock_guard<std::mutex> lock(t.mutex);
  const size_t count = t.count.load(std::memory_order_relaxed);
  if (lookup(t, name, count, id)) return UVM_OK;
  if (count > UVM_MAX_TAGS) {
    return fail(call, UVM_ERROR_INVALID_ARGUMENT, "tag \"%s\" would be past the %d distinct tags a process may use",
                name, UVM_MAX_TAGS);
  }
  std::memcpy(t.names[count].data(), name, length + 1);
  t.count.store(count + 1, std::memory_order_release);
  *id = static_cast<TagId>(count);
  return UVM_OK;
}

bool find_tag(const char* name, TagId* id) {
  if (name == nullptr || name[0] == '\0') {
    *id = kUntagged;
    return true;
  }
  const TagTable& t = table();
  return lookup(t, name, t.count.load(std::memory_order_acquire), id);
}

TagId thread_tag() { return current_thread_tag; }

uvm_backup thread_backup() { return current_thread_backup; }

bool thread_compression() { return current_thread_compression; }

bool thread_exportable() { return current_thread_exportable; }

}  // namespace uvm

extern "C" {

uvm_status uvm_set_thread_tag(const char* tag) {
  const uvm::Call call = uvm::Call::of("uvm_set_thread_tag");
  return uvm::guarded(call, [&] {
    uvm::TagId id = uvm::kUntagged;
    if (uvm_status s = uvm::intern_tag(call, tag, &id)) return s;
    uvm::current_thread_tag = id;
    return UVM_OK;
  });
}

const char* uvm_get_thread_tag(void) { return uvm::table().names[uvm::current_thread_tag].data(); }

uvm_status uvm_set_thread_backup(uvm_backup backup) {
  const uvm::Call call = uvm::Call::of("uvm_set_thread_backup");
  const int raw = uvm::raw_enum(backup);
  if (raw < UVM_BACKUP_NONE || raw > UVM_BACKUP_DISK) {
    return uvm::fail(call, UVM_ERROR_INVALID_ARGUMENT, "backup %d is not a uvm_backup (UVM_BACKUP_NONE … UVM_BACKUP_DISK)",
                     raw);
  }
  uvm::current_thread_backup = static_cast<uvm_backup>(raw);
  return UVM_OK;
}

uvm_backup uvm_get_thread_backup(void) { return uvm::current_thread_backup; }

uvm_status uvm_set_thread_compression(int compress) {
  const uvm::Call call = uvm::Call::of("uvm_set_thread_compression");
  if (compress != 0 && compress != 1) {
    return uvm::fail(call, UVM_ERROR_INVALID_ARGUMENT, "compress is %d, not 0 or 1", compress);
  }
  uvm::current_thread_compression = compress == 1;
  return UVM_OK;
}

int uvm_get_thread_compression(void) { return uvm::current_thread_compression ? 1 : 0; }

uvm_status uvm_set_thread_exportable(int exportable) {
  const uvm::Call call = uvm::Call::of("uvm_set_thread_exportable");
  if (exportable != 0 && exportable != 1) {
    return uvm::fail(call, UVM_ERROR_INVALID_ARGUMENT, "exportable is %d, not 0 or 1", exportable);
  }
  uvm::current_thread_exportable = exportable == 1;
  return UVM_OK;
}

int uvm_get_thread_exportable(void) { return uvm::current_thread_exportable ? 1 : 0; }

size_t uvm_tag_count(void) { return uvm::table().count.load(std::memory_order_acquire) - 1; }

const char* uvm_tag_name(size_t index) {
  const uvm::TagTable& t = uvm::table();
  if (index >= t.count.load(std::memory_order_acquire) - 1) return nullptr;
  return t.names[index + 1].data();
}

}  // extern "C"
