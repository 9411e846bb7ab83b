// The advice uvm_malloc applies to new allocations: set by uvm_set_default_advice, else
// UVM_DEFAULT_ADVICE (alloc/options.hpp), else "device".
#pragma once

#include "errors.hpp"

namespace uvm {

// The mode in force; fails (naming the variable) if an option is not understood.
uvm_status default_advice(const Call& call, uvm_advice_mode* mode);

}  // namespace uvm
