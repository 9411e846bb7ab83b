#include "pinned.hpp"

#include <sched.h>
#include <sys/mman.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "../../alloc/devices.hpp"
#include "numa.hpp"

namespace uvm {
namespace {

constexpr size_t kPageBytes = 4096;
// The kernel zeroes each fresh page as it faults in: that scales with threads up to about 16 on the
// GPU machines (pinned_probe's wall table: 16 threads faulted in half again as fast as 8 in the
// same run; docs/measurements.md, "A pause without retained memory: the wall").
constexpr unsigned kMaxFaultThreads = 16;

// The CPUs this process may run on (its affinity), at least 1.
unsigned usable_cpus() {
  cpu_set_t cpus;
  const int count = sched_getaffinity(0, sizeof cpus, &cpus) == 0 ? CPU_COUNT(&cpus) : 0;
  return count > 0 ? static_cast<unsigned>(count) : std::max(1u, std::thread::hardware_concurrency());
}

// Who else runs while pages fault in: nothing, or a registration on a thread of its own, which then
// keeps a CPU to itself: faulting in on one thread fewer than the CPUs while another mapping
// registered finished both sooner than on all of them (pinned_probe's overlap table;
// docs/measurements.md, "A pause without retained memory: the wall").
enum class Beside { nothing, registration };

// Touches every page of [host, host + bytes) on several threads (one per CPU this process may run
// on, up to kMaxFaultThreads, less one left to a registration beside), so that cudaHostRegister
// finds them present: the kernel faults pages in many times faster in parallel than the driver
// does alone.
void fault_in(char* host, size_t bytes, Beside beside = Beside::nothing) {
  const unsigned cpus = usable_cpus();
  const unsigned left_free = beside == Beside::registration && cpus > 1 ? 1 : 0;
  const unsigned threads = std::min(kMaxFaultThreads, cpus - left_free);
  const size_t share = (bytes / threads + kPageBytes - 1) / kPageBytes * kPageBytes;
  std::vector<std::thread> workers;
  try {
    for (unsigned t = 1; t < threads; ++t) {
      workers.emplace_back([=] {
        const size_t begin = t * share, end = std::min(bytes, begin + share);
        for (size_t i = begin; i < end; i += kPageBytes) host[i] = 0;
      });
    }
  } catch (...) {
    // No thread to be had: the pages this share leaves untouched the driver faults in itself.
  }
  for (size_t i = 0; i < std::min(bytes, share); i += kPageBytes) host[i] = 0;
  for (std::thread& worker : workers) worker.join();
}

// Says once per process that staging memory could not be placed on its GPU's NUMA node, and why.
void tell_unplaced(const std::string& why) {
  static std::once_flag told;
  std::call_once(told, [&] {
    std::fprintf(stderr, "uvm: staging memory stays where the kernel puts it, not on its GPU's NUMA node (%s); "
                 "UVM_PIN_NUMA=0 asks for no placement\n", why.c_str());
  });
}

// Maps `bytes` for pinning: huge pages advised, on `near_device`'s NUMA node where the host has
// several (numa.hpp; -1: no device), never inherited by a fork. Null and why on failure.
char* map_for_pinning(size_t bytes, std::string* why, int near_device) {
  void* mapped = mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  if (mapped == MAP_FAILED) {
    *why = std::string("mmap: ") + std::strerror(errno);
    return nullptr;
  }
  auto* host = static_cast<char*>(mapped);
  (void)madvise(host, bytes, MADV_HUGEPAGE);  // a hint: without transparent huge pages it still works
  // Before any page is faulted in, so that they all come from the node asked for.
  std::string unplaced;
  const int node = staging_node_for(near_device);
  if (node >= 0 && !prefer_node(host, bytes, node, &unplaced)) tell_unplaced(unplaced);
  // A child process (any fork: subprocess, DataLoader workers) must not inherit pinned pages: the
  // kernel would copy every one of them at the fork, since pinned pages cannot be shared
  // copy-on-write. cudaHostAlloc's memory is not inherited either.
  if (madvise(host, bytes, MADV_DONTFORK) != 0) {
    *why = std::string("madvise(MADV_DONTFORK): ") + std::strerror(errno);
    munmap(host, bytes);
    return nullptr;
  }
  return host;
}

// Portable: pinned for every device's context. Mapped: a kernel may read it through the host
// pointer (uvm's SM copy, sm_copy.hpp); cudaHostAlloc memory is mapped that way already.
constexpr unsigned kRegisterFlags = cudaHostRegisterPortable | cudaHostRegisterMapped;

// mmap + huge pages + fault-in + cudaHostRegister; null and the reason on failure (nothing left
// mapped, no CUDA error pending).
char* register_pinned(size_t bytes, std::string* why, int near_device) {
  char* host = map_for_pinning(bytes, why, near_device);
  if (host == nullptr) return nullptr;
  fault_in(host, bytes);
  if (cudaError_t e = cudaHostRegister(host, bytes, kRegisterFlags)) {
    clear_cuda_error(e);
    *why = std::string("cudaHostRegister: ") + cudaGetErrorName(e);
    munmap(host, bytes);
    return nullptr;
  }
  return host;
}

std::atomic<uint64_t> times_parked{0};

// Before the next step's registration: the copies into the steps pinned so far are issued (or
// none is coming), StepPinning says why. Under progress.mutex (`lock`).
void wait_for_copies_issued(StepPinning& progress, std::unique_lock<std::mutex>& lock) {
  const size_t pinned = progress.pinned;
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::milliseconds(kPaceWaitMs);
  progress.changed.wait_until(lock, deadline,
                              [&] { return progress.stop || progress.pacers == 0 || progress.issued >= pinned; });
  progress.changed.wait(lock, [&] {
    const bool issued = progress.stop || progress.pacers == 0 || progress.issued >= progress.reserved;
    if (!issued) times_parked.fetch_add(1);  // under the lock, about to wait: nothing registers until notified
    return issued;
  });
}

// The pinning thread: step by step, the next step faulted in on other threads while this one is
// registered: the two take about as long as each other, so overlapping them nearly halves the
// pinning (docs/measurements.md, "The first offload").
void pin_steps(char* host, size_t bytes, int device, std::shared_ptr<StepPinning> progress) {
  ContextScope scope;
  std::string failure;
  if (scope.enter(Call::of("uvm_offload_ranges (pinning staging memory)"), device,
                  ContextScope::When::only_if_none_current) != UVM_OK) {
    failure = "no context for the pinning thread";
  }
  auto step_size = [&](size_t at) { return std::min(kPinStepBytes, bytes - at); };
  if (failure.empty()) fault_in(host, step_size(0));
  for (size_t at = 0; at < bytes && failure.empty(); at += kPinStepBytes) {
    const size_t next = at + kPinStepBytes;
    std::thread ahead;
    try {
      if (next < bytes) ahead = std::thread([=] { fault_in(host + next, step_size(next), Beside::registration); });
    } catch (...) {
      // No thread: the next step is faulted in by its own registration instead.
    }
    const cudaError_t e = cudaHostRegister(host + at, step_size(at), kRegisterFlags);
    if (ahead.joinable()) ahead.join();
    if (e != cudaSuccess) {
      clear_cuda_error(e);
      failure = std::string("cudaHostRegister: ") + cudaGetErrorName(e);
      break;
    }
    std::unique_lock<std::mutex> lock(progress->mutex);
    progress->pinned = at + step_size(at);
    progress->changed.notify_all();
    if (next < bytes) wait_for_copies_issued(*progress, lock);
    if (progress->stop) break;
  }
  std::lock_guard<std::mutex> lock(progress->mutex);
  progress->failure = failure;
  progress->done = true;
  progress->changed.notify_all();
}

}  // namespace

uint64_t pinning_parked_count() { return times_parked.load(); }

uvm_status pin_host_memory(const Call& call, size_t bytes, PinnedKind wanted, PinnedMemory* out, int near_device) {
  std::string why = "UVM_PINNED=hostalloc";
  if (wanted == PinnedKind::pageable) {
    char* host = map_for_pinning(bytes, &why, near_device);
    if (host == nullptr) {
      return fail(call, UVM_ERROR_OUT_OF_MEMORY, "cannot map %zu bytes of pageable staging memory (UVM_PINNED=pageable): %s",
                  bytes, why.c_str());
    }
    fault_in(host, bytes);  // so that the driver's staged copies find every page present
    *out = PinnedMemory{host, bytes, PinnedKind::pageable, nullptr};
    return UVM_OK;
  }
  if (wanted == PinnedKind::registered) {
    if (char* host = register_pinned(bytes, &why, near_device)) {
      *out = PinnedMemory{host, bytes, PinnedKind::registered, nullptr};
      return UVM_OK;
    }
  }
  void* host = nullptr;
  if (cudaError_t e = cudaHostAlloc(&host, bytes, cudaHostAllocPortable)) {
    return fail_cuda(call, e, "cudaHostAlloc(%zu bytes of pinned staging memory, after %s; offload with "
                              "UVM_STRATEGY_MIGRATE to need none)", bytes, why.c_str());
  }
  *out = PinnedMemory{static_cast<char*>(host), bytes, PinnedKind::host_alloc, nullptr};
  return UVM_OK;
}

uvm_status pin_host_memory_in_steps(const Call& call, size_t bytes, int device, PinnedMemory* out,
                                    StepPacing pacing) {
  std::string why;
  char* host = map_for_pinning(bytes, &why, device);
  if (host == nullptr) return pin_host_memory(call, bytes, PinnedKind::host_alloc, out);
  auto progress = std::make_shared<StepPinning>();
  progress->pacers = pacing == StepPacing::copies_first ? 1 : 0;
  try {
    std::thread(pin_steps, host, bytes, device, progress).detach();
  } catch (...) {
    munmap(host, bytes);
    return pin_host_memory(call, bytes, PinnedKind::registered, out, device);  // no thread: pin it here
  }
  *out = PinnedMemory{host, bytes, PinnedKind::registered, progress};
  return UVM_OK;
}

void begin_pacing(StepPinning& pinning) {
  std::lock_guard<std::mutex> lock(pinning.mutex);
  ++pinning.pacers;
}

void note_steps_reserved(StepPinning& pinning, size_t through) {
  std::lock_guard<std::mutex> lock(pinning.mutex);
  pinning.reserved = std::max(pinning.reserved, through);
  pinning.changed.notify_all();
}

void note_copies_issued(StepPinning& pinning, size_t through) {
  std::lock_guard<std::mutex> lock(pinning.mutex);
  pinning.issued = std::max(pinning.issued, through);
  pinning.changed.notify_all();
}

void end_pacing(StepPinning& pinning) {
  std::lock_guard<std::mutex> lock(pinning.mutex);
  pinning.pacers = std::max(0, pinning.pacers - 1);
  pinning.changed.notify_all();
}

size_t pinned_bytes_now(const PinnedMemory& memory) {
  if (!memory.steps) return memory.bytes;
  std::lock_guard<std::mutex> lock(memory.steps->mutex);
  return memory.steps->pinned;
}

bool pinning_failed(const PinnedMemory& memory) {
  if (!memory.steps) return false;
  std::lock_guard<std::mutex> lock(memory.steps->mutex);
  return memory.steps->done && !memory.steps->failure.empty();
}

void stop_pinning(StepPinning& pinning) {
  std::lock_guard<std::mutex> lock(pinning.mutex);
  pinning.stop = true;
  pinning.changed.notify_all();
}

void wait_for_pinning_end(StepPinning& pinning) {
  std::unique_lock<std::mutex> lock(pinning.mutex);
  pinning.changed.wait(lock, [&] { return pinning.done; });
}

bool pinning_stopped(const PinnedMemory& memory) {
  if (!memory.steps) return false;
  std::lock_guard<std::mutex> lock(memory.steps->mutex);
  return memory.steps->stop;
}

size_t pinned_bytes_eventually(const PinnedMemory& memory) {
  return pinning_failed(memory) || pinning_stopped(memory) ? pinned_bytes_now(memory) : memory.bytes;
}

uvm_status unpin_steps(const Call& call, char* host, size_t bytes, size_t* given_back) {
  *given_back = 0;
  for (size_t at = 0; at < bytes; at += kPinStepBytes) {
    if (cudaError_t e = cudaHostUnregister(host + at)) {
      if (at > 0) munmap(host, at);  // the steps unregistered so far go; the rest stays whole
      *given_back = at;
      return fail_cuda(call, e, "cudaHostUnregister(%p)", host + at);
    }
  }
  munmap(host, bytes);
  *given_back = bytes;
  return UVM_OK;
}

uvm_status unpin_host_memory(const Call& call, PinnedMemory* memory) {
  if (memory->kind == PinnedKind::host_alloc) {
    if (cudaError_t e = cudaFreeHost(memory->host)) return fail_cuda(call, e, "cudaFreeHost(%p)", memory->host);
    return UVM_OK;
  }
  if (memory->kind == PinnedKind::pageable) {
    munmap(memory->host, memory->bytes);
    return UVM_OK;
  }
  if (memory->steps) {
    StepPinning& steps = *memory->steps;
    std::unique_lock<std::mutex> lock(steps.mutex);
    steps.changed.wait(lock, [&] { return steps.done; });
    const size_t pinned = steps.pinned;
    lock.unlock();
    size_t given_back = 0;
    const uvm_status status = unpin_steps(call, memory->host, pinned, &given_back);
    if (status != UVM_OK) {  // what is left starts at the step that failed: the next try starts there
      memory->host += given_back;
      memory->bytes -= given_back;
      lock.lock();
      steps.pinned = pinned - given_back;
      return status;
    }
    if (memory->bytes > pinned) munmap(memory->host + pinned, memory->bytes - pinned);  // a step failed, or it stopped
    return UVM_OK;
  }
  if (cudaError_t e = cudaHostUnregister(memory->host)) return fail_cuda(call, e, "cudaHostUnregister(%p)", memory->host);
  munmap(memory->host, memory->bytes);
  return UVM_OK;
}

}  // namespace uvm
