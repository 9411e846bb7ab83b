// torch_memory_saver's C names, for programs written against its preload library (its tests call
// tms_pause from the process's global symbols; slime reads tms_get_interesting_region). Each is
// one line over uvm's thread state and uvm_preload.h; they return what the original's return.
#include <cstring>

#include "interposer.hpp"
#include "uvm_preload.h"

using uvm_preload::CpuBackend;
using uvm_preload::libuvm;
using uvm_preload::thread_state;

namespace {

// Both start the thread's state first: a thread's first call may be a setting, which its start from
// TMS_INIT_ENABLE_CPU_BACKUP must come before, not overwrite.
uvm_backup current_backup() {
  thread_state();
  return libuvm() ? libuvm()->get_thread_backup() : UVM_BACKUP_NONE;
}

void set_backup(uvm_backup backup) {
  thread_state();
  if (libuvm()) libuvm()->set_thread_backup(backup);
}

bool is_cpu_backup(uvm_backup backup) { return backup == UVM_BACKUP_HOST || backup == UVM_BACKUP_MMAP; }

}  // namespace

extern "C" {

UVM_API void tms_set_interesting_region(bool inside) { uvm_preload_set_region(inside ? 1 : 0); }

UVM_API bool tms_get_interesting_region() { return uvm_preload_get_region() != 0; }

UVM_API void tms_set_current_tag(const char* tag) {
  thread_state();
  if (libuvm()) libuvm()->set_thread_tag(tag);
}

// The original's tag starts as "default"; uvm's is "" until set, and a region's allocation made
// untagged is made under "default" (interposer.cpp, allocate_in_region).
UVM_API const char* tms_get_current_tag() {
  thread_state();
  const char* tag = libuvm() ? libuvm()->get_thread_tag() : nullptr;
  return tag != nullptr && *tag != '\0' ? tag : "default";
}

UVM_API void tms_set_enable_cpu_backup(bool enable) {
  const uvm_backup now = current_backup();
  if (enable) set_backup(uvm_preload::cpu_backup_of(thread_state().cpu_backup_backend));
  else if (is_cpu_backup(now)) set_backup(UVM_BACKUP_NONE);
}

UVM_API bool tms_get_enable_cpu_backup() {
  thread_state();
  return is_cpu_backup(current_backup());
}

// A host copy kept pinned or mmap'ed: remembered while the copy is off, applied when it is on.
UVM_API void tms_set_cpu_backup_backend(const char* backend) {
  const CpuBackend chosen = backend != nullptr && !std::strcmp(backend, "mmap") ? CpuBackend::mmap : CpuBackend::pinned;
  thread_state().cpu_backup_backend = chosen;
  if (is_cpu_backup(current_backup())) set_backup(uvm_preload::cpu_backup_of(chosen));
}

UVM_API const char* tms_get_cpu_backup_backend() {
  const CpuBackend remembered = thread_state().cpu_backup_backend;
  const uvm_backup now = current_backup();
  if (now == UVM_BACKUP_MMAP) return "mmap";
  if (now == UVM_BACKUP_HOST) return "pinned";
  return remembered == CpuBackend::mmap ? "mmap" : "pinned";
}

UVM_API void tms_set_enable_disk_backup(bool enable) {
  thread_state();
  if (enable) set_backup(UVM_BACKUP_DISK);
  else if (current_backup() == UVM_BACKUP_DISK) set_backup(UVM_BACKUP_NONE);
}

UVM_API bool tms_get_enable_disk_backup() {
  thread_state();
  return current_backup() == UVM_BACKUP_DISK;
}

UVM_API void tms_set_disk_backup_dir(const char* path) {
  if (libuvm()) libuvm()->set_disk_backup_dir(path);
}

UVM_API int tms_pause(const char* tag) { return uvm_preload_pause(tag); }

UVM_API int tms_resume(const char* tag) {
  const uvm_status status = uvm_preload_resume(tag);
  // The original gives its host copies back before its resume returns unless told to keep them
  // (memory_saver.py's resume says why not later).
  if (status == UVM_OK && libuvm() && !libuvm()->get_retain_backups()) libuvm()->release_staging();
  return status;
}

UVM_API void tms_set_retain_cpu_backup(bool retain) {
  if (libuvm()) libuvm()->set_retain_backups(retain ? 1 : 0);
}

UVM_API bool tms_get_retain_cpu_backup() { return libuvm() && libuvm()->get_retain_backups() != 0; }

UVM_API const void* tms_get_cpu_backup_pointer(const void* ptr, uint64_t size) {
  const void* host = nullptr;
  if (libuvm() && libuvm()->get_staged_copy(ptr, size, &host) != UVM_OK) return nullptr;
  return host;
}

}  // extern "C"
