// Helpers shared by the test programs.
#pragma once

#include <string>

#include "catch.hpp"
#include "uvm.h"

// The thread's last uvm error as a std::string, for Catch2's Contains matchers and messages.
inline std::string last_error() { return uvm_last_error(); }

// Clears uvm's last error so a test can tell whether a call recorded one.
struct FreshError {
  FreshError() { uvm_clear_last_error(); }
};

inline void* as_ptr(uintptr_t address) { return reinterpret_cast<void*>(address); }

// Substring matcher for CHECK_THAT, under both Catch2 v2 and v3 names.
#ifdef UVM_CATCH2_V3
inline auto Has(const std::string& text) { return Catch::Matchers::ContainsSubstring(text); }
#else
inline auto Has(const std::string& text) { return Catch::Contains(text); }
#endif
