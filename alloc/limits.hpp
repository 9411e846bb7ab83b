// The per-device cap on live managed bytes. Default: the device's total memory, so that
// oversubscription (which can hang a shared GPU) is always an explicit choice.
#pragma once

#include <cstddef>
#include <string>

#include "errors.hpp"

namespace uvm {

// The cap in force for `device`: uvm_set_limit's value, else env, else total memory.
uvm_status effective_limit(const Call& call, int device, size_t* limit);

// Parses UVM_LIMIT_BYTES (integer, optional K/M/G/T binary suffix) or UVM_LIMIT_FRACTION (number >
// 0, of `total_memory`); either may be null (unset). Neither set: *limit = total_memory. Returns
// false with `why` when a value is malformed or both are set.
bool parse_limit_env(const char* bytes_text, const char* fraction_text, size_t total_memory,
                     size_t* limit, std::string* why);

}  // namespace uvm
