// Stats stay exact, including under 8 threads allocating and freeing at once.
#include <thread>
#include <vector>

#include "../../alloc/span_set.hpp"
#include "fixture.hpp"

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
  REQUIRE(uvm_reset_peak(0) == UVM_OK);
  uvm_stats before{};
  REQUIRE(uvm_get_stats(0, &before) == UVM_OK);
  constexpr int kThreads = 8, kRounds = 10000;
  std::vector<std::thread> threads;
  std::vector<int> failures(kThreads, 0);
  for (int t = 0; t < kThreads; ++t) {
    threads.emplace_back([t, &failures] {
      for (int i = 0; i < kRounds; ++i) {
        const size_t size = 256 + static_cast<size_t>((t * 7919 + i * 104729) % 4096);
        void* ptr = uvm_malloc(size, 0, nullptr);
        if (ptr == nullptr) { ++failures[t]; continue; }
        static_cast<char*>(ptr)[size - 1] = 1;
        uvm_free(ptr, size, 0, nullptr);
        if (uvm_last_status() != UVM_OK) ++failures[t];
      }
    });
  }
  for (auto& thread : threads) thread.join();
  for (int t = 0; t < kThreads; ++t) CHECK(failures[t] == 0);
  uvm_stats after{};
  REQUIRE(uvm_get_stats(0, &after) == UVM_OK);
  CHECK(after.total_allocations - before.total_allocations == uint64_t{kThreads} * kRounds);
  CHECK(after.total_frees - before.total_frees == uint64_t{kThreads} * kRounds);
  CHECK(after.live_bytes == before.live_bytes);
  CHECK(after.live_allocations == before.live_allocations);
  CHECK(after.peak_bytes <= before.live_bytes + kThreads * (256 + 4096));
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
