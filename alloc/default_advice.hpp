// The advice uvm_malloc applies to new allocations: set by uvm_set_default_advice, else read once
// from env UVM_DEFAULT_ADVICE=device|host|none, else "device".
#pragma once

#include "errors.hpp"

namespace uvm {

// Parses "device", "host" or "none" (case-insensitive). False for anything else.
bool parse_advice_mode(const char* text, uvm_advice_mode* mode);

// The mode in force; fails (naming the env value) if UVM_DEFAULT_ADVICE is malformed.
uvm_status default_advice(const Call& call, uvm_advice_mode* mode);

}  // namespace uvm
