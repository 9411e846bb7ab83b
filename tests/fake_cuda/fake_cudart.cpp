// Definitions of the CUDA runtime calls uvm uses, against a simulated machine (see fake_cuda.hpp).
#include <cuda.h>
#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>
#include <cuda_runtime_api.h>

#include <cstdint>
#include <cstdlib>
#include <cstdio>
#include <cstring>
#include <iterator>
#include <map>
#include <chrono>
#include <condition_variable>
#include <mutex>
#include <set>
#include <string>
#include <vector>

#include "../../offload/coder/codec.hpp"
#include "fake_cuda.hpp"

namespace {

struct DeviceModel {
  bool managed;
  bool concurrent;
  size_t total_memory;
};

const DeviceModel kDevices[] = {
    {true, true, size_t{1} << 30}, {true, true, size_t{512} << 20}, {true, false, size_t{256} << 20}};
constexpr int kDeviceCount = 3;

// What the driver believes about a managed byte, as measured with bench/probes/transfer_probe.cu (hazard
// mode): a discard marks bytes discardable; a copy into them restores the data but not the
// driver's belief; a prefetch to a device after such a write undoes the discard. A prefetch to the
// CPU drops bytes still marked (they arrive as zeros). A prefetch before the write is modelled as
// not undoing it: on the device it did not, for the first chunk on each stream.
enum class Discard : uint8_t { none, discarded, rewritten };

// The discard state of an allocation's bytes as runs: offset of a run's first byte -> its state,
// each run reaching to the next key (the last to the allocation's end). Empty: all none. Runs, not
// a byte each, so that a 64 MiB slab costs a few entries, not 64 MiB.
using DiscardRuns = std::map<size_t, Discard>;

struct Allocation {
  size_t size;
  DiscardRuns discard;
};

struct LocationRecord {
  uintptr_t begin, end;
  int location;
};

struct World {
  std::mutex mutex;
  std::map<uintptr_t, Allocation> allocations;
  std::vector<fake::Op> ops;
  std::vector<LocationRecord> preferred, prefetched;
  struct Injection {
    cudaError_t error;
    int skip;  // calls that pass first
  };
  std::map<std::string, Injection> injected;
  std::set<cudaStream_t> capturing;  // each in the global mode
  bool capture_invalidated = false;
  bool context_created[kDeviceCount] = {};
  uintptr_t next_stream = 0x1000;
  std::map<void*, size_t> pinned;  // mmap'ed, so a 256 MiB block costs only the pages touched
  std::map<void*, size_t> registered;  // the caller's memory, pinned by cudaHostRegister
  std::set<cudaEvent_t> live_events;
  // Events recorded while events_pending is set are not reached yet: cudaEventQuery says
  // cudaErrorNotReady until cudaEventSynchronize waits for one (the work before it "runs" then).
  bool events_pending = false;
  std::set<cudaEvent_t> pending_events;
  // Events with timing (cudaEventCreate) and where each was recorded on a virtual clock, in
  // microseconds, that every logged op advances (see advance()).
  std::set<cudaEvent_t> timing_events;
  std::map<cudaEvent_t, double> recorded_at;
  double clock_us = 0;
  // Virtual memory management: reserved ranges (mmap'ed PROT_NONE until mapped) and physical
  // handles. Mapping fills the range with kFreshPhysical, as new physical memory holds no data.
  struct Reservation {
    size_t size;
    CUmemGenericAllocationHandle mapped = 0;
  };
  std::map<uintptr_t, Reservation> reservations;
  void* next_reservation_at = nullptr;  // reserve_next_at
  std::map<CUmemGenericAllocationHandle, size_t> handles;
  // Physical memory asked to be exportable (CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR) lives in a
  // memfd from its creation, mapped shared, so that it keeps its bytes unmapped and mapped again at
  // another address, and another process (a fork) maps the same pages; its first map fills it as
  // fresh memory does (`unfilled`). An imported handle's memory is mapped as it is, never filled.
  // Memory made otherwise keeps no bytes once unmapped (no test needs it to).
  std::set<CUmemGenericAllocationHandle> exportable;
  std::map<CUmemGenericAllocationHandle, int> memfds;
  std::set<CUmemGenericAllocationHandle> imported;
  std::set<CUmemGenericAllocationHandle> unfilled;
  CUmemGenericAllocationHandle next_handle = 1;
  bool last_created_rdma_capable = false;
};

World& world() {
  static World* w = new World();
  return *w;
}

std::string scenario() {
  const char* s = std::getenv("FAKE_CUDA_SCENARIO");
  return s ? s : "";
}

thread_local int current_context = fake::kNoContext;
thread_local int selected_device = 0;
thread_local cudaError_t pending = cudaSuccess;
thread_local cudaStreamCaptureMode capture_mode = cudaStreamCaptureModeGlobal;

cudaError_t set_error(cudaError_t e) {
  if (e != cudaSuccess) pending = e;
  return e;
}

// fake::hold_next's gate, apart from the World mutex so that a held call blocks no other call.
struct Gate {
  std::mutex mutex;
  std::condition_variable changed;
  std::string armed;  // the call to hold next
  int skip = 0;       // calls of it to let through first
  bool open = true;
  int waiting = 0;
  std::multiset<std::string> held;       // the calls waiting, by name
  std::set<std::string> let_through;     // release_held(call): those go on while the others wait
};

Gate& gate() {
  static Gate instance;
  return instance;
}

void pass_gate(const char* call) {
  Gate& g = gate();
  std::unique_lock<std::mutex> lock(g.mutex);
  if (g.armed != call) return;
  if (g.skip > 0) {
    --g.skip;
    return;
  }
  g.armed.clear();
  ++g.waiting;
  g.held.insert(call);
  g.changed.notify_all();
  g.changed.wait(lock, [&] { return g.open || g.let_through.count(call) != 0; });
  --g.waiting;
  g.held.erase(g.held.find(call));
  if (g.held.count(call) == 0) g.let_through.erase(call);
}

// Whether the call named `call` fails now, with which error: an injection whose skipped calls have
// passed (World mutex held by caller).
bool take_injection(World& w, const char* call, cudaError_t* error) {
  auto it = w.injected.find(call);
  if (it == w.injected.end()) return false;
  if (it->second.skip > 0) {
    --it->second.skip;
    return false;
  }
  *error = it->second.error;
  w.injected.erase(it);
  return true;
}

// The same for a runtime call, which also leaves its error for cudaGetLastError.
bool injected(World& w, const char* call, cudaError_t* error) {
  if (!take_injection(w, call, error)) return false;
  set_error(*error);
  return true;
}

// The same, for calls that do not hold the World mutex otherwise.
bool injected_now(const char* call, cudaError_t* error) {
  std::lock_guard<std::mutex> lock(world().mutex);
  return injected(world(), call, error);
}
bool injected_driver_now(const char* call, CUresult* result);

// The runtime creates the selected device's context on the first call that needs one.
int ensure_context(World& w) {
  if (current_context == fake::kNoContext) {
    current_context = selected_device;
    w.context_created[selected_device] = true;
  }
  return current_context;
}

#if CUDART_VERSION >= 12020
int decode(cudaMemLocation location) {
  return location.type == cudaMemLocationTypeHost ? cudaCpuDeviceId : location.id;
}
#endif

// A mapped reservation holding [ptr, ptr + size): device memory a copy may touch.
bool inside_mapped_reservation(World& w, const void* ptr, size_t size) {
  const auto begin = reinterpret_cast<uintptr_t>(ptr);
  auto it = w.reservations.upper_bound(begin);
  if (it == w.reservations.begin()) return false;
  --it;
  return it->second.mapped != 0 && begin >= it->first && begin + size <= it->first + it->second.size;
}

bool inside_one_allocation(World& w, const void* ptr, size_t size) {
  if (inside_mapped_reservation(w, ptr, size)) return true;
  const auto begin = reinterpret_cast<uintptr_t>(ptr);
  auto it = w.allocations.upper_bound(begin);
  if (it == w.allocations.begin()) return false;
  --it;
  return begin + size <= it->first + it->second.size && begin >= it->first;
}

int query(const std::vector<LocationRecord>& records, uintptr_t begin, uintptr_t end) {
  for (auto it = records.rbegin(); it != records.rend(); ++it) {
    if (it->end <= begin || it->begin >= end) continue;
    if (it->begin <= begin && it->end >= end) return it->location;
    return cudaInvalidDeviceId;  // the latest record covers only part: mixed
  }
  return cudaInvalidDeviceId;
}

// Fake context handles: addresses inside this array stand for the primary contexts.
char context_handles[kDeviceCount];
CUcontext handle_of(int device) { return reinterpret_cast<CUcontext>(&context_handles[device]); }

CUresult fake_ctx_get_current(CUcontext* ctx) {
  if (CUresult r; injected_driver_now("cuCtxGetCurrent", &r)) return r;
  *ctx = current_context == fake::kNoContext ? nullptr : handle_of(current_context);
  return CUDA_SUCCESS;
}
CUresult fake_ctx_set_current(CUcontext ctx) {
  if (CUresult r; injected_driver_now("cuCtxSetCurrent", &r)) return r;
  current_context = ctx == nullptr ? fake::kNoContext
                                   : static_cast<int>(reinterpret_cast<char*>(ctx) - context_handles);
  if (ctx != nullptr) {
    std::lock_guard<std::mutex> lock(world().mutex);
    world().context_created[current_context] = true;
  }
  return CUDA_SUCCESS;
}
CUresult fake_device_get(CUdevice* device, int ordinal) {
  if (CUresult r; injected_driver_now("cuDeviceGet", &r)) return r;
  if (ordinal < 0 || ordinal >= kDeviceCount) return CUDA_ERROR_INVALID_DEVICE;
  *device = ordinal;
  return CUDA_SUCCESS;
}
// Device 0 can register VMM memory with a NIC (GPUDirect RDMA); the others cannot. Every device
// can export VMM memory as a POSIX file descriptor, except in the scenario no_export.
CUresult fake_device_get_attribute(int* value, CUdevice_attribute attribute, CUdevice device) {
  if (CUresult r; injected_driver_now("cuDeviceGetAttribute", &r)) return r;
  if (device < 0 || device >= kDeviceCount) return CUDA_ERROR_INVALID_DEVICE;
  if (attribute == CU_DEVICE_ATTRIBUTE_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR_SUPPORTED) {
    *value = scenario() == "no_export" ? 0 : 1;
    return CUDA_SUCCESS;
  }
  if (attribute != CU_DEVICE_ATTRIBUTE_GPU_DIRECT_RDMA_WITH_CUDA_VMM_SUPPORTED) return CUDA_ERROR_INVALID_VALUE;
  *value = device == 0 ? 1 : 0;
  return CUDA_SUCCESS;
}
CUresult fake_primary_ctx_retain(CUcontext* ctx, CUdevice device) {
  if (CUresult r; injected_driver_now("cuDevicePrimaryCtxRetain", &r)) return r;
  std::lock_guard<std::mutex> lock(world().mutex);
  world().context_created[device] = true;
  *ctx = handle_of(device);
  return CUDA_SUCCESS;
}

// Applies `change` to the discard state of [ptr, ptr + size), which lies inside one allocation
// (checked by the caller): `change(state, first_byte, bytes)` for each run of one state in it,
// which may set the state and write the bytes. Only allocations a discard touched (`start`) have
// a state: on the others every change is a no-op.
template <typename Change>
void update_discard(World& w, const void* ptr, size_t size, Change change, bool start = false) {
  const auto begin = reinterpret_cast<uintptr_t>(ptr);
  auto it = std::prev(w.allocations.upper_bound(begin));
  DiscardRuns& runs = it->second.discard;
  if (runs.empty()) {
    if (!start) return;
    runs[0] = Discard::none;
  }
  const size_t from = begin - it->first, to = from + size;
  // Runs start exactly at `from` and `to`: split the runs holding them.
  for (const size_t cut : {from, to}) {
    if (cut >= it->second.size) continue;
    auto holder = std::prev(runs.upper_bound(cut));
    if (holder->first != cut) runs[cut] = holder->second;
  }
  for (auto run = runs.find(from); run != runs.end() && run->first < to; ++run) {
    const size_t end = std::next(run) == runs.end() ? it->second.size : std::next(run)->first;
    change(run->second, reinterpret_cast<char*>(it->first + run->first), std::min(end, to) - run->first);
  }
  // Merge runs of one state, so the map stays small.
  for (auto run = runs.begin(); run != runs.end();) {
    auto next = std::next(run);
    if (next != runs.end() && next->second == run->second) runs.erase(next);
    else run = next;
  }
}

// The virtual clock: a microsecond an op, plus the bytes a copy or prefetch moves at
// fake::kCopyBytesPerMicrosecond / fake::kPrefetchBytesPerMicrosecond.
void advance(World& w, fake::OpKind call, size_t size) {
  w.clock_us += 1;
  if (call == fake::OpKind::copy_to_host || call == fake::OpKind::copy_to_device) {
    w.clock_us += static_cast<double>(size) / fake::kCopyBytesPerMicrosecond;
  } else if (call == fake::OpKind::prefetch) {
    w.clock_us += static_cast<double>(size) / fake::kPrefetchBytesPerMicrosecond;
  }
}

void log(World& w, fake::OpKind call, const void* ptr, size_t size, int location, cudaStream_t stream) {
  advance(w, call, size);
  w.ops.push_back(fake::Op{call, ptr, size, location, stream, current_context});
}

cudaError_t advise_at(const void* ptr, size_t size, cudaMemoryAdvise advice, int where) {
  World& w = world();
  std::lock_guard<std::mutex> lock(w.mutex);
  cudaError_t error;
  if (injected(w, "cudaMemAdvise", &error)) return error;
  ensure_context(w);
  if (!inside_one_allocation(w, ptr, size)) return set_error(cudaErrorInvalidValue);
  const auto begin = reinterpret_cast<uintptr_t>(ptr);
  if (advice == cudaMemAdviseSetPreferredLocation) {
    w.preferred.push_back({begin, begin + size, where});
    log(w, fake::OpKind::advise_preferred, ptr, size, where, nullptr);
  } else if (advice == cudaMemAdviseSetAccessedBy) {
    log(w, fake::OpKind::advise_accessed_by, ptr, size, where, nullptr);
  } else {
    return set_error(cudaErrorInvalidValue);
  }
  return cudaSuccess;
}

cudaError_t prefetch_to(const void* ptr, size_t size, int where, unsigned int flags, cudaStream_t stream) {
  World& w = world();
  std::lock_guard<std::mutex> lock(w.mutex);
  cudaError_t error;
  if (injected(w, "cudaMemPrefetchAsync", &error)) return error;
  ensure_context(w);
  if (flags != 0 || !inside_one_allocation(w, ptr, size)) return set_error(cudaErrorInvalidValue);
  if (w.capturing.count(stream)) return set_error(cudaErrorStreamCaptureUnsupported);
  if (where != cudaCpuDeviceId && !kDevices[where].concurrent) return set_error(cudaErrorInvalidDevice);
  const auto begin = reinterpret_cast<uintptr_t>(ptr);
  w.prefetched.push_back({begin, begin + size, where});
  log(w, fake::OpKind::prefetch, ptr, size, where, stream);
  update_discard(w, ptr, size, [where](Discard& state, char* bytes, size_t count) {
    if (where == cudaCpuDeviceId && state != Discard::none) {
      std::memset(bytes, 0, count);
      state = Discard::none;
    } else if (where != cudaCpuDeviceId && state == Discard::rewritten) {
      state = Discard::none;
    }
  });
  return cudaSuccess;
}

// An injected failure for a driver call: CUDA_ERROR_OUT_OF_MEMORY for cudaErrorMemoryAllocation,
// else CUDA_ERROR_INVALID_VALUE. The driver API leaves no runtime error pending.
bool injected_driver(World& w, const char* call, CUresult* result) {
  cudaError_t error = cudaSuccess;
  if (!take_injection(w, call, &error)) return false;
  // The driver's code for the runtime's: the numbers match except out of memory (2 and 2 differ in
  // name only; both are CUDA_ERROR_OUT_OF_MEMORY here).
  *result = error == cudaErrorMemoryAllocation ? CUDA_ERROR_OUT_OF_MEMORY : static_cast<CUresult>(error);
  return true;
}

bool injected_driver_now(const char* call, CUresult* result) {
  std::lock_guard<std::mutex> lock(world().mutex);
  return injected_driver(world(), call, result);
}

constexpr size_t kGranularity = size_t{64} << 10;

CUresult fake_get_error_name(CUresult result, const char** name) {
  *name = result == CUDA_ERROR_OUT_OF_MEMORY ? "CUDA_ERROR_OUT_OF_MEMORY"
          : result == CUDA_ERROR_INVALID_VALUE ? "CUDA_ERROR_INVALID_VALUE"
          : result == CUDA_ERROR_ILLEGAL_ADDRESS ? "CUDA_ERROR_ILLEGAL_ADDRESS"
          : result == CUDA_ERROR_LAUNCH_FAILED   ? "CUDA_ERROR_LAUNCH_FAILED"
                                               : "CUDA_ERROR_UNKNOWN";
  return CUDA_SUCCESS;
}

CUresult fake_mem_get_granularity(size_t* granularity, const CUmemAllocationProp* prop, CUmemAllocationGranularity_flags) {
  if (CUresult r; injected_driver_now("cuMemGetAllocationGranularity", &r)) return r;
  if (prop->location.type != CU_MEM_LOCATION_TYPE_DEVICE || prop->location.id >= kDeviceCount) return CUDA_ERROR_INVALID_VALUE;
  *granularity = kGranularity;
  return CUDA_SUCCESS;
}

CUresult fake_mem_address_reserve(CUdeviceptr* ptr, size_t size, size_t alignment, CUdeviceptr, unsigned long long) {
  World& w = world();
  std::lock_guard<std::mutex> lock(w.mutex);
  CUresult r;
  if (injected_driver(w, "cuMemAddressReserve", &r)) return r;
  if (size == 0 || size % kGranularity || alignment % kGranularity) return CUDA_ERROR_INVALID_VALUE;
  void* range = mmap(w.next_reservation_at, size, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
  w.next_reservation_at = nullptr;
  if (range == MAP_FAILED) return CUDA_ERROR_OUT_OF_MEMORY;
  w.reservations[reinterpret_cast<uintptr_t>(range)] = World::Reservation{size};
  *ptr = reinterpret_cast<CUdeviceptr>(range);
  return CUDA_SUCCESS;
}

CUresult fake_mem_address_free(CUdeviceptr ptr, size_t size) {
  World& w = world();
  std::lock_guard<std::mutex> lock(w.mutex);
  CUresult r;
  if (injected_driver(w, "cuMemAddressFree", &r)) return r;
  auto it = w.reservations.find(ptr);
  if (it == w.reservations.end() || it->second.size != size || it->second.mapped) return CUDA_ERROR_INVALID_VALUE;
  munmap(reinterpret_cast<void*>(ptr), size);
  w.reservations.erase(it);
  return CUDA_SUCCESS;
}

CUresult fake_mem_create(CUmemGenericAllocationHandle* handle, size_t size, const CUmemAllocationProp* prop,
                         unsigned long long) {
  pass_gate("cuMemCreate");
  World& w = world();
  std::lock_guard<std::mutex> lock(w.mutex);
  CUresult r;
  if (injected_driver(w, "cuMemCreate", &r)) return r;
  if (size % kGranularity || prop->type != CU_MEM_ALLOCATION_TYPE_PINNED) return CUDA_ERROR_INVALID_VALUE;
  *handle = w.next_handle++;
  w.handles[*handle] = size;
  if (prop->requestedHandleTypes & CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR) {
    const int made = memfd_create("fake-physical-memory", MFD_CLOEXEC);
    if (made < 0 || ftruncate(made, static_cast<off_t>(size)) != 0) {
      if (made >= 0) close(made);
      w.handles.erase(*handle);
      return CUDA_ERROR_OUT_OF_MEMORY;
    }
    w.memfds[*handle] = made;
    w.exportable.insert(*handle);
    w.unfilled.insert(*handle);
  }
  w.last_created_rdma_capable = prop->allocFlags.gpuDirectRDMACapable != 0;
  log(w, fake::OpKind::vmm_create, nullptr, size, prop->location.id, nullptr);
  return CUDA_SUCCESS;
}

CUresult fake_mem_release(CUmemGenericAllocationHandle handle) {
  World& w = world();
  std::lock_guard<std::mutex> lock(w.mutex);
  CUresult r;
  if (injected_driver(w, "cuMemRelease", &r)) return r;
  for (const auto& r : w.reservations) {
    if (r.second.mapped == handle) return CUDA_ERROR_INVALID_VALUE;  // still mapped (the fake is strict)
  }
  auto it = w.handles.find(handle);
  if (it == w.handles.end()) return CUDA_ERROR_INVALID_VALUE;
  log(w, fake::OpKind::vmm_release, nullptr, it->second, -2, nullptr);
  w.handles.erase(it);
  if (auto memfd = w.memfds.find(handle); memfd != w.memfds.end()) {
    close(memfd->second);
    w.memfds.erase(memfd);
  }
  w.imported.erase(handle);
  w.exportable.erase(handle);
  w.unfilled.erase(handle);
  return CUDA_SUCCESS;
}

CUresult fake_mem_map(CUdeviceptr ptr, size_t size, size_t offset, CUmemGenericAllocationHandle handle,
                      unsigned long long) {
  World& w = world();
  std::lock_guard<std::mutex> lock(w.mutex);
  CUresult r;
  if (injected_driver(w, "cuMemMap", &r)) return r;
  auto it = w.reservations.find(ptr);
  auto h = w.handles.find(handle);
  if (it == w.reservations.end() || h == w.handles.end() || it->second.mapped || offset != 0 ||
      size != it->second.size || size != h->second) {
    return CUDA_ERROR_INVALID_VALUE;
  }
  it->second.mapped = handle;
  void* range = reinterpret_cast<void*>(ptr);
  if (auto memfd = w.memfds.find(handle); memfd != w.memfds.end()) {
    if (mmap(range, size, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_FIXED, memfd->second, 0) == MAP_FAILED) {
      it->second.mapped = 0;
      return CUDA_ERROR_OUT_OF_MEMORY;
    }
  } else {
    mprotect(range, size, PROT_READ | PROT_WRITE);
  }
  const bool keeps_bytes = w.imported.count(handle) || (w.exportable.count(handle) && !w.unfilled.count(handle));
  if (!keeps_bytes) std::memset(range, fake::kFreshPhysical, size);
  w.unfilled.erase(handle);
  log(w, fake::OpKind::vmm_map, range, size, -2, nullptr);
  return CUDA_SUCCESS;
}

CUresult fake_mem_unmap(CUdeviceptr ptr, size_t size) {
  World& w = world();
  std::lock_guard<std::mutex> lock(w.mutex);
  CUresult r;
  if (injected_driver(w, "cuMemUnmap", &r)) return r;
  auto it = w.reservations.find(ptr);
  if (it == w.reservations.end() || !it->second.mapped || size != it->second.size) return CUDA_ERROR_INVALID_VALUE;
  const bool shared = w.memfds.count(it->second.mapped) != 0;
  it->second.mapped = 0;
  void* range = reinterpret_cast<void*>(ptr);
  if (shared) {  // the memfd's pages stay its handle's; the range is reserved again
    mmap(range, size, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE | MAP_FIXED, -1, 0);
  } else {
    madvise(range, size, MADV_DONTNEED);
    mprotect(range, size, PROT_NONE);  // touching released memory faults, as on the device
  }
  log(w, fake::OpKind::vmm_unmap, range, size, -2, nullptr);
  return CUDA_SUCCESS;
}

CUresult fake_mem_set_access(CUdeviceptr ptr, size_t size, const CUmemAccessDesc* desc, size_t count) {
  World& w = world();
  std::lock_guard<std::mutex> lock(w.mutex);
  CUresult r;
  if (injected_driver(w, "cuMemSetAccess", &r)) return r;
  auto it = w.reservations.find(ptr);
  if (it == w.reservations.end() || !it->second.mapped || size != it->second.size || count != 1 ||
      desc->flags != CU_MEM_ACCESS_FLAGS_PROT_READWRITE) {
    return CUDA_ERROR_INVALID_VALUE;
  }
  return CUDA_SUCCESS;
}

CUresult fake_mem_export(void* shareable, CUmemGenericAllocationHandle handle, CUmemAllocationHandleType type,
                         unsigned long long flags) {
  World& w = world();
  std::lock_guard<std::mutex> lock(w.mutex);
  CUresult r;
  if (injected_driver(w, "cuMemExportToShareableHandle", &r)) return r;
  if (type != CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR || flags != 0 ||
      (!w.exportable.count(handle) && !w.imported.count(handle))) {
    return CUDA_ERROR_INVALID_VALUE;  // not made exportable, as the driver answers
  }
  const auto memfd = w.memfds.find(handle);  // made with the memory (fake_mem_create)
  const int fd = fcntl(memfd->second, F_DUPFD_CLOEXEC, 0);
  if (fd < 0) return CUDA_ERROR_OUT_OF_MEMORY;
  *static_cast<int*>(shareable) = fd;
  return CUDA_SUCCESS;
}

CUresult fake_mem_import(CUmemGenericAllocationHandle* handle, void* shareable, CUmemAllocationHandleType type) {
  World& w = world();
  std::lock_guard<std::mutex> lock(w.mutex);
  CUresult r;
  if (injected_driver(w, "cuMemImportFromShareableHandle", &r)) return r;
  const int fd = static_cast<int>(reinterpret_cast<uintptr_t>(shareable));
  struct stat about {};
  if (type != CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR || fstat(fd, &about) != 0 || about.st_size <= 0) {
    return CUDA_ERROR_INVALID_VALUE;
  }
  const int memfd = fcntl(fd, F_DUPFD_CLOEXEC, 0);
  if (memfd < 0) return CUDA_ERROR_OUT_OF_MEMORY;
  *handle = w.next_handle++;
  w.handles[*handle] = static_cast<size_t>(about.st_size);
  w.memfds[*handle] = memfd;
  w.imported.insert(*handle);
  return CUDA_SUCCESS;
}

// Modules and kernels: uvm's copy kernel and the compressed backups' coder are known. A launch of
// the copy kernel copies as the GPU would, from pinned host memory (one block or registration) into
// mapped device memory (releasable); a launch of the coder's kernels runs the reference coder
// (offload/coder/codec.hpp) on device memory, which is what the GPU kernels must match.
const CUmodule kCopyModule = reinterpret_cast<CUmodule>(0x5eed);
const CUmodule kCodecModule = reinterpret_cast<CUmodule>(0xc0de);
const CUfunction kCopyFunction = reinterpret_cast<CUfunction>(0xc0b1);
const char* const kCodecFunctions[] = {"uvm_codec_choose", "uvm_codec_encode", "uvm_codec_decode"};
CUfunction codec_function(size_t index) { return reinterpret_cast<CUfunction>(0xc0d0 + index); }

CUresult fake_module_load_data(CUmodule* module, const void* image) {
  World& w = world();
  std::lock_guard<std::mutex> lock(w.mutex);
  CUresult r;
  if (injected_driver(w, "cuModuleLoadData", &r)) return r;
  ensure_context(w);
  const char* text = static_cast<const char*>(image);
  if (std::strstr(text, ".entry uvm_copy_words(") != nullptr) {
    *module = kCopyModule;
  } else if (std::strstr(text, ".entry uvm_codec_choose(") != nullptr) {
    *module = kCodecModule;
  } else {
    return CUDA_ERROR_INVALID_VALUE;
  }
  return CUDA_SUCCESS;
}

CUresult fake_module_get_function(CUfunction* function, CUmodule module, const char* name) {
  if (CUresult r; injected_driver_now("cuModuleGetFunction", &r)) return r;
  if (module == kCopyModule && std::strcmp(name, "uvm_copy_words") == 0) {
    *function = kCopyFunction;
    return CUDA_SUCCESS;
  }
  for (size_t i = 0; module == kCodecModule && i < 3; ++i) {
    if (std::strcmp(name, kCodecFunctions[i]) == 0) {
      *function = codec_function(i);
      return CUDA_SUCCESS;
    }
  }
  return CUDA_ERROR_INVALID_VALUE;
}

bool inside_pinned_host(World& w, const char* host, size_t size) {
  for (const auto* blocks : {&w.pinned, &w.registered}) {
    for (const auto& [block, bytes] : *blocks) {
      const auto* begin = static_cast<const char*>(block);
      if (host >= begin && host + size <= begin + bytes) return true;
    }
  }
  return false;
}

// One launch of the coder's kernel `index` (grid of `chunks` blocks) on device memory, as
// codec_kernels.cu runs it.
// The kernels load and store 16 bytes at a time from their source and destination (one uint4 a
// thread): a pointer that is not 16-byte aligned is a misaligned access on the GPU, which loses the
// context (an H200 did: issue 73), so the double refuses it as the GPU would fail it.
bool aligned_16(const void* ptr) { return reinterpret_cast<uintptr_t>(ptr) % 16 == 0; }

CUresult run_codec(World& w, size_t index, unsigned chunks, void** params) {
  namespace codec = uvm::codec;
  const auto* src = *static_cast<const uint8_t**>(params[0]);
  if (!aligned_16(src) || (index > 0 && !aligned_16(*static_cast<void**>(params[3])))) {
    return CUDA_ERROR_MISALIGNED_ADDRESS;
  }
  std::vector<uint16_t> words(codec::kChunkWords);
  if (index == 0) {  // choose(src, flags, host_flags): host_flags null or pinned host memory
    auto* flags = *static_cast<uint8_t**>(params[1]);
    auto* host_flags = *static_cast<uint8_t**>(params[2]);
    if (!inside_one_allocation(w, src, size_t{chunks} * codec::kChunkBytes) || !inside_one_allocation(w, flags, chunks) ||
        (host_flags != nullptr && !inside_pinned_host(w, reinterpret_cast<const char*>(host_flags), chunks))) {
      return CUDA_ERROR_ILLEGAL_ADDRESS;
    }
    for (unsigned c = 0; c < chunks; ++c) {
      std::memcpy(words.data(), src + size_t{c} * codec::kChunkBytes, codec::kChunkBytes);
      flags[c] = codec::choose(words.data());
      if (host_flags != nullptr) host_flags[c] = flags[c];
    }
    return CUDA_SUCCESS;
  }
  const auto* flags = *static_cast<const uint8_t**>(params[1]);
  const uint64_t first = *static_cast<uint64_t*>(params[2]);
  auto* dst = *static_cast<uint8_t**>(params[3]);
  size_t stored = 0;  // the batch's stored bytes before each chunk
  for (unsigned b = 0; b < chunks; ++b) stored += codec::stored_bytes(flags[first + b]);
  const size_t raw = size_t{chunks} * codec::kChunkBytes;
  if (!inside_one_allocation(w, src, index == 1 ? raw : stored) || !inside_one_allocation(w, dst, index == 1 ? stored : raw)) {
    return CUDA_ERROR_ILLEGAL_ADDRESS;
  }
  size_t at = 0;
  for (unsigned b = 0; b < chunks; ++b) {
    const uint8_t flag = flags[first + b];
    const size_t raw_at = size_t{b} * codec::kChunkBytes;
    if (flag == codec::kRaw) {
      std::memcpy(index == 1 ? dst + at : dst + raw_at, index == 1 ? src + raw_at : src + at, codec::kChunkBytes);
    } else if (index == 1) {
      std::memcpy(words.data(), src + raw_at, codec::kChunkBytes);
      codec::encode(words.data(), flag, dst + at);
    } else {
      codec::decode(src + at, flag, words.data());
      std::memcpy(dst + raw_at, words.data(), codec::kChunkBytes);
    }
    at += codec::stored_bytes(flag);
  }
  // A kernel's writes restore discarded managed bytes as a copy's do, and leave the driver's belief
  // as a copy does (device_wrote): uvm prefetches them to the device after.
  if (index == 2 && !inside_mapped_reservation(w, dst, raw)) {
    update_discard(w, dst, raw, [](Discard& state, char*, size_t) {
      if (state == Discard::discarded) state = Discard::rewritten;
    });
  }
  return CUDA_SUCCESS;
}

CUresult fake_launch_kernel(CUfunction function, unsigned grid_x, unsigned grid_y, unsigned grid_z, unsigned block_x,
                            unsigned block_y, unsigned block_z, unsigned shared, CUstream stream, void** params,
                            void** extra) {
  World& w = world();
  std::lock_guard<std::mutex> lock(w.mutex);
  CUresult r;
  if (injected_driver(w, "cuLaunchKernel", &r)) return r;
  const int device = ensure_context(w);
  for (size_t i = 0; i < 3; ++i) {
    if (function != codec_function(i)) continue;
    if (grid_x == 0 || grid_y * grid_z != 1 || block_x * block_y * block_z != 256 || params == nullptr) {
      return CUDA_ERROR_INVALID_VALUE;
    }
    const CUresult run = run_codec(w, i, grid_x, params);
    if (run == CUDA_SUCCESS) log(w, fake::OpKind::codec_kernel, *static_cast<void**>(params[0]), grid_x, device, reinterpret_cast<cudaStream_t>(stream));
    return run;
  }
  if (function != kCopyFunction || grid_x * grid_y * grid_z == 0 || block_x * block_y * block_z == 0 ||
      block_x * block_y * block_z > 1024 || shared != 0 || params == nullptr || extra != nullptr) {
    return CUDA_ERROR_INVALID_VALUE;
  }
  void* dst = *static_cast<void**>(params[0]);
  const auto* src = *static_cast<const char**>(params[1]);
  const size_t bytes = *static_cast<uint64_t*>(params[2]) * 16;
  if (reinterpret_cast<uintptr_t>(dst) % 16 || reinterpret_cast<uintptr_t>(src) % 16) return CUDA_ERROR_INVALID_VALUE;
  if (!inside_mapped_reservation(w, dst, bytes) || !inside_pinned_host(w, src, bytes)) return CUDA_ERROR_ILLEGAL_ADDRESS;
  std::memmove(dst, src, bytes);
  log(w, fake::OpKind::sm_copy, dst, bytes, device, reinterpret_cast<cudaStream_t>(stream));
  return CUDA_SUCCESS;
}

cudaError_t entry_point(const char* symbol, void** fn, cudaDriverEntryPointQueryResult* status) {
  *fn = nullptr;
  if (scenario() != "no_entry_points") {
    if (!std::strcmp(symbol, "cuCtxGetCurrent")) *fn = reinterpret_cast<void*>(&fake_ctx_get_current);
    if (!std::strcmp(symbol, "cuCtxSetCurrent")) *fn = reinterpret_cast<void*>(&fake_ctx_set_current);
    if (!std::strcmp(symbol, "cuDeviceGet")) *fn = reinterpret_cast<void*>(&fake_device_get);
    if (!std::strcmp(symbol, "cuDeviceGetAttribute")) *fn = reinterpret_cast<void*>(&fake_device_get_attribute);
    if (!std::strcmp(symbol, "cuDevicePrimaryCtxRetain")) *fn = reinterpret_cast<void*>(&fake_primary_ctx_retain);
    const std::pair<const char*, void*> vmm[] = {
        {"cuGetErrorName", reinterpret_cast<void*>(&fake_get_error_name)},
        {"cuMemGetAllocationGranularity", reinterpret_cast<void*>(&fake_mem_get_granularity)},
        {"cuMemAddressReserve", reinterpret_cast<void*>(&fake_mem_address_reserve)},
        {"cuMemAddressFree", reinterpret_cast<void*>(&fake_mem_address_free)},
        {"cuMemCreate", reinterpret_cast<void*>(&fake_mem_create)},
        {"cuMemRelease", reinterpret_cast<void*>(&fake_mem_release)},
        {"cuMemMap", reinterpret_cast<void*>(&fake_mem_map)},
        {"cuMemUnmap", reinterpret_cast<void*>(&fake_mem_unmap)},
        {"cuMemSetAccess", reinterpret_cast<void*>(&fake_mem_set_access)},
        {"cuMemExportToShareableHandle", reinterpret_cast<void*>(&fake_mem_export)},
        {"cuMemImportFromShareableHandle", reinterpret_cast<void*>(&fake_mem_import)},
        {"cuModuleLoadData", reinterpret_cast<void*>(&fake_module_load_data)},
        {"cuModuleGetFunction", reinterpret_cast<void*>(&fake_module_get_function)},
        {"cuLaunchKernel", reinterpret_cast<void*>(&fake_launch_kernel)}};
    for (const auto& [name, address] : vmm) {
      if (!std::strcmp(symbol, name)) *fn = address;
    }
  }
  if (status) *status = *fn ? cudaDriverEntryPointSuccess : cudaDriverEntryPointSymbolNotFound;
  return cudaSuccess;
}

}  // namespace

namespace fake {

const char* name(OpKind kind) {
  static const char* const names[] = {"prefetch", "advise:preferred", "advise:accessed_by", "discard", "malloc",
                                      "free", "copy:to_host", "copy:to_device", "host_alloc", "host_free",
                                      "host_register", "host_unregister",
                                      "event_record", "event_sync", "wait_event", "stream_sync", "device_sync",
                                      "vmm_create", "vmm_map", "vmm_unmap", "timing_mark", "sm_copy", "vmm_release",
                                      "codec_kernel"};
  static_assert(sizeof names / sizeof names[0] == static_cast<size_t>(OpKind::codec_kernel) + 1, "a name per kind");
  return names[static_cast<size_t>(kind)];
}

std::ostream& operator<<(std::ostream& out, OpKind kind) { return out << name(kind); }

void reset() {
  release_held();
  World& w = world();
  std::lock_guard<std::mutex> lock(w.mutex);
  for (auto& a : w.allocations) std::free(reinterpret_cast<void*>(a.first));
  w.allocations.clear();
  for (auto& r : w.reservations) munmap(reinterpret_cast<void*>(r.first), r.second.size);
  w.reservations.clear();
  w.next_reservation_at = nullptr;
  w.handles.clear();
  for (auto& m : w.memfds) close(m.second);
  w.memfds.clear();
  w.imported.clear();
  w.exportable.clear();
  w.unfilled.clear();
  w.ops.clear();
  w.preferred.clear();
  w.prefetched.clear();
  w.injected.clear();
  w.capturing.clear();
  w.capture_invalidated = false;
  w.events_pending = false;
  w.pending_events.clear();
  for (bool& created : w.context_created) created = false;
  pending = cudaSuccess;
}

void device_wrote(const void* ptr, size_t size) {
  World& w = world();
  std::lock_guard<std::mutex> lock(w.mutex);
  if (!inside_one_allocation(w, ptr, size) || inside_mapped_reservation(w, ptr, size)) return;
  update_discard(w, ptr, size, [](Discard& state, char*, size_t) {
    if (state == Discard::discarded) state = Discard::rewritten;
  });
}

void set_events_pending(bool pending_from_now) {
  std::lock_guard<std::mutex> lock(world().mutex);
  world().events_pending = pending_from_now;
}

bool event_pending(cudaEvent_t event) {
  std::lock_guard<std::mutex> lock(world().mutex);
  return world().pending_events.count(event) != 0;
}

void fail_next(const std::string& call_name, cudaError_t error, int skip) {
  std::lock_guard<std::mutex> lock(world().mutex);
  world().injected[call_name] = World::Injection{error, skip};
}

bool injection_left(const std::string& call_name) {
  std::lock_guard<std::mutex> lock(world().mutex);
  return world().injected.count(call_name) != 0;
}

void clear_injections() {
  std::lock_guard<std::mutex> lock(world().mutex);
  world().injected.clear();
}

void hold_next(const std::string& call_name, int skip) {
  Gate& g = gate();
  std::lock_guard<std::mutex> lock(g.mutex);
  g.armed = call_name;
  g.skip = skip;
  g.open = false;
}

bool wait_until_held(int timeout_ms) {
  Gate& g = gate();
  std::unique_lock<std::mutex> lock(g.mutex);
  return g.changed.wait_for(lock, std::chrono::milliseconds(timeout_ms), [&] { return g.waiting > 0; });
}

bool wait_until_held(const std::string& call_name, int timeout_ms) {
  Gate& g = gate();
  std::unique_lock<std::mutex> lock(g.mutex);
  return g.changed.wait_for(lock, std::chrono::milliseconds(timeout_ms), [&] { return g.held.count(call_name) != 0; });
}

void release_held() {
  Gate& g = gate();
  std::lock_guard<std::mutex> lock(g.mutex);
  g.armed.clear();
  g.open = true;
  g.changed.notify_all();
}

void release_held(const std::string& call_name) {
  Gate& g = gate();
  std::lock_guard<std::mutex> lock(g.mutex);
  if (g.held.count(call_name) != 0) g.let_through.insert(call_name);
  g.changed.notify_all();
}

void reset_ops() {
  std::lock_guard<std::mutex> lock(world().mutex);
  world().ops.clear();
}

void set_capturing(cudaStream_t stream, bool capturing) {
  std::lock_guard<std::mutex> lock(world().mutex);
  if (capturing) world().capturing.insert(stream);
  else world().capturing.erase(stream);
}

cudaStream_t make_stream() {
  std::lock_guard<std::mutex> lock(world().mutex);
  return reinterpret_cast<cudaStream_t>(world().next_stream += 0x10);
}

std::vector<Op> ops() {
  std::lock_guard<std::mutex> lock(world().mutex);
  return world().ops;
}

size_t live_allocations() {
  std::lock_guard<std::mutex> lock(world().mutex);
  return world().allocations.size();
}

size_t live_events() {
  std::lock_guard<std::mutex> lock(world().mutex);
  return world().live_events.size();
}

size_t pinned_blocks() {
  std::lock_guard<std::mutex> lock(world().mutex);
  return world().pinned.size() + world().registered.size();
}

size_t live_reservations() {
  std::lock_guard<std::mutex> lock(world().mutex);
  return world().reservations.size();
}

size_t physical_handles() {
  std::lock_guard<std::mutex> lock(world().mutex);
  return world().handles.size();
}

bool exportable_at(const void* ptr) {
  World& w = world();
  std::lock_guard<std::mutex> lock(w.mutex);
  const auto at = reinterpret_cast<uintptr_t>(ptr);
  auto it = w.reservations.upper_bound(at);
  if (it == w.reservations.begin()) return false;
  --it;
  return at < it->first + it->second.size && it->second.mapped != 0 && w.exportable.count(it->second.mapped) != 0;
}

bool last_created_rdma_capable() {
  std::lock_guard<std::mutex> lock(world().mutex);
  return world().last_created_rdma_capable;
}

size_t physical_bytes() {
  std::lock_guard<std::mutex> lock(world().mutex);
  size_t bytes = 0;
  for (const auto& h : world().handles) bytes += h.second;
  return bytes;
}

void reserve_next_at(const void* address) {
  std::lock_guard<std::mutex> lock(world().mutex);
  world().next_reservation_at = const_cast<void*>(address);
}

size_t mapped_reservations() {
  std::lock_guard<std::mutex> lock(world().mutex);
  size_t mapped = 0;
  for (const auto& r : world().reservations) mapped += r.second.mapped != 0;
  return mapped;
}

int current_context() { return ::current_context; }
void set_thread_context(int device) {
  ::current_context = device;
  if (device != kNoContext) {
    std::lock_guard<std::mutex> lock(world().mutex);
    world().context_created[device] = true;
  }
}
bool capture_invalidated() {
  std::lock_guard<std::mutex> lock(world().mutex);
  return world().capture_invalidated;
}

bool context_created(int device) {
  std::lock_guard<std::mutex> lock(world().mutex);
  return world().context_created[device];
}

}  // namespace fake

extern "C" {

cudaError_t cudaGetLastError(void) {
  const cudaError_t e = pending;
  pending = cudaSuccess;
  return e;
}

cudaError_t cudaPeekAtLastError(void) { return pending; }

const char* cudaGetErrorName(cudaError_t error) {
  switch (error) {
    case cudaSuccess: return "cudaSuccess";
    case cudaErrorInvalidValue: return "cudaErrorInvalidValue";
    case cudaErrorMemoryAllocation: return "cudaErrorMemoryAllocation";
    case cudaErrorInsufficientDriver: return "cudaErrorInsufficientDriver";
    case cudaErrorNoDevice: return "cudaErrorNoDevice";
    case cudaErrorInvalidDevice: return "cudaErrorInvalidDevice";
    case cudaErrorNotSupported: return "cudaErrorNotSupported";
    case cudaErrorStreamCaptureImplicit: return "cudaErrorStreamCaptureImplicit";
    case cudaErrorCudartUnloading: return "cudaErrorCudartUnloading";
    case cudaErrorLaunchFailure: return "cudaErrorLaunchFailure";
    default: return "cudaErrorUnknown";
  }
}

const char* cudaGetErrorString(cudaError_t error) {
  switch (error) {
    case cudaSuccess: return "no error";
    case cudaErrorInvalidValue: return "invalid argument";
    case cudaErrorMemoryAllocation: return "out of memory";
    case cudaErrorInsufficientDriver: return "CUDA driver version is insufficient for CUDA runtime version";
    case cudaErrorNoDevice: return "no CUDA-capable device is detected";
    default: return "fake error";
  }
}

cudaError_t cudaGetDeviceCount(int* count) {
  if (scenario() == "no_driver") {
    *count = 0;
    return set_error(cudaErrorInsufficientDriver);
  }
  *count = kDeviceCount;
  return cudaSuccess;
}

cudaError_t cudaGetDevice(int* device) {
  if (cudaError_t e; injected_now("cudaGetDevice", &e)) return e;
  *device = current_context != fake::kNoContext ? current_context : selected_device;
  return cudaSuccess;
}

cudaError_t cudaSetDevice(int device) {
  if (cudaError_t e; injected_now("cudaSetDevice", &e)) return e;
  if (device < 0 || device >= kDeviceCount) return set_error(cudaErrorInvalidDevice);
  std::lock_guard<std::mutex> lock(world().mutex);
  world().context_created[device] = true;
  current_context = selected_device = device;
  return cudaSuccess;
}

cudaError_t cudaDeviceGetAttribute(int* value, cudaDeviceAttr attr, int device) {
  if (cudaError_t e; injected_now("cudaDeviceGetAttribute", &e)) return e;
  if (device < 0 || device >= kDeviceCount) return set_error(cudaErrorInvalidDevice);
  const DeviceModel& d = kDevices[device];
  switch (attr) {
    case cudaDevAttrManagedMemory: *value = d.managed; break;
    case cudaDevAttrConcurrentManagedAccess: *value = d.concurrent; break;
    case cudaDevAttrPageableMemoryAccess: *value = 0; break;
    case cudaDevAttrMultiProcessorCount: *value = 4; break;
    case cudaDevAttrCanUseHostPointerForRegisteredMem: *value = 1; break;
    case cudaDevAttrComputeCapabilityMajor: *value = scenario() == "pre_volta" ? 6 : 9; break;
    default: return set_error(cudaErrorInvalidValue);
  }
  return cudaSuccess;
}

// Device d sits at PCI bus d + 1 of domain 0, written with the runtime's eight-digit domain.
cudaError_t cudaDeviceGetPCIBusId(char* pci_bus_id, int len, int device) {
  if (cudaError_t e; injected_now("cudaDeviceGetPCIBusId", &e)) return e;
  if (device < 0 || device >= kDeviceCount) return set_error(cudaErrorInvalidDevice);
  if (pci_bus_id == nullptr || len < 17) return set_error(cudaErrorInvalidValue);
  std::snprintf(pci_bus_id, static_cast<size_t>(len), "00000000:%02X:00.0", device + 1);
  return cudaSuccess;
}

cudaError_t cudaGetDeviceProperties(cudaDeviceProp* prop, int device) {
  if (cudaError_t e; injected_now("cudaGetDeviceProperties", &e)) return e;
  if (device < 0 || device >= kDeviceCount) return set_error(cudaErrorInvalidDevice);
  std::memset(prop, 0, sizeof *prop);
  prop->totalGlobalMem = kDevices[device].total_memory;
  return cudaSuccess;
}

cudaError_t cudaDriverGetVersion(int* version) {
  *version = scenario() == "cuda12" ? 12080 : 13000;
  return cudaSuccess;
}

cudaError_t cudaRuntimeGetVersion(int* version) {
  *version = scenario() == "cuda12" ? 12080 : 13000;
  return cudaSuccess;
}

#if CUDART_VERSION >= 12050
cudaError_t cudaGetDriverEntryPointByVersion(const char* symbol, void** fn, unsigned int, unsigned long long,
                                             cudaDriverEntryPointQueryResult* status) {
  return entry_point(symbol, fn, status);
}
#else  // before CUDA 12.5 the runtime has only the unversioned form
cudaError_t cudaGetDriverEntryPoint(const char* symbol, void** fn, unsigned long long,
                                    cudaDriverEntryPointQueryResult* status) {
  return entry_point(symbol, fn, status);
}
#endif

cudaError_t cudaMallocManaged(void** ptr, size_t size, unsigned int flags) {
  World& w = world();
  std::lock_guard<std::mutex> lock(w.mutex);
  cudaError_t error;
  if (injected(w, "cudaMallocManaged", &error)) return error;
  if (flags != cudaMemAttachGlobal) return set_error(cudaErrorInvalidValue);
  const int device = ensure_context(w);
  void* memory = std::aligned_alloc(256, (size + 255) / 256 * 256);
  if (memory == nullptr) return set_error(cudaErrorMemoryAllocation);
  w.allocations[reinterpret_cast<uintptr_t>(memory)] = Allocation{size, {}};
  log(w, fake::OpKind::malloc, memory, size, device, nullptr);
  *ptr = memory;
  return cudaSuccess;
}

// Plain device memory, as the preload interposer's tests reach it (uvm itself never calls it): kept
// in host memory like managed memory, logged as a malloc of the current device.
cudaError_t cudaMalloc(void** ptr, size_t size) {
  World& w = world();
  std::lock_guard<std::mutex> lock(w.mutex);
  cudaError_t error;
  if (injected(w, "cudaMalloc", &error)) return error;
  if (ptr == nullptr) return set_error(cudaErrorInvalidValue);
  const int device = ensure_context(w);
  void* memory = std::aligned_alloc(256, (size + 255) / 256 * 256 + 256);
  if (memory == nullptr) return set_error(cudaErrorMemoryAllocation);
  w.allocations[reinterpret_cast<uintptr_t>(memory)] = Allocation{size, {}};
  log(w, fake::OpKind::malloc, memory, size, device, nullptr);
  *ptr = memory;
  return cudaSuccess;
}

cudaError_t cudaFree(void* ptr) {
  World& w = world();
  std::lock_guard<std::mutex> lock(w.mutex);
  cudaError_t error;
  if (injected(w, "cudaFree", &error)) return error;
  const int device = ensure_context(w);
  auto it = w.allocations.find(reinterpret_cast<uintptr_t>(ptr));
  if (it == w.allocations.end()) return set_error(cudaErrorInvalidValue);
  log(w, fake::OpKind::free, ptr, it->second.size, device, nullptr);
  w.allocations.erase(it);
  std::free(ptr);
  return cudaSuccess;
}

cudaError_t cudaPointerGetAttributes(cudaPointerAttributes* attributes, const void* ptr) {
  if (cudaError_t e; injected_now("cudaPointerGetAttributes", &e)) return e;
  World& w = world();
  std::lock_guard<std::mutex> lock(w.mutex);
  std::memset(attributes, 0, sizeof *attributes);
  attributes->type = inside_mapped_reservation(w, ptr, 1) ? cudaMemoryTypeDevice
                    : inside_one_allocation(w, ptr, 1) ? cudaMemoryTypeManaged
                                                       : cudaMemoryTypeUnregistered;
  return cudaSuccess;
}

// The entry points as each header generation declares them (alloc/cuda_compat.hpp calls the same):
// the location forms are plain-named from CUDA 13 and carry a _v2 suffix in 12.2–12.9.
#if CUDART_VERSION >= 12020
#if CUDART_VERSION >= 13000
#define FAKE_LOCATION_FORM(name) name
#else
#define FAKE_LOCATION_FORM(name) name##_v2
#endif
cudaError_t FAKE_LOCATION_FORM(cudaMemAdvise)(const void* ptr, size_t size, cudaMemoryAdvise advice,
                                              cudaMemLocation location) {
  return advise_at(ptr, size, advice, decode(location));
}

cudaError_t FAKE_LOCATION_FORM(cudaMemPrefetchAsync)(const void* ptr, size_t size, cudaMemLocation location,
                                                     unsigned int flags, cudaStream_t stream) {
  return prefetch_to(ptr, size, decode(location), flags, stream);
}
#else
cudaError_t cudaMemAdvise(const void* ptr, size_t size, cudaMemoryAdvise advice, int device) {
  return advise_at(ptr, size, advice, device);
}

cudaError_t cudaMemPrefetchAsync(const void* ptr, size_t size, int device, cudaStream_t stream) {
  return prefetch_to(ptr, size, device, 0, stream);
}
#endif

cudaError_t cudaMemDiscardBatchAsync(void** ptrs, size_t* sizes, size_t count, unsigned long long flags,
                                     cudaStream_t stream) {
  World& w = world();
  std::lock_guard<std::mutex> lock(w.mutex);
  cudaError_t error;
  if (injected(w, "cudaMemDiscardBatchAsync", &error)) return error;
  ensure_context(w);
  // The real driver rejects the legacy NULL stream here (measured on an H100).
  if (flags != 0 || stream == nullptr || stream == cudaStreamLegacy) return set_error(cudaErrorInvalidValue);
  for (size_t i = 0; i < count; ++i) {
    if (!inside_one_allocation(w, ptrs[i], sizes[i])) return set_error(cudaErrorInvalidValue);
  }
  for (size_t i = 0; i < count; ++i) {
    log(w, fake::OpKind::discard, ptrs[i], sizes[i], -2, stream);
    std::memset(ptrs[i], 0xDD, sizes[i]);  // the contents become indeterminate
    update_discard(w, ptrs[i], sizes[i], [](Discard& state, char*, size_t) { state = Discard::discarded; }, true);
  }
  return cudaSuccess;
}

cudaError_t cudaMemRangeGetAttribute(void* data, size_t data_size, cudaMemRangeAttribute attribute,
                                     const void* ptr, size_t count) {
  if (cudaError_t e; injected_now("cudaMemRangeGetAttribute", &e)) return e;
  World& w = world();
  std::lock_guard<std::mutex> lock(w.mutex);
  ensure_context(w);
  if (data_size != sizeof(int) || !inside_one_allocation(w, ptr, count)) return set_error(cudaErrorInvalidValue);
  const auto begin = reinterpret_cast<uintptr_t>(ptr);
  if (attribute == cudaMemRangeAttributePreferredLocation) {
    *static_cast<int*>(data) = query(w.preferred, begin, begin + count);
  } else if (attribute == cudaMemRangeAttributeLastPrefetchLocation) {
    *static_cast<int*>(data) = query(w.prefetched, begin, begin + count);
  } else {
    return set_error(cudaErrorInvalidValue);
  }
  return cudaSuccess;
}

cudaError_t cudaStreamIsCapturing(cudaStream_t stream, cudaStreamCaptureStatus* status) {
  if (cudaError_t e; injected_now("cudaStreamIsCapturing", &e)) return e;
  World& w = world();
  std::lock_guard<std::mutex> lock(w.mutex);
  ensure_context(w);
  *status = w.capturing.count(stream) ? cudaStreamCaptureStatusActive : cudaStreamCaptureStatusNone;
  return cudaSuccess;
}

cudaError_t cudaStreamCreateWithFlags(cudaStream_t* stream, unsigned int) {
  if (cudaError_t e; injected_now("cudaStreamCreateWithFlags", &e)) return e;
  World& w = world();
  std::lock_guard<std::mutex> lock(w.mutex);
  ensure_context(w);
  *stream = reinterpret_cast<cudaStream_t>(w.next_stream += 0x10);
  return cudaSuccess;
}

cudaError_t cudaStreamDestroy(cudaStream_t) {
  if (cudaError_t e; injected_now("cudaStreamDestroy", &e)) return e;
  return cudaSuccess;
}

// Free memory as the driver counts it: managed allocations stay counted however uvm moved them
// (the driver takes them back only when someone allocates), mapped reservations count until
// unmapped. One pool for all devices, which is enough for single-device tests.
cudaError_t cudaMemGetInfo(size_t* free_bytes, size_t* total_bytes) {
  World& w = world();
  std::lock_guard<std::mutex> lock(w.mutex);
  cudaError_t error;
  if (injected(w, "cudaMemGetInfo", &error)) return error;
  const int device = ensure_context(w);
  size_t used = 0;
  for (const auto& a : w.allocations) used += a.second.size;
  for (const auto& r : w.reservations) used += r.second.mapped ? r.second.size : 0;
  *total_bytes = kDevices[device].total_memory;
  *free_bytes = used < *total_bytes ? *total_bytes - used : 0;
  return cudaSuccess;
}

cudaError_t cudaDeviceSynchronize(void) {
  pass_gate("cudaDeviceSynchronize");
  World& w = world();
  std::lock_guard<std::mutex> lock(w.mutex);
  cudaError_t error;
  if (injected(w, "cudaDeviceSynchronize", &error)) return error;
  ensure_context(w);
  log(w, fake::OpKind::device_sync, nullptr, 0, -2, nullptr);
  return cudaSuccess;
}

cudaError_t cudaStreamSynchronize(cudaStream_t stream) {
  World& w = world();
  std::lock_guard<std::mutex> lock(w.mutex);
  cudaError_t error;
  if (injected(w, "cudaStreamSynchronize", &error)) return error;
  ensure_context(w);
  log(w, fake::OpKind::stream_sync, nullptr, 0, -2, stream);
  return cudaSuccess;
}

// Pinned host memory is plain host memory here; copies run at once, so stream order holds trivially.
cudaError_t cudaHostAlloc(void** ptr, size_t size, unsigned int flags) {
  pass_gate("cudaHostAlloc");
  World& w = world();
  std::lock_guard<std::mutex> lock(w.mutex);
  cudaError_t error;
  if (injected(w, "cudaHostAlloc", &error)) return error;
  ensure_context(w);
  void* memory = mmap(nullptr, size, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  if (memory == MAP_FAILED) return set_error(cudaErrorMemoryAllocation);
  *ptr = memory;
  w.pinned[memory] = size;
  log(w, fake::OpKind::host_alloc, *ptr, size, static_cast<int>(flags), nullptr);
  return cudaSuccess;
}

cudaError_t cudaFreeHost(void* ptr) {
  pass_gate("cudaFreeHost");
  World& w = world();
  std::lock_guard<std::mutex> lock(w.mutex);
  cudaError_t error;
  if (injected(w, "cudaFreeHost", &error)) return error;
  ensure_context(w);
  auto it = w.pinned.find(ptr);
  if (it == w.pinned.end()) return set_error(cudaErrorInvalidValue);
  log(w, fake::OpKind::host_free, ptr, 0, -2, nullptr);
  munmap(ptr, it->second);
  w.pinned.erase(it);
  return cudaSuccess;
}

cudaError_t cudaHostRegister(void* ptr, size_t size, unsigned int flags) {
  pass_gate("cudaHostRegister");
  World& w = world();
  std::lock_guard<std::mutex> lock(w.mutex);
  cudaError_t error;
  if (injected(w, "cudaHostRegister", &error)) return error;
  ensure_context(w);
  const auto begin = static_cast<char*>(ptr);
  for (const auto& [other, bytes] : w.registered) {
    if (begin < static_cast<char*>(other) + bytes && static_cast<char*>(other) < begin + size) {
      return set_error(cudaErrorHostMemoryAlreadyRegistered);
    }
  }
  w.registered[ptr] = size;
  log(w, fake::OpKind::host_register, ptr, size, static_cast<int>(flags), nullptr);
  return cudaSuccess;
}

cudaError_t cudaHostUnregister(void* ptr) {
  pass_gate("cudaHostUnregister");
  World& w = world();
  std::lock_guard<std::mutex> lock(w.mutex);
  cudaError_t error;
  if (injected(w, "cudaHostUnregister", &error)) return error;
  ensure_context(w);
  auto it = w.registered.find(ptr);
  if (it == w.registered.end()) return set_error(cudaErrorHostMemoryNotRegistered);
  log(w, fake::OpKind::host_unregister, ptr, 0, -2, nullptr);
  w.registered.erase(it);
  return cudaSuccess;
}

cudaError_t cudaMemcpyAsync(void* dst, const void* src, size_t count, cudaMemcpyKind kind, cudaStream_t stream) {
  pass_gate("cudaMemcpyAsync");
  World& w = world();
  std::lock_guard<std::mutex> lock(w.mutex);
  cudaError_t error;
  if (injected(w, "cudaMemcpyAsync", &error)) return error;
  const int device = ensure_context(w);
  if (kind != cudaMemcpyDefault) return set_error(cudaErrorInvalidValue);
  // Like the driver: a copy may not run past the end of the managed allocation it touches.
  const bool to_device = inside_one_allocation(w, dst, 1);
  const void* managed = to_device ? dst : src;
  if (!inside_one_allocation(w, managed, count)) return set_error(cudaErrorInvalidValue);
  // Like the driver (measured on an H100): a copy may not run across two host registrations.
  const auto* host = static_cast<const char*>(to_device ? src : dst);
  for (const auto& [registered, bytes] : w.registered) {
    const auto* begin = static_cast<const char*>(registered);
    const bool overlaps = host < begin + bytes && begin < host + count;
    if (overlaps && (host < begin || host + count > begin + bytes)) return set_error(cudaErrorInvalidValue);
  }
  std::memmove(dst, src, count);
  if (to_device && !inside_mapped_reservation(w, dst, count)) {  // device memory has no discard state
    update_discard(w, dst, count, [](Discard& state, char*, size_t) {
      if (state == Discard::discarded) state = Discard::rewritten;
    });
  }
  log(w, to_device ? fake::OpKind::copy_to_device : fake::OpKind::copy_to_host, managed, count, to_device ? device : -1, stream);
  return cudaSuccess;
}

cudaError_t cudaEventCreateWithFlags(cudaEvent_t* event, unsigned int) {
  World& w = world();
  std::lock_guard<std::mutex> lock(w.mutex);
  cudaError_t error;
  if (injected(w, "cudaEventCreateWithFlags", &error)) return error;
  ensure_context(w);
  *event = reinterpret_cast<cudaEvent_t>(w.next_stream += 0x10);
  w.live_events.insert(*event);
  return cudaSuccess;
}

cudaError_t cudaEventCreate(cudaEvent_t* event) {
  World& w = world();
  std::lock_guard<std::mutex> lock(w.mutex);
  cudaError_t error;
  if (injected(w, "cudaEventCreate", &error)) return error;
  ensure_context(w);
  *event = reinterpret_cast<cudaEvent_t>(w.next_stream += 0x10);
  w.live_events.insert(*event);
  w.timing_events.insert(*event);
  return cudaSuccess;
}

cudaError_t cudaEventRecord(cudaEvent_t event, cudaStream_t stream) {
  World& w = world();
  std::lock_guard<std::mutex> lock(w.mutex);
  const bool timing = w.timing_events.count(event) != 0;
  cudaError_t error;
  if (injected(w, timing ? "cudaEventRecord(timing)" : "cudaEventRecord", &error)) return error;
  ensure_context(w);
  if (!w.live_events.count(event)) return set_error(cudaErrorInvalidResourceHandle);
  log(w, timing ? fake::OpKind::timing_mark : fake::OpKind::event_record, event, 0, -2, stream);
  w.recorded_at[event] = w.clock_us;
  if (w.events_pending) w.pending_events.insert(event);
  else w.pending_events.erase(event);
  return cudaSuccess;
}

cudaError_t cudaEventElapsedTime(float* ms, cudaEvent_t start, cudaEvent_t end) {
  World& w = world();
  std::lock_guard<std::mutex> lock(w.mutex);
  cudaError_t error;
  if (injected(w, "cudaEventElapsedTime", &error)) return error;
  ensure_context(w);  // like every runtime call: with no context current, the selected device's
  ensure_context(w);  // like every runtime call: with no context current, the selected device's
  if (!w.timing_events.count(start) || !w.timing_events.count(end) || !w.recorded_at.count(start) ||
      !w.recorded_at.count(end)) {
    return set_error(cudaErrorInvalidResourceHandle);
  }
  *ms = static_cast<float>((w.recorded_at[end] - w.recorded_at[start]) / 1e3);
  return cudaSuccess;
}

// Like the driver under a global-mode capture: a query or wait, unsafe while any stream captures
// unless this thread's mode is relaxed, fails and invalidates the capture.
bool unsafe_during_capture(World& w) {
  if (w.capturing.empty() || capture_mode == cudaStreamCaptureModeRelaxed) return false;
  w.capture_invalidated = true;
  return true;
}

cudaError_t cudaEventQuery(cudaEvent_t event) {
  if (cudaError_t e; injected_now("cudaEventQuery", &e)) return e;
  World& w = world();
  std::lock_guard<std::mutex> lock(w.mutex);
  ensure_context(w);
  if (unsafe_during_capture(w)) return set_error(cudaErrorStreamCaptureUnsupported);
  if (!w.live_events.count(event)) return set_error(cudaErrorInvalidResourceHandle);
  return w.pending_events.count(event) ? cudaErrorNotReady : cudaSuccess;  // NotReady is no error
}

cudaError_t cudaThreadExchangeStreamCaptureMode(cudaStreamCaptureMode* mode) {
  std::swap(*mode, capture_mode);
  return cudaSuccess;
}

cudaError_t cudaEventSynchronize(cudaEvent_t event) {
  {
    World& w = world();
    std::lock_guard<std::mutex> lock(w.mutex);
    cudaError_t error;
    if (injected(w, "cudaEventSynchronize", &error)) return error;
    log(w, fake::OpKind::event_sync, event, 0, -2, nullptr);
    w.pending_events.erase(event);
  }
  return cudaEventQuery(event);
}

cudaError_t cudaEventDestroy(cudaEvent_t event) {
  if (cudaError_t e; injected_now("cudaEventDestroy", &e)) return e;
  World& w = world();
  std::lock_guard<std::mutex> lock(w.mutex);
  ensure_context(w);
  w.timing_events.erase(event);
  w.recorded_at.erase(event);
  return w.live_events.erase(event) ? cudaSuccess : set_error(cudaErrorInvalidResourceHandle);
}

cudaError_t cudaStreamWaitEvent(cudaStream_t stream, cudaEvent_t event, unsigned int) {
  World& w = world();
  std::lock_guard<std::mutex> lock(w.mutex);
  cudaError_t error;
  if (injected(w, "cudaStreamWaitEvent", &error)) return error;
  ensure_context(w);
  if (!w.live_events.count(event)) return set_error(cudaErrorInvalidResourceHandle);
  log(w, fake::OpKind::wait_event, event, 0, -2, stream);
  return cudaSuccess;
}

}  // extern "C"
