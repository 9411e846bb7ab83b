#include "release.hpp"

#include <iterator>
#include <set>

#include "../../alloc/registry.hpp"
#include "../../alloc/vmm.hpp"
#include "trace.hpp"

namespace uvm {
namespace {

size_t allocation_size(uintptr_t base) {
  AllocationView found;
  return registry().find(reinterpret_cast<const void*>(base), &found) ? found.size : 0;
}

std::set<uintptr_t> releasable_allocations(const std::vector<HintRange>& ranges) {
  std::set<uintptr_t> found;
  for (const HintRange& range : ranges) {
    if (range.releasable) found.insert(range.allocation);
  }
  return found;
}

// An allocation whose bytes are all off its device, with its mapping, or false.
bool mapped_yet_moved_off(uintptr_t base, Mapping* mapping) {
  return registry().mapping(base, mapping) && mapping->mapped && registry().all_off_device(base);
}

// Where the offload's own copies out of the allocation at `base` end, if known.
EventRef own_copies(uintptr_t base, const CopiesDone& done) {
  auto entry = done.find(base);
  return entry == done.end() ? nullptr : entry->second.copied;
}

// Gives the physical memory of the emptied allocation at `base` back to the driver.
uvm_status release_one(const Call& call, uintptr_t base, Mapping* mapping) {
  HostPhase releasing(Phase::release);
  const uvm_status status = vmm_unmap(call, base, mapping);
  registry().set_mapping(base, *mapping);  // what the driver did, even half of it
  if (status != UVM_OK) return status;
  releasing.finish(allocation_size(base));
  return UVM_OK;
}

}  // namespace

uvm_status release_emptied(const Call& call, const std::vector<HintRange>& ranges, cudaStream_t stream,
                           const CopiesDone& done) {
  bool stream_done = false;
  for (uintptr_t base : releasable_allocations(ranges)) {
    Mapping mapping;
    if (!mapped_yet_moved_off(base, &mapping)) continue;
    // Its own copies, when they are known (the later ones keep running meanwhile), else the stream.
    const EventRef copies = own_copies(base, done);
    HostPhase waiting(Phase::wait);
    const bool own = copies && clear_cuda_error(cudaEventSynchronize(copies->handle)) == cudaSuccess;
    if (!own && !stream_done) {
      if (cudaError_t e = cudaStreamSynchronize(stream)) {
        return fail_cuda(call, e, "cudaStreamSynchronize (copies out of %p before releasing its memory)",
                         reinterpret_cast<void*>(base));
      }
      stream_done = true;
    }
    waiting.finish(0);
    if (uvm_status s = release_one(call, base, &mapping)) return s;
  }
  return UVM_OK;
}

void forget_moved_meanwhile(CopiesDone* done) {
  for (auto entry = done->begin(); entry != done->end();) {
    const std::vector<EventRef> last = registry().last_move_events({entry->first});
    const bool still_ours = last.empty() ? !entry->second.moved : last.front() == entry->second.moved;
    entry = still_ours ? std::next(entry) : done->erase(entry);
  }
}

uvm_status release_copied_already(const Call& call, const std::vector<HintRange>& ranges, const CopiesDone& done) {
  for (uintptr_t base : releasable_allocations(ranges)) {
    Mapping mapping;
    const EventRef copies = own_copies(base, done);
    if (!copies || !mapped_yet_moved_off(base, &mapping)) continue;
    if (clear_cuda_error(cudaEventQuery(copies->handle)) != cudaSuccess) continue;  // still copying
    if (uvm_status s = release_one(call, base, &mapping)) return s;
  }
  return UVM_OK;
}

uvm_status restore_one(const Call& call, uintptr_t base) {
  Mapping mapping;
  AllocationView found;
  if (!registry().mapping(base, &mapping) || mapping.mapped) return UVM_OK;
  if (!registry().find(reinterpret_cast<const void*>(base), &found)) return UVM_OK;
  HostPhase mapping_phase(Phase::map);
  if (uvm_status s = vmm_map(call, base, found.device, &mapping)) return s;
  registry().set_mapping(base, mapping);
  mapping_phase.finish(found.size);
  return UVM_OK;
}

uvm_status restore_released(const Call& call, const std::vector<HintRange>& ranges) {
  for (uintptr_t base : releasable_allocations(ranges)) {
    if (uvm_status s = restore_one(call, base)) return s;
  }
  return UVM_OK;
}

}  // namespace uvm
