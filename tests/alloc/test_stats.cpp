// Stats stay exact, including under 8 threads allocating and freeing at once.
#include "../../alloc/span_set.hpp"
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

TEST_CASE("span sets add, merge and remove exactly", "[stats][spans]") {
  uvm::SpanSet spans;
  CHECK(spans.add(100, 200) == 100);
  CHECK(spans.add(150, 250) == 50);  // overlaps: only the new bytes count
  CHECK(spans.total() == 150);
  CHECK(spans.add(250, 300) == 50);  // touches: merged
  REQUIRE(spans.spans().size() == 1);
  CHECK(spans.spans()[0] == std::make_pair(size_t{100}, size_t{300}));
  CHECK(spans.add(0, 10) == 10);
  CHECK(spans.spans().size() == 2);
  CHECK(spans.remove(150, 160) == 10);  // splits
  CHECK(spans.spans().size() == 3);
  CHECK(spans.total() == 200);
  CHECK(spans.remove(5, 1000) == 195);
  CHECK(spans.total() == 5);
  CHECK(spans.add(10, 10) == 0);
  CHECK(spans.remove(7, 3) == 0);
  CHECK(spans.add(0, 400) == 395);
  CHECK(spans.spans().size() == 1);
}
