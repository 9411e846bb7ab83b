// The per-device cap on live managed bytes. Default: the device's total memory, so that
// oversubscription (which can hang a shared GPU) is always an explicit choice.
#pragma once

#include <cstddef>

#include "errors.hpp"
#include "options.hpp"

namespace uvm {

// The cap in force for `device`: uvm_set_limit's value, else default_limit.
uvm_status effective_limit(const Call& call, int device, size_t* limit);

// The limit the options give a device of `total_memory` bytes: UVM_LIMIT_BYTES, else
// UVM_LIMIT_FRACTION of it, else all of it.
size_t default_limit(const Options& options, size_t total_memory);

}  // namespace uvm
