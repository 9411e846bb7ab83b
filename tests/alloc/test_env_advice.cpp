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

