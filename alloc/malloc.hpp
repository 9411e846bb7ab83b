// Freeing a uvm allocation: the device side of uvm_free (offload/moves/free.cpp adds the host side).
#pragma once

#include <optional>

#include "registry.hpp"

namespace uvm {

// Frees the allocation at `ptr`, made with `size` on `device` (a mismatch fails after freeing it),
// and takes its record out of the registry into `freed`: its host copies live until that is
// dropped. `exiting`: the CUDA runtime was found torn down (process exit), so nothing more can run.
uvm_status free_allocation(const Call& call, void* ptr, size_t size, int device, std::optional<Allocation>* freed,
                           bool* exiting);

}  // namespace uvm
