// Freeing a uvm allocation: the device side of uvm_free (offload/moves/free.cpp adds the host side).
#pragma once

#include <memory>
#include <optional>

#include "registry.hpp"

namespace uvm {

// Frees the allocation at `ptr`, made with `size` on `device` (a mismatch fails after freeing it),
// and takes its record out of the registry into `freed`: its host copies live until that is
// dropped. `exiting`: the CUDA runtime was found torn down (process exit), so nothing more can run.
uvm_status free_allocation(const Call& call, void* ptr, size_t size, int device, std::optional<Allocation>* freed,
                           bool* exiting);

// What a part above alloc/ keeps of an allocation, which a free takes out with the record and puts
// back should the free fail (share/: the processes that map it, so that a pause is still refused
// while they do). alloc/ holds it without knowing what it is. The part sets the two once, before it
// keeps anything; both run under the moves lock.
struct KeptByAPart {
  std::shared_ptr<void> (*take)(uintptr_t base) = nullptr;         // nullptr: nothing kept of it
  void (*put_back)(uintptr_t base, std::shared_ptr<void> kept) = nullptr;
};
void set_kept_by_a_part(KeptByAPart hooks);

}  // namespace uvm
