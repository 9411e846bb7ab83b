// Pinned (page-locked) host memory for staging, got the fastest way measured, with
// cudaHostAlloc as the fallback: mmap + transparent huge pages + up to 16 threads faulting the pages in +
// cudaHostRegister was several times faster to get and to free than cudaHostAlloc, cudaMallocHost
// or a plain registration, and copies run at the same speed either way (bench/probes/pinned_probe.cpp;
// docs/measurements.md, "Pinned memory"). Most of cudaHostAlloc's time is the kernel faulting
// 4 KiB pages in one at a time on one thread.
#pragma once

#include <condition_variable>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <mutex>
#include <string>

#include "../../alloc/errors.hpp"
#include "../../alloc/options.hpp"

namespace uvm {

// PinnedKind (alloc/options.hpp, UVM_PINNED): register (the default: mmap, huge pages, parallel
// fault-in, cudaHostRegister; cudaHostAlloc if any of that fails), hostalloc (cudaHostAlloc only),
// or pageable: mapped and faulted in the same way but never pinned, for hosts short on pinnable
// memory; copies to and from it are staged by the driver and slower (docs/performance.md).

// How far pinning in steps has come: the first `pinned` bytes are registered. Written by the
// pinning thread, read by whoever waits for room.
//
// While paced (an offload copies into each step as it is pinned), the pinning thread registers
// the next step only once the copies into the steps pinned so far are issued: the driver issued
// copies slowly beside a registration, and one step's copies then took several times as long as
// the link needs (traces; docs/measurements.md, "A pause without retained memory: the wall").
// It waits without bound for copies reserved and not yet issued (the offload issues them at once,
// or ends the pacing when it fails), and at most kPaceWait for a reservation to come.
struct StepPinning {
  std::mutex mutex;
  std::condition_variable changed;
  size_t pinned = 0;
  bool done = false;     // every step registered, or one failed (then `failure` says why)
  std::string failure;
  int pacers = 0;        // offloads taking the steps (begin_pacing, end_pacing): paced while any is
  size_t reserved = 0;   // the bytes from the start that offloads have reserved
  size_t issued = 0;     // the bytes from the start whose copies are issued
  // Asked to stop (stop_pinning: uvm_release_staging found the block unused): the step being registered
  // ends, no further one starts, and `done` comes with `pinned` short of the block's size.
  bool stop = false;
};


// How many times a pinning thread has parked waiting for the copies into its steps to be issued
// (each time, it registers nothing more until an offload notes copies issued or ends its pacing):
// tests wait for it instead of waiting for time to pass.
uint64_t pinning_parked_count();

// How long the pinning thread waits, after a step, for an offload to reserve it: an offload
// waiting for the step reserves it well within this; past it, no copy is coming.
constexpr int kPaceWaitMs = 50;

// Whether a pinning in steps waits for the copies into each step before registering the next.
enum class StepPacing { none, copies_first };

// The size of a step: big enough that registering it costs little beyond its pages, small enough
// that the copies into the first steps overlap the pinning of the rest (256 MiB steps, the next
// faulted in while this one registers, nearly doubled a first offload's speed against pinning
// everything first: docs/measurements.md, "The first offload").
constexpr size_t kPinStepBytes = size_t{256} << 20;

struct PinnedMemory {
  char* host = nullptr;
  size_t bytes = 0;
  PinnedKind kind = PinnedKind::host_alloc;
  std::shared_ptr<StepPinning> steps;  // set while or after pinning in steps
};

// `bytes` of pinned memory got the `wanted` way, portable to every device's context
// (cudaHostAllocPortable or cudaHostRegisterPortable). Memory mapped by uvm (registered or
// pageable) is placed on the NUMA node of `near_device` where the host has several (numa.hpp;
// -1: nowhere in particular); cudaHostAlloc's is where the driver puts it. Fails naming
// cudaHostAlloc, and why registration did not serve.
uvm_status pin_host_memory(const Call& call, size_t bytes, PinnedKind wanted, PinnedMemory* out, int near_device = -1);

// Maps `bytes` the registered way (on `device`'s NUMA node, as pin_host_memory) and returns at once: a thread of its own faults the pages in
// and registers them kPinStepBytes at a time, faulting the next step in while it registers this
// one, on `device`'s context; out->steps says how far it is. With StepPacing::copies_first the
// caller is its first pacer: it reports its reservations and copies (note_steps_reserved,
// note_copies_issued) and calls end_pacing when it takes no more steps. Falls back to
// pin_host_memory when the memory cannot be mapped.
uvm_status pin_host_memory_in_steps(const Call& call, size_t bytes, int device, PinnedMemory* out,
                                    StepPacing pacing = StepPacing::none);

// An offload begins taking steps of memory pinned in steps / reserved the first `through` bytes of
// it / issued the copies into them / takes no more of its steps. Once no offload takes them, the
// steps left are registered without waiting.
void begin_pacing(StepPinning& pinning);
void note_steps_reserved(StepPinning& pinning, size_t through);
void note_copies_issued(StepPinning& pinning, size_t through);
void end_pacing(StepPinning& pinning);

// The bytes of `memory` usable now: all of it, or for memory pinned in steps the steps registered.
size_t pinned_bytes_now(const PinnedMemory& memory);

// The bytes of `memory` usable once its pinning ends: all of it, unless a step failed or it was stopped.
size_t pinned_bytes_eventually(const PinnedMemory& memory);

// Whether pinning `memory` in steps stopped at a step that could not be registered.
bool pinning_failed(const PinnedMemory& memory);
// Asks a pinning in steps to stop after the step in flight (returns at once).
void stop_pinning(StepPinning& pinning);
// Waits until a pinning in steps has ended: every step pinned, a step failed, or it was stopped.
void wait_for_pinning_end(StepPinning& pinning);
// Whether a pinning in steps was stopped before all of it was pinned (then its block holds `pinned`
// bytes and is given back whole, never cut).
bool pinning_stopped(const PinnedMemory& memory);

// Gives back `bytes` (a multiple of kPinStepBytes, or up to the end of the memory) of memory pinned
// in steps from `host`, where a step starts: each step is unregistered, then all of it unmapped.
// An unregistration that fails stops there, naming cudaHostUnregister: the steps before it are
// unmapped, and `given_back` says how many bytes they hold (all of them on success); the rest is
// still registered and mapped, for another try.
uvm_status unpin_steps(const Call& call, char* host, size_t bytes, size_t* given_back);

// Gives back memory from pin_host_memory or pin_host_memory_in_steps (waiting for its pinning to
// end: cudaHostUnregister + munmap, or cudaFreeHost). On failure `memory` describes what is left
// (for memory pinned in steps, the steps from the one that failed), and a second call gives it back.
uvm_status unpin_host_memory(const Call& call, PinnedMemory* memory);

// The kind UVM_PINNED asks for.
inline PinnedKind configured_pinned_kind() { return options().pinned; }

}  // namespace uvm
