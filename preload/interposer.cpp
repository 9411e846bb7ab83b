// libuvm_preload.so: cudaMalloc and cudaFree for a process that preloads it (include/uvm_preload.h
// says what each does). It links neither libuvm nor the CUDA runtime: the runtime's own functions
// are the next definitions after this library's (dlsym RTLD_NEXT). libuvm is opened at load where
// UVM_PRELOAD_LIBUVM or UVM_PRELOAD_CUDART name what to open; else at first need, once the process has
// loaded a CUDA runtime: beside this library, or in its cuda<major>/ folder for that runtime's major
// (the wheel's layout), so that libuvm's libcudart.so.<major> is the file the process loaded.
#include "interposer.hpp"

#include <dlfcn.h>
#include <link.h>
#include <unistd.h>

#include <cstdlib>

#include <atomic>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <deque>
#include <mutex>
#include <string>
#include <unordered_map>

#include "uvm_preload.h"

namespace uvm_preload {
namespace {

// An allocation handed out: its serial tells it from a later one at the same address (a free that
// failed drops its record only if no new allocation took the address meanwhile).
struct Handed {
  size_t size;
  int device;
  uint64_t serial;
};

// Everything this library keeps, made on first use: the constructor below runs before or after
// this file's static initializers (the order of the two is not fixed), so none is a global.
struct State {
  // Why libuvm could not be opened, the last one current; kept, since uvm_preload_load_error hands out
  // their c_str() while a later try may add one.
  std::deque<std::string> load_errors;
  std::string libuvm_path;
  Libuvm entries;
  std::atomic<bool> opened{false};
  bool at_first_need = false;  // nothing named what to open at load: libuvm opens beside the runtime loaded
  std::mutex opening;          // one thread opens libuvm at first need; the others wait for it
  // The allocations this library handed out, and the tags they were made under. A cudaFree of
  // any other pointer goes to the runtime untouched; a deque keeps each tag's c_str() valid. The
  // lock is never held across a call into libuvm or the runtime, and is taken across fork (a child
  // never inherits it held by a thread it does not have).
  std::mutex lock;
  std::unordered_map<void*, Handed> handed;
  std::deque<std::string> tags;
  uint64_t next_serial = 1;
};

State& state() {
  static State* kept = new State;  // never destroyed: cudaFree may run in other libraries' destructors
  return *kept;
}

std::string folder_of_this_library() {
  Dl_info info{};
  if (dladdr(reinterpret_cast<void*>(&folder_of_this_library), &info) == 0 || info.dli_fname == nullptr) return ".";
  const std::string path = info.dli_fname;
  const size_t slash = path.rfind('/');
  return slash == std::string::npos ? "." : path.substr(0, slash);
}

void note_load_error(std::string why) { state().load_errors.push_back(std::move(why)); }

const char* load_error() { return state().load_errors.empty() ? "" : state().load_errors.back().c_str(); }

const char* set_in(const char* name) {
  const char* value = std::getenv(name);
  return value != nullptr && *value != '\0' ? value : nullptr;
}

template <typename Function>
bool look_up(void* handle, const char* name, Function* into) {
  *into = reinterpret_cast<Function>(dlsym(handle, name));
  if (*into == nullptr) note_load_error(state().libuvm_path + " has no " + name + ": it is older than this interposer");
  return *into != nullptr;
}

bool open_libuvm_at(const std::string& path);

// At load, where the environment names what to open (uvm.memory_saver.configure_subprocess sets both).
bool open_libuvm() {
  if (const char* cudart = set_in("UVM_PRELOAD_CUDART")) {
    // First, so that libuvm's libcudart.so.N is this file, the one torch loads by path later.
    if (dlopen(cudart, RTLD_NOW | RTLD_GLOBAL) == nullptr) {
      note_load_error(std::string("cannot open the CUDA runtime UVM_PRELOAD_CUDART=") + cudart + ": " + dlerror());
      return false;
    }
  }
  const char* chosen = set_in("UVM_PRELOAD_LIBUVM");
  return open_libuvm_at(chosen != nullptr ? chosen : folder_of_this_library() + "/libuvm.so");
}

// The major of the CUDA runtime this process has loaded (libcudart.so.<major>[...]), 0 for none.
int loaded_runtime_major() {
  int major = 0;
  dl_iterate_phdr(
      [](dl_phdr_info* object, size_t, void* data) {
        const char* path = object->dlpi_name;
        const char* base = path != nullptr ? std::strrchr(path, '/') : nullptr;
        base = base != nullptr ? base + 1 : path;
        if (base == nullptr || std::strncmp(base, "libcudart.so.", 13) != 0) return 0;
        *static_cast<int*>(data) = std::atoi(base + 13);
        return *static_cast<int*>(data) > 0 ? 1 : 0;
      },
      &major);
  return major;
}

// At first need, where nothing was named at load (a process started as slime starts its train actors:
// LD_PRELOAD and TMS_INIT_* only): once the process has a CUDA runtime, the libuvm beside this library,
// else the one in its cuda<major>/ folder. Its libcudart.so.<major> then resolves to the loaded file.
bool open_beside_runtime() {
  const int major = loaded_runtime_major();
  if (major == 0) {
    note_load_error("no CUDA runtime is loaded in this process yet (libuvm opens beside the one the process loads; "
                    "or set UVM_PRELOAD_LIBUVM)");
    return false;
  }
  const std::string folder = folder_of_this_library();
  const std::string beside = folder + "/libuvm.so";
  return open_libuvm_at(access(beside.c_str(), F_OK) == 0 ? beside
                                                          : folder + "/cuda" + std::to_string(major) + "/libuvm.so");
}

bool open_libuvm_at(const std::string& path) {
  std::string& libuvm_path = state().libuvm_path;
  libuvm_path = path;
  void* handle = dlopen(libuvm_path.c_str(), RTLD_NOW | RTLD_LOCAL);
  if (handle == nullptr) {
    note_load_error("cannot open libuvm at " + libuvm_path + ": " + dlerror());
    return false;
  }
  Libuvm& e = state().entries;
  return look_up(handle, "uvm_malloc_releasable", &e.malloc_releasable) && look_up(handle, "uvm_free", &e.free) &&
         look_up(handle, "uvm_last_status", &e.last_status) && look_up(handle, "uvm_last_error", &e.last_error) &&
         look_up(handle, "uvm_clear_last_error", &e.clear_last_error) &&
         look_up(handle, "uvm_set_thread_tag", &e.set_thread_tag) &&
         look_up(handle, "uvm_get_thread_tag", &e.get_thread_tag) &&
         look_up(handle, "uvm_set_thread_backup", &e.set_thread_backup) &&
         look_up(handle, "uvm_get_thread_backup", &e.get_thread_backup) && look_up(handle, "uvm_pause", &e.pause) &&
         look_up(handle, "uvm_resume", &e.resume) && look_up(handle, "uvm_set_retain_backups", &e.set_retain_backups) &&
         look_up(handle, "uvm_get_retain_backups", &e.get_retain_backups) &&
         look_up(handle, "uvm_get_staged_copy", &e.get_staged_copy) &&
         look_up(handle, "uvm_set_disk_backup_dir", &e.set_disk_backup_dir) &&
         look_up(handle, "uvm_release_staging", &e.release_staging) &&
         look_up(handle, "uvm_last_cuda_error", &e.last_cuda_error) &&
         look_up(handle, "uvm_allocation_info", &e.allocation_info);
}

// At load. A process that cannot reach libuvm keeps the reason and runs on: the interposer reaches
// every descendant of a configured process (shells, compilers, nvidia-smi), and only a cudaMalloc
// inside a region needs libuvm; that one fails, naming the reason (allocate_in_region), and
// uvm.memory_saver refuses preload mode with it.
__attribute__((constructor)) void open_libuvm_at_load() {
  if (set_in("UVM_PRELOAD_LIBUVM") != nullptr || set_in("UVM_PRELOAD_CUDART") != nullptr) {
    state().opened.store(open_libuvm(), std::memory_order_release);
  } else {
    state().at_first_need = true;
  }
  pthread_atfork([] { state().lock.lock(); }, [] { state().lock.unlock(); }, [] { state().lock.unlock(); });
}

bool env_flag(const char* name) {
  const char* value = std::getenv(name);
  return value != nullptr && (!std::strcmp(value, "1") || !std::strcmp(value, "true") || !std::strcmp(value, "TRUE") ||
                              !std::strcmp(value, "yes") || !std::strcmp(value, "YES"));
}

using Malloc = cudaError_t (*)(void**, size_t);
using Free = cudaError_t (*)(void*);
using GetDevice = cudaError_t (*)(int*);

// The runtime's definition of `name`: the next after this library's in the global scope, else that
// of a runtime loaded without RTLD_GLOBAL (a library that opened its own). nullptr while no runtime
// is loaded; the caller asks again next time (a process may load the runtime after its first call).
void* find_in_runtime(const char* name) {
  if (void* next = dlsym(RTLD_NEXT, name); next != nullptr) return next;
  struct Search {
    const char* name;
    void* found;
  } search{name, nullptr};
  dl_iterate_phdr(
      [](dl_phdr_info* object, size_t, void* data) {
        auto* wanted = static_cast<Search*>(data);
        const char* path = object->dlpi_name;
        const char* base = path != nullptr ? std::strrchr(path, '/') : nullptr;
        if (base == nullptr || std::strncmp(base + 1, "libcudart.so", 12) != 0) return 0;
        void* handle = dlopen(path, RTLD_NOW | RTLD_NOLOAD);
        if (handle == nullptr) return 0;
        wanted->found = dlsym(handle, wanted->name);
        dlclose(handle);  // RTLD_NOLOAD took one more reference; the runtime stays loaded
        return wanted->found != nullptr ? 1 : 0;
      },
      &search);
  return search.found;
}

// One runtime function, looked up until found and then kept. Constant-initialized (no constructor
// runs at load), so usable from this library's constructor and any other library's.
template <typename Function>
class RuntimeFunction {
 public:
  explicit constexpr RuntimeFunction(const char* name) : name_(name) {}
  Function get() {
    if (void* kept = found_.load(std::memory_order_acquire); kept != nullptr) return reinterpret_cast<Function>(kept);
    void* found = find_in_runtime(name_);
    if (found == nullptr) {
      std::fprintf(stderr, "uvm preload (pid %d): the CUDA runtime's %s is not loaded in this process\n",
                   static_cast<int>(getpid()), name_);
      return nullptr;
    }
    found_.store(found, std::memory_order_release);
    return reinterpret_cast<Function>(found);
  }

 private:
  const char* name_;
  std::atomic<void*> found_{nullptr};
};

RuntimeFunction<Malloc> runtime_malloc("cudaMalloc");
RuntimeFunction<Free> runtime_free("cudaFree");
RuntimeFunction<GetDevice> runtime_get_device("cudaGetDevice");

void note_tag(const std::string& name) {  // under state().lock
  for (const std::string& known : state().tags) {
    if (known == name) return;
  }
  state().tags.push_back(name);
}

// The CUDA error a failed libuvm call answers a runtime caller with: the CUDA call's own error where
// one failed (a sticky error stays visible), else the nearest for uvm's status. Only running out of
// memory is cudaErrorMemoryAllocation: torch empties its cache and retries on that one alone.
cudaError_t cuda_error_of(const Libuvm& lib, uvm_status status) {
  if (const int code = lib.last_cuda_error(); code != 0) return static_cast<cudaError_t>(code);
  switch (status) {
    case UVM_ERROR_OUT_OF_MEMORY:
    case UVM_ERROR_LIMIT_EXCEEDED: return cudaErrorMemoryAllocation;
    case UVM_ERROR_INVALID_ARGUMENT:
    case UVM_ERROR_NOT_MANAGED: return cudaErrorInvalidValue;
    case UVM_ERROR_NO_DEVICE: return cudaErrorNoDevice;
    case UVM_ERROR_UNSUPPORTED: return cudaErrorNotSupported;
    case UVM_ERROR_CAPTURING: return cudaErrorStreamCaptureUnsupported;
    default: return cudaErrorUnknown;
  }
}

// A region's allocation made under the thread's uvm tag, or under "default" where it has none (the
// original's thread tag starts as "default", so tms_pause("default") finds it); the thread's own
// tag is left as it was. `tag` says which it was made under.
void* allocate_tagged(const Libuvm& lib, size_t size, int device, std::string* tag) {
  const char* own = lib.get_thread_tag();
  const bool untagged = own == nullptr || *own == '\0';
  *tag = untagged ? "default" : own;
  if (untagged && lib.set_thread_tag("default") != UVM_OK) return nullptr;
  void* allocated = lib.malloc_releasable(size, device, nullptr);
  if (untagged) lib.set_thread_tag(nullptr);  // a success leaves the last error as it is
  return allocated;
}

cudaError_t allocate_in_region(void** ptr, size_t size) {
  if (ptr == nullptr) return cudaErrorInvalidValue;
  *ptr = nullptr;
  const Libuvm* lib = libuvm();
  if (lib == nullptr) {
    std::fprintf(stderr,
                 "uvm preload (pid %d): cudaMalloc(%zu bytes) in a region: %s. Start the process inside "
                 "uvm.memory_saver.configure_subprocess(), or set UVM_PRELOAD_LIBUVM to the libuvm.so uvm built (and "
                 "UVM_PRELOAD_CUDART to the CUDA runtime it should use)\n",
                 static_cast<int>(getpid()), size, load_error());
    return cudaErrorInitializationError;
  }
  const GetDevice get_device = runtime_get_device.get();
  int device = 0;
  if (get_device == nullptr) return cudaErrorInitializationError;
  if (const cudaError_t e = get_device(&device); e != cudaSuccess) {
    std::fprintf(stderr, "uvm preload (pid %d): cudaMalloc(%zu bytes) in a region: cudaGetDevice failed (cudaError %d)\n",
                 static_cast<int>(getpid()), size, static_cast<int>(e));
    return e;
  }
  const int region_device = thread_state().region_device;
  if (region_device != UVM_ANY_DEVICE && device != region_device) {
    std::fprintf(stderr,
                 "uvm preload (pid %d): cudaMalloc(%zu bytes) on cuda:%d inside a region on cuda:%d: refused (its memory "
                 "would join cuda:%d's default pool, outside the region). Make it outside the region, or in a region "
                 "of its own device\n",
                 static_cast<int>(getpid()), size, device, region_device, device);
    return cudaErrorInvalidDevice;
  }
  if (size == 0) return cudaSuccess;
  std::string tag;
  lib->clear_last_error();
  void* allocated = allocate_tagged(*lib, size, device, &tag);
  if (allocated == nullptr) {
    const uvm_status status = lib->last_status();
    const cudaError_t error = cuda_error_of(*lib, status);
    // The caller (torch) sees only an error code: the reason goes to stderr and stays readable
    // through uvm_last_error on this thread.
    std::fprintf(stderr, "uvm preload (pid %d): cudaMalloc(%zu bytes) on cuda:%d in region tag '%s': %s\n",
                 static_cast<int>(getpid()), size, device, tag.c_str(), lib->last_error());
    return error != cudaSuccess ? error : cudaErrorUnknown;
  }
  try {
    std::lock_guard<std::mutex> hold(state().lock);
    state().handed[allocated] = Handed{size, device, state().next_serial++};
    note_tag(tag);
  } catch (...) {  // no room to record it: it is given back, and the caller told so
    {
      std::lock_guard<std::mutex> hold(state().lock);
      state().handed.erase(allocated);
    }
    lib->free(allocated, size, device, nullptr);
    std::fprintf(stderr, "uvm preload (pid %d): cudaMalloc(%zu bytes): no host memory to record the allocation\n",
                 static_cast<int>(getpid()), size);
    return cudaErrorMemoryAllocation;
  }
  *ptr = allocated;
  return cudaSuccess;
}

// cudaFree of an allocation this library handed out. Its record goes once uvm no longer has it: a
// free that failed with the allocation still uvm's (its wait for the device failed) keeps the
// record, so the caller's next cudaFree of it is uvm's again rather than the runtime's.
cudaError_t free_handed(void* ptr, const Handed& handed) {
  const Libuvm& lib = state().entries;
  lib.clear_last_error();
  lib.free(ptr, handed.size, handed.device, nullptr);
  const uvm_status status = lib.last_status();
  bool still_uvms = false;
  cudaError_t error = cudaSuccess;
  if (status != UVM_OK) {
    error = cuda_error_of(lib, status);
    std::fprintf(stderr, "uvm preload (pid %d): cudaFree(%p): %s\n", static_cast<int>(getpid()), ptr, lib.last_error());
    void* base = nullptr;
    size_t size = 0;
    int device = 0;
    still_uvms = lib.allocation_info(ptr, &base, &size, &device) == UVM_OK && base == ptr;
  }
  if (!still_uvms) {
    std::lock_guard<std::mutex> hold(state().lock);
    if (auto it = state().handed.find(ptr); it != state().handed.end() && it->second.serial == handed.serial) {
      state().handed.erase(it);
    }
  }
  return error;
}

// Stops at the first failure, as uvm_pause does within a call.
uvm_status for_tags(const char* tag, uvm_status (*move)(int, const char*)) {
  if (tag != nullptr) return move(UVM_ANY_DEVICE, tag);
  std::deque<std::string> known;
  try {
    std::lock_guard<std::mutex> hold(state().lock);
    known = state().tags;
  } catch (...) {
    return UVM_ERROR_INTERNAL;  // no host memory for the copy
  }
  for (const std::string& name : known) {
    if (const uvm_status status = move(UVM_ANY_DEVICE, name.c_str()); status != UVM_OK) return status;
  }
  return UVM_OK;
}

}  // namespace

const Libuvm* libuvm() {
  State& kept = state();
  if (kept.opened.load(std::memory_order_acquire)) return &kept.entries;
  if (!kept.at_first_need) return nullptr;
  std::lock_guard<std::mutex> one_opener(kept.opening);
  if (!kept.opened.load(std::memory_order_relaxed) && open_beside_runtime()) {
    kept.opened.store(true, std::memory_order_release);
  }
  return kept.opened.load(std::memory_order_relaxed) ? &kept.entries : nullptr;
}

uvm_backup cpu_backup_of(CpuBackend backend) { return backend == CpuBackend::mmap ? UVM_BACKUP_MMAP : UVM_BACKUP_HOST; }

ThreadState& thread_state() {
  thread_local ThreadState thread;
  thread_local bool started = false;
  if (!started) {
    started = true;
    const char* backend = std::getenv("TMS_INIT_CPU_BACKUP_BACKEND");
    thread.cpu_backup_backend = backend != nullptr && !std::strcmp(backend, "mmap") ? CpuBackend::mmap : CpuBackend::pinned;
    thread.inside_region = env_flag("TMS_INIT_ENABLE");
    thread.initial_settings_pending = thread.inside_region;
  }
  if (thread.initial_settings_pending) {
    // Applied once libuvm is open: opened at first need, it may not be at the thread's first call.
    if (const Libuvm* lib = libuvm()) {
      thread.initial_settings_pending = false;
      lib->set_thread_tag("default");
      lib->set_thread_backup(env_flag("TMS_INIT_ENABLE_CPU_BACKUP") ? cpu_backup_of(thread.cpu_backup_backend)
                                                                   : UVM_BACKUP_NONE);
    }
  }
  return thread;
}

}  // namespace uvm_preload

using namespace uvm_preload;

extern "C" {

// No C++ exception leaves an entry: the catch-alls answer as the runtime would with no host memory.
UVM_API cudaError_t cudaMalloc(void** ptr, size_t size) {
  try {
    if (thread_state().inside_region) return allocate_in_region(ptr, size);
    const Malloc real = runtime_malloc.get();
    return real != nullptr ? real(ptr, size) : cudaErrorInitializationError;
  } catch (...) {
    return cudaErrorMemoryAllocation;
  }
}

UVM_API cudaError_t cudaFree(void* ptr) {
  try {
    if (ptr != nullptr) {
      Handed found{};
      bool ours = false;
      {
        std::lock_guard<std::mutex> hold(state().lock);
        if (auto it = state().handed.find(ptr); it != state().handed.end()) {
          found = it->second;
          ours = true;
        }
      }
      if (ours) return free_handed(ptr, found);
    }
    const Free real = runtime_free.get();
    return real != nullptr ? real(ptr) : cudaErrorInitializationError;
  } catch (...) {
    return cudaErrorUnknown;
  }
}

// This library's own cudaMalloc: taking &cudaMalloc here would give whichever definition the
// process resolves first, the runtime's when this library was only opened.
extern cudaError_t own_cuda_malloc(void**, size_t) __attribute__((alias("cudaMalloc"), visibility("hidden")));

// The global scope's cudaMalloc, not RTLD_DEFAULT's: from inside a library, RTLD_DEFAULT also searches
// that library's own scope, and so found this cudaMalloc where the interposer was only opened.
UVM_API int uvm_preload_active(void) {
  void* global_scope = dlopen(nullptr, RTLD_NOW);
  const bool ours = global_scope != nullptr && dlsym(global_scope, "cudaMalloc") == reinterpret_cast<void*>(&own_cuda_malloc);
  if (global_scope != nullptr) dlclose(global_scope);
  return ours ? 1 : 0;
}

UVM_API const char* uvm_preload_load_error(void) { return libuvm() != nullptr ? nullptr : load_error(); }

UVM_API const char* uvm_preload_libuvm_path(void) {
  libuvm();  // opened at first need: this asks for it
  return state().libuvm_path.c_str();
}

UVM_API uvm_status uvm_preload_set_region(int inside) {
  thread_state().inside_region = inside != 0;
  return UVM_OK;
}

UVM_API int uvm_preload_get_region(void) { return thread_state().inside_region ? 1 : 0; }

UVM_API uvm_status uvm_preload_set_region_device(int device) {
  if (device < 0 && device != UVM_ANY_DEVICE) return UVM_ERROR_INVALID_ARGUMENT;
  thread_state().region_device = device;
  return UVM_OK;
}

UVM_API int uvm_preload_get_region_device(void) { return thread_state().region_device; }

UVM_API uvm_status uvm_preload_pause(const char* tag) {
  return libuvm() ? for_tags(tag, libuvm()->pause) : UVM_ERROR_UNSUPPORTED;
}

UVM_API uvm_status uvm_preload_resume(const char* tag) {
  return libuvm() ? for_tags(tag, libuvm()->resume) : UVM_ERROR_UNSUPPORTED;
}

UVM_API const char* uvm_preload_tag_name(size_t index) {
  std::lock_guard<std::mutex> hold(state().lock);
  return index < state().tags.size() ? state().tags[index].c_str() : nullptr;
}

UVM_API size_t uvm_preload_live_allocations(void) {
  std::lock_guard<std::mutex> hold(state().lock);  // std::mutex::lock throws only on a broken mutex
  return state().handed.size();
}

}  // extern "C"
