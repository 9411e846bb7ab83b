// What the two halves of libuvm_preload.so share: the libuvm it opened, and each thread's
// region state. interposer.cpp owns both; tms_names.cpp puts torch_memory_saver's C names on them.
#pragma once

#include <string>

#include "uvm.h"

namespace uvm_preload {

// libuvm's entries this library calls, looked up once when it opens (no link-time dependency: the
// interposer must load before the CUDA runtime the process will use is known).
struct Libuvm {
  void* (*malloc_releasable)(size_t, int, cudaStream_t) = nullptr;
  void (*free)(void*, size_t, int, cudaStream_t) = nullptr;
  uvm_status (*last_status)(void) = nullptr;
  void (*clear_last_error)(void) = nullptr;
  const char* (*last_error)(void) = nullptr;
  uvm_status (*set_thread_tag)(const char*) = nullptr;
  const char* (*get_thread_tag)(void) = nullptr;
  uvm_status (*set_thread_backup)(uvm_backup) = nullptr;
  uvm_backup (*get_thread_backup)(void) = nullptr;
  uvm_status (*pause)(int, const char*) = nullptr;
  uvm_status (*resume)(int, const char*) = nullptr;
  uvm_status (*set_retain_backups)(int) = nullptr;
  int (*get_retain_backups)(void) = nullptr;
  uvm_status (*get_staged_copy)(const void*, size_t, const void**) = nullptr;
  uvm_status (*set_disk_backup_dir)(const char*) = nullptr;
  uvm_status (*release_staging)(void) = nullptr;
  int (*last_cuda_error)(void) = nullptr;
  uvm_status (*allocation_info)(const void*, void**, size_t*, int*) = nullptr;
};

// The entries, or nullptr when libuvm could not be opened (uvm_preload_load_error says why). Opened
// here at first need where nothing named it at load; tried again at each call until it opens.
const Libuvm* libuvm();

// Where a CPU backup is kept: pinned (uvm's staging memory) or mmap'ed pageable memory.
enum class CpuBackend { pinned, mmap };

// A thread's region state. It starts from torch_memory_saver's environment (TMS_INIT_*), applied
// at the thread's first call into this library, before anything reads or sets it. Nothing in it
// allocates, so that starting it never throws.
struct ThreadState {
  bool inside_region = false;
  int region_device = UVM_ANY_DEVICE;  // the one device a region's cudaMalloc may allocate on
  CpuBackend cpu_backup_backend = CpuBackend::pinned;  // kept while the backup is off, as the original's
  bool initial_settings_pending = false;  // TMS_INIT_ENABLE's tag and backup, not yet given to libuvm
};
ThreadState& thread_state();

// The backup a host copy of `backend` means.
uvm_backup cpu_backup_of(CpuBackend backend);

}  // namespace uvm_preload
