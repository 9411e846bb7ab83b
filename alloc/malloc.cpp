// uvm_malloc and uvm_malloc_releasable: managed or releasable allocation with limit, default advice
// (managed only), registry and stats; and the device side of freeing, whose entry, uvm_free, is in
// offload/moves/free.cpp (it gives back the host copies of the bytes too).
#include <cuda_runtime_api.h>

#include <atomic>
#include <optional>

#include "blocks.hpp"
#include "cuda_compat.hpp"
#include "default_advice.hpp"
#include "devices.hpp"
#include "limits.hpp"
#include "malloc.hpp"
#include "moves.hpp"
#include "registry.hpp"
#include "slabs.hpp"
#include "stats.hpp"
#include "vmm.hpp"

namespace uvm {
namespace {

// The hooks of the part that keeps something per allocation (set_kept_by_a_part), set once and kept
// for the process's life (never destroyed: a free may run in another library's destructor).
std::atomic<const KeptByAPart*>& kept_by_a_part_hooks() {
  static std::atomic<const KeptByAPart*> hooks{nullptr};
  return hooks;
}

KeptByAPart kept_by_a_part() {
  const KeptByAPart* hooks = kept_by_a_part_hooks().load(std::memory_order_acquire);
  return hooks != nullptr ? *hooks : KeptByAPart{};
}

uvm_status apply_advice(const Call& call, void* ptr, size_t size, int device, uvm_advice_mode mode,
                        const DeviceCaps& caps) {
  // Without concurrent managed access the driver migrates whole allocations at launch time and
  // ignores placement advice, so there is nothing useful to set.
  if (mode == UVM_ADVICE_NONE || !caps.concurrent_managed_access) return UVM_OK;
  const int preferred = mode == UVM_ADVICE_HOST ? UVM_LOCATION_CPU : device;
  cudaError_t e = advise(ptr, size, cudaMemAdviseSetPreferredLocation, preferred);
  if (e != cudaSuccess) {
    return fail_cuda(call, e, "cudaMemAdvise(SetPreferredLocation, %s)",
                     device_text(preferred, DeviceArg::location).c_str());
  }
  e = advise(ptr, size, cudaMemAdviseSetAccessedBy, device);
  if (e != cudaSuccess) return fail_cuda(call, e, "cudaMemAdvise(SetAccessedBy, %d)", device);
  return UVM_OK;
}

// Gives a slot back after the work that may still use it finished (cudaFree would wait too), and
// frees its slab once no slot of it is in use.
uvm_status free_slot(const Call& call, uintptr_t slab, void* ptr, bool reusable, bool* slot_freed = nullptr);

// Managed memory with the default advice applied: its own cudaMallocManaged, or a slot of a slab
// (alloc/slabs.hpp), whose base goes to `slab`.
uvm_status allocate_managed(const Call& call, size_t size, int device, const DeviceCaps& caps,
                            uvm_advice_mode mode, void** out, uintptr_t* slab) {
  void* ptr = nullptr;
  if (slab_serves(size)) {
    if (uvm_status s = take_slot(call, device, &ptr, slab)) return s;
  } else if (cudaError_t e = cudaMallocManaged(&ptr, size, cudaMemAttachGlobal)) {
    return fail_cuda(call, e, "cudaMallocManaged");
  }
  if (uvm_status s = apply_advice(call, ptr, size, device, mode, caps)) {
    if (*slab != 0) (void)free_slot(call, *slab, ptr, true);  // the advice failed: the slot is as it was
    else clear_cuda_error(cudaFree(ptr));
    return s;
  }
  *out = ptr;
  return UVM_OK;
}

uvm_status allocate(const Call& call, size_t size, int device, Backing backing, void** out) {
  if (uvm_status s = check_options(call)) return s;
  if (uvm_status s = check_device(call, device, false)) return s;
  DeviceCaps caps;
  if (uvm_status s = device_caps(call, device, &caps)) return s;
  if (backing == Backing::managed && !caps.managed_memory) {
    return fail(call, UVM_ERROR_UNSUPPORTED, "device %d does not support managed memory", device);
  }
  uvm_advice_mode mode;
  if (uvm_status s = default_advice(call, &mode)) return s;
  size_t limit = 0;
  if (uvm_status s = effective_limit(call, device, &limit)) return s;
  Allocation record;  // first: copying the thread's tag may throw, and nothing is held yet
  record.size = size;
  record.device = device;
  record.tag = thread_tag();
  record.backup = thread_backup();
  record.compressed = thread_compression();
  record.backing = backing;
  record.reported_runtime = blocks_are_reported();
  size_t in_use = 0;
  if (!try_reserve(device, size, limit, &in_use)) {
    return fail(call, UVM_ERROR_LIMIT_EXCEEDED,
                "%zu bytes live + %zu requested would pass the limit of %zu bytes on device %d "
                "(raise it with uvm_set_limit or UVM_LIMIT_BYTES / UVM_LIMIT_FRACTION)",
                in_use, size, limit, device);
  }
  ContextScope scope;
  uvm_status status = scope.enter(call, device, ContextScope::When::always);
  void* ptr = nullptr;
  if (status == UVM_OK) {
    status = backing == Backing::managed ? allocate_managed(call, size, device, caps, mode, &ptr, &record.slab)
                                         : vmm_allocate(call, size, device, thread_exportable(), &ptr, &record.mapping);
  }
  if (status != UVM_OK) {
    cancel_reservation(device, size);
    return status;
  }
  // A fresh record: nothing uvm knew about these addresses before can describe the new memory. With
  // no host memory to record it in, the memory goes back before the exception goes on (guarded).
  const Mapping mapping = record.mapping;
  const uintptr_t slab = record.slab;
  try {
    registry().insert(reinterpret_cast<uintptr_t>(ptr), std::move(record));
  } catch (...) {
    Mapping undo = mapping;
    if (backing == Backing::releasable) (void)vmm_free(call, reinterpret_cast<uintptr_t>(ptr), &undo);
    else if (slab != 0) (void)free_slot(call, slab, ptr, true);
    else clear_cuda_error(cudaFree(ptr));
    cancel_reservation(device, size);
    throw;
  }
  commit_reservation(device, size);
  *out = ptr;
  return UVM_OK;
}

bool exiting_error(cudaError_t e) {
  return e == cudaErrorCudartUnloading || e == cudaErrorContextIsDestroyed;
}

// Gives the slot at `ptr` back to its slab, and frees the slab if that emptied it. `*slot_freed`:
// the slot is no longer the caller's, even when freeing its slab then failed (the slab stays, to
// serve the next slot).
uvm_status free_slot(const Call& call, uintptr_t slab, void* ptr, bool reusable, bool* slot_freed) {
  bool emptied = false;
  if (uvm_status s = give_back_slot(call, slab, ptr, reusable, &emptied)) return s;
  if (slot_freed != nullptr) *slot_freed = true;
  if (!emptied) return UVM_OK;
  const cudaError_t e = cudaFree(reinterpret_cast<void*>(slab));
  const bool failed = e != cudaSuccess && !exiting_error(e);
  close_slab(slab, !failed);
  if (failed) {
    return fail_cuda(call, e, "cudaFree(%p: a slab of small-tensor segments, emptied by this free; the slot was freed "
                     "and the slab stays for the next one)", reinterpret_cast<void*>(slab));
  }
  clear_cuda_error(e);
  return UVM_OK;
}

// Takes the allocation's record out of the registry under the moves lock, so that no move can
// stage or map it after this; a move issued before is waited for by cudaFree (or the device
// synchronization below), which waits for the work still running. Its staged copies go back to
// staging with the record.
// What a part keeps of it goes with it, into `*kept`, to be put back if the free fails.
std::optional<Allocation> forget_allocation(void* ptr, std::shared_ptr<void>* kept) {
  const auto moves = lock_moves();
  std::optional<Allocation> found = registry().erase(reinterpret_cast<uintptr_t>(ptr));
  const KeptByAPart part = kept_by_a_part();
  if (found && part.take != nullptr) *kept = part.take(reinterpret_cast<uintptr_t>(ptr));
  return found;
}

// Waits for the device, as cudaFree would, before memory is unmapped or handed out again.
// `exiting`: the runtime is being torn down at process exit (nothing runs any more).
uvm_status synchronize_before(const Call& call, const char* why, bool* exiting) {
  const cudaError_t e = cudaDeviceSynchronize();
  *exiting = exiting_error(e);
  if (e != cudaSuccess && !*exiting) return fail_cuda(call, e, "cudaDeviceSynchronize before %s", why);
  clear_cuda_error(e);
  return UVM_OK;
}

}  // namespace

void set_kept_by_a_part(KeptByAPart hooks) {
  kept_by_a_part_hooks().store(new KeptByAPart(hooks), std::memory_order_release);  // once: kept for life
}

uvm_status free_allocation(const Call& call, void* ptr, size_t size, int device, std::optional<Allocation>* freed,
                           bool* exiting_out) {
  std::optional<Allocation>& found = *freed;
  bool& exiting = *exiting_out;
  exiting = false;
  // Memory that is unmapped or handed out again waits for its device before it is forgotten: a wait
  // that fails (a sticky error such as an illegal address) leaves it allocated and recorded, for the
  // caller to free again, instead of forgetting an address range and memory nothing then frees.
  bool waited = false;
  if (AllocationView before; registry().find(ptr, &before) && before.base == reinterpret_cast<uintptr_t>(ptr) &&
                             (before.backing == Backing::releasable || before.slab != 0)) {
    ContextScope scope;
    uvm_status s = scope.enter(call, before.device, ContextScope::When::always);
    if (s == UVM_OK) s = synchronize_before(call, before.slab != 0 ? "reusing the slot" : "unmapping", &exiting);
    if (s != UVM_OK) return s;  // still allocated: nothing was forgotten
    waited = true;
  }
  std::shared_ptr<void> kept;
  found = forget_allocation(ptr, &kept);
  if (!found) {
    AllocationView inside;
    if (registry().find(ptr, &inside)) {
      return fail(call, UVM_ERROR_INVALID_ARGUMENT,
                  "pointer is inside the uvm allocation at %p (%zu bytes), not its start; not freed",
                  reinterpret_cast<void*>(inside.base), inside.size);
    }
    return fail(call, UVM_ERROR_NOT_MANAGED,
                "pointer was not allocated by uvm_malloc (or was already freed); not freed");
  }
  const size_t moved_off = found->host.total() + found->discarded.total() + found->marked.total();
  uvm_status status = UVM_OK;
  bool gone = false;  // the memory left uvm: a failure before that leaves it to free again
  {
    ContextScope scope;
    status = scope.enter(call, found->device, ContextScope::When::always);
    if (found->backing == Backing::releasable) {
      // At process exit the driver takes the mapping with it: nothing is left to unmap.
      if (status == UVM_OK && !waited) status = synchronize_before(call, "unmapping", &exiting);
      if (status == UVM_OK && !exiting) status = vmm_free(call, reinterpret_cast<uintptr_t>(ptr), &found->mapping);
      gone = status == UVM_OK;
    } else if (found->slab != 0) {
      if (status == UVM_OK && !waited) status = synchronize_before(call, "reusing the slot", &exiting);
      // Staged, discarded or discard-marked bytes (host counts staged ones, and migrated ones, to be
      // safe) may leave pages the driver counts as discarded: such a slot is not handed out again.
      if (status == UVM_OK) status = free_slot(call, found->slab, ptr, moved_off == 0, &gone);
    } else if (status == UVM_OK) {
      const cudaError_t e = cudaFree(ptr);
      exiting = exiting_error(e);
      if (e != cudaSuccess && !exiting) status = fail_cuda(call, e, "cudaFree");
      else clear_cuda_error(e);
      gone = status == UVM_OK;
    }
  }
  if (!gone) {
    // Still allocated, with whatever part of the way the driver went (vmm_free keeps what it could
    // not give back): recorded again, for a second free. The range is still uvm's, so no allocation
    // made meanwhile can have taken its address.
    registry().insert(reinterpret_cast<uintptr_t>(ptr), std::move(*found));
    found.reset();
    // What a part kept too (its importers: a pause must still be refused while another process maps
    // the memory).
    const KeptByAPart part = kept_by_a_part();
    if (kept && part.put_back != nullptr) part.put_back(reinterpret_cast<uintptr_t>(ptr), std::move(kept));
    return status;
  }
  record_free(found->device, found->size, found->host.total());
  if (status == UVM_OK && (size != found->size || device != found->device)) {
    return fail(call, UVM_ERROR_INVALID_ARGUMENT,
                "allocation was made with size=%zu device=%d; freed anyway", found->size,
                found->device);
  }
  return status;
}

namespace {

// The body of both allocation entries: size 0 gives NULL without an error.
void* allocate_entry(const char* name, size_t size, int device, Backing backing) {
  if (size == 0) return nullptr;
  const Call call = Call::of(name).with_size(size).with_device(device);
  void* ptr = nullptr;
  const uvm_status status = guarded(call, [&] { return allocate(call, size, device, backing, &ptr); });
  return status == UVM_OK ? ptr : nullptr;
}

}  // namespace
}  // namespace uvm

extern "C" {

void* uvm_malloc(size_t size, int device, cudaStream_t /*stream: allocation is not stream-ordered*/) {
  return uvm::allocate_entry("uvm_malloc", size, device, uvm::Backing::managed);
}

void* uvm_malloc_releasable(size_t size, int device, cudaStream_t /*stream: mapping is not stream-ordered*/) {
  return uvm::allocate_entry("uvm_malloc_releasable", size, device, uvm::Backing::releasable);
}

}  // extern "C"
