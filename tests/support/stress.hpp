// The threaded allocate/free run shared by the CPU (test double) and GPU suites: `threads` threads
// each allocate and free `rounds` times on device 0, with sizes from 256 bytes up to `max_size`.
// It checks that the stats come out exact.
#pragma once

#include <thread>
#include <vector>

#include "uvm_test.hpp"

inline void check_threaded_alloc_free(int threads, int rounds, size_t max_size) {
  REQUIRE(uvm_reset_peak(0) == UVM_OK);
  uvm_stats before{};
  REQUIRE(uvm_get_stats(0, &before) == UVM_OK);
  std::vector<int> failures(threads, 0);
  std::vector<std::thread> workers;
  for (int t = 0; t < threads; ++t) {
    workers.emplace_back([t, rounds, max_size, &failures] {
      for (int i = 0; i < rounds; ++i) {
        const size_t size = 256 + static_cast<size_t>(t * 7919 + i * 104729) % (max_size - 256);
        void* ptr = uvm_malloc(size, 0, nullptr);
        if (ptr == nullptr) { ++failures[t]; continue; }
        uvm_free(ptr, size, 0, nullptr);
        if (uvm_last_status() != UVM_OK) ++failures[t];
      }
    });
  }
  for (auto& worker : workers) worker.join();
  for (int t = 0; t < threads; ++t) CHECK(failures[t] == 0);
  uvm_stats after{};
  REQUIRE(uvm_get_stats(0, &after) == UVM_OK);
  const uint64_t calls = static_cast<uint64_t>(threads) * static_cast<uint64_t>(rounds);
  CHECK(after.total_allocations - before.total_allocations == calls);
  CHECK(after.total_frees - before.total_frees == calls);
  CHECK(after.live_bytes == before.live_bytes);
  CHECK(after.live_allocations == before.live_allocations);
  CHECK(after.peak_bytes <= before.live_bytes + threads * max_size);
}
