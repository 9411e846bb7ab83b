#include "release.hpp"

#include <set>

#include "../alloc/vmm.hpp"

namespace uvm {
namespace {

std::set<uintptr_t> releasable_allocations(const std::vector<HintRange>& ranges) {
  std::set<uintptr_t> found;
  for (const HintRange& range : ranges) {
    if (range.releasable) found.insert(range.allocation);
  }
  return found;
}

}  // namespace

uvm_status release_emptied(const Call& call, const std::vector<HintRange>& ranges, cudaStream_t stream) {
  bool waited = false;
  for (uintptr_t base : releasable_allocations(ranges)) {
    if (!vmm_mapped(base) || !registry().all_off_device(base)) continue;
    if (!waited) {
      if (cudaError_t e = cudaStreamSynchronize(stream)) {
        return fail_cuda(call, e, "cudaStreamSynchronize (copies out of %p before releasing its memory)",
                         reinterpret_cast<void*>(base));
      }
      waited = true;
    }
    if (uvm_status s = vmm_release_physical(call, base)) return s;
    registry().set_released(base, true);
  }
  return UVM_OK;
}

uvm_status restore_released(const Call& call, const std::vector<HintRange>& ranges) {
  for (uintptr_t base : releasable_allocations(ranges)) {
    if (vmm_mapped(base)) continue;
    if (uvm_status s = vmm_restore_physical(call, base)) return s;
    registry().set_released(base, false);
  }
  return UVM_OK;
}

}  // namespace uvm
