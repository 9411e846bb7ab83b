// UVM_DEFAULT_ADVICE, read when uvm_set_default_advice was never called. Runs in its own process
// (meson test alloc-env) because any earlier uvm_set_default_advice call takes precedence.
#include "../../alloc/default_advice.hpp"
#include "fake_cuda.hpp"
#include "uvm_test.hpp"

TEST_CASE("UVM_DEFAULT_ADVICE=host places new allocations on the host", "[env][scenario]") {
  fake::reset();
  CHECK(uvm_get_default_advice() == UVM_ADVICE_HOST);
  void* ptr = uvm_malloc(4096, 0, nullptr);
  REQUIRE(ptr != nullptr);
  int preferred = 0;
  REQUIRE(uvm_query_location(ptr, 4096, &preferred, nullptr) == UVM_OK);
  CHECK(preferred == UVM_LOCATION_CPU);
  uvm_free(ptr, 4096, 0, nullptr);
}

TEST_CASE("advice names are parsed case-insensitively and strictly", "[advice]") {
  uvm_advice_mode mode = UVM_ADVICE_NONE;
  CHECK(uvm::parse_advice_mode("device", &mode));
  CHECK(mode == UVM_ADVICE_DEVICE);
  CHECK(uvm::parse_advice_mode("HOST", &mode));
  CHECK(mode == UVM_ADVICE_HOST);
  CHECK(uvm::parse_advice_mode("None", &mode));
  CHECK(mode == UVM_ADVICE_NONE);
  CHECK_FALSE(uvm::parse_advice_mode("gpu", &mode));
  CHECK_FALSE(uvm::parse_advice_mode("", &mode));
  CHECK_FALSE(uvm::parse_advice_mode(nullptr, &mode));
}
