// Catch2 v2 (Debian's catch2 package, a single header) or v3, whichever is installed.
#pragma once
#ifdef UVM_CATCH2_V3
#include <catch2/catch_all.hpp>
using Catch::Approx;  // v2 has it at global scope, and the tests name it so
#else
#include <catch2/catch.hpp>
#endif
