// Stats stay exact, including under 8 threads allocating and freeing at once.
#include "fixture.hpp"
#include "stress.hpp"

TEST_CASE("peak bytes and reset", "[stats]") {
  FakeMachine machine;
  REQUIRE(uvm_reset_peak(1) == UVM_OK);
  uvm_stats base{};
  REQUIRE(uvm_get_stats(1, &base) == UVM_OK);
  void* a = uvm_malloc(1000, 1, nullptr);
  void* b = uvm_malloc(3000, 1, nullptr);
  uvm_free(a, 1000, 1, nullptr);
  uvm_stats stats{};
  REQUIRE(uvm_get_stats(1, &stats) == UVM_OK);
  CHECK(stats.live_bytes == base.live_bytes + 3000);
  CHECK(stats.peak_bytes == base.live_bytes + 4000);
  REQUIRE(uvm_reset_peak(1) == UVM_OK);
  REQUIRE(uvm_get_stats(1, &stats) == UVM_OK);
  CHECK(stats.peak_bytes == stats.live_bytes);
  uvm_free(b, 3000, 1, nullptr);
  CHECK(uvm_get_stats(1, nullptr) == UVM_ERROR_INVALID_ARGUMENT);
  CHECK(uvm_get_stats(-1, &stats) == UVM_ERROR_INVALID_ARGUMENT);
  CHECK(uvm_reset_peak(3) == UVM_ERROR_INVALID_ARGUMENT);
}

TEST_CASE("8 threads x 10000 allocations keep exact stats", "[stats][threads]") {
  FakeMachine machine;
  check_threaded_alloc_free(8, 10000, 4096 + 256);
  CHECK(fake::live_allocations() == 0);
}
