// Slabs (alloc/slabs.hpp): PyTorch's 2 MiB small-tensor segments share managed allocations, yet each
// is its own uvm allocation; a freed slot is reused only when no page of it may count as discarded.
#include <mutex>
#include <set>
#include <thread>
#include <vector>

#include "../../alloc/slabs.hpp"
#include "fixture.hpp"

namespace {

constexpr size_t kSlot = size_t{2} << 20;

size_t ops_of(fake::OpKind kind) { return FakeMachine::ops_named(kind).size(); }

uvm_stats stats_of(int device) {
  uvm_stats stats{};
  REQUIRE(uvm_get_stats(device, &stats) == UVM_OK);
  return stats;
}

}  // namespace

TEST_CASE("2 MiB allocations come from shared slabs, each its own uvm allocation", "[malloc][slabs]") {
  FakeMachine machine;
  const size_t slabs_before = uvm::live_slabs();
  std::vector<void*> slots;
  for (int i = 0; i < 40; ++i) slots.push_back(uvm_malloc(kSlot, 0, nullptr));
  for (void* slot : slots) REQUIRE(slot != nullptr);
  CHECK(ops_of(fake::OpKind::malloc) == 2);  // 32 slots a slab: two driver allocations for 40
  CHECK(uvm::live_slabs() == slabs_before + 2);
  CHECK(static_cast<char*>(slots[1]) - static_cast<char*>(slots[0]) == static_cast<long>(kSlot));
  for (void* slot : slots) {
    void* base = nullptr;
    size_t size = 0;
    int device = -1;
    REQUIRE(uvm_allocation_info(static_cast<char*>(slot) + 5, &base, &size, &device) == UVM_OK);
    CHECK(base == slot);
    CHECK(size == kSlot);
  }
  CHECK(stats_of(0).live_allocations == 40);
  CHECK(stats_of(0).live_bytes == 40 * kSlot);
  // The default advice is set on each slot, never on its neighbours.
  for (const fake::Op& op : FakeMachine::ops_named(fake::OpKind::advise_preferred)) CHECK(op.size == kSlot);
  // Other sizes keep a driver allocation of their own.
  void* small = uvm_malloc(kSlot - 512, 0, nullptr);
  void* big = uvm_malloc(kSlot + 512, 0, nullptr);
  CHECK(ops_of(fake::OpKind::malloc) == 4);
  uvm_free(small, kSlot - 512, 0, nullptr);
  uvm_free(big, kSlot + 512, 0, nullptr);

  fake::reset_ops();
  for (size_t i = 0; i + 1 < slots.size(); ++i) uvm_free(slots[i], kSlot, 0, nullptr);
  // Each free waits for the device, as cudaFree does; the first slab went back once empty.
  CHECK(ops_of(fake::OpKind::device_sync) == slots.size() - 1);
  REQUIRE(ops_of(fake::OpKind::free) == 1);
  CHECK(FakeMachine::ops_named(fake::OpKind::free)[0].ptr == slots[0]);
  uvm_free(slots.back(), kSlot, 0, nullptr);
  CHECK(ops_of(fake::OpKind::free) == 2);
  CHECK(uvm::live_slabs() == slabs_before);
  CHECK(stats_of(0).live_allocations == 0);
  CHECK(uvm_last_status() == UVM_OK);
}

TEST_CASE("a freed slot is handed out again; a pointer inside a slot is refused", "[malloc][slabs]") {
  FakeMachine machine;
  void* a = uvm_malloc(kSlot, 1, nullptr);
  void* b = uvm_malloc(kSlot, 1, nullptr);
  uvm_free(static_cast<char*>(a) + 4096, kSlot, 1, nullptr);
  CHECK(uvm_last_status() == UVM_ERROR_INVALID_ARGUMENT);
  CHECK_THAT(std::string(uvm_last_error()), Has("not its start"));
  uvm_clear_last_error();
  uvm_free(a, kSlot, 1, nullptr);
  CHECK(uvm_last_status() == UVM_OK);
  void* again = uvm_malloc(kSlot, 1, nullptr);
  CHECK(again == a);
  void* other_device = uvm_malloc(kSlot, 0, nullptr);  // slabs are per device
  CHECK(other_device != nullptr);
  void* base = nullptr;
  int device = -1;
  REQUIRE(uvm_allocation_info(other_device, &base, nullptr, &device) == UVM_OK);
  CHECK(device == 0);
  for (void* p : {again, b}) uvm_free(p, kSlot, 1, nullptr);
  uvm_free(other_device, kSlot, 0, nullptr);
  CHECK(uvm_last_status() == UVM_OK);
}

TEST_CASE("the limit counts slots, not slabs", "[limits][slabs]") {
  FakeMachine machine;
  REQUIRE(uvm_set_limit(0, 5 << 20) == UVM_OK);
  void* a = uvm_malloc(kSlot, 0, nullptr);
  void* b = uvm_malloc(kSlot, 0, nullptr);
  CHECK(uvm_malloc(kSlot, 0, nullptr) == nullptr);
  CHECK(uvm_last_status() == UVM_ERROR_LIMIT_EXCEEDED);
  CHECK(ops_of(fake::OpKind::malloc) == 1);
  for (void* p : {a, b}) uvm_free(p, kSlot, 0, nullptr);
  REQUIRE(uvm_set_limit(0, 0) == UVM_OK);
}

TEST_CASE("a slab that cannot be allocated fails the allocation cleanly", "[malloc][slabs]") {
  FakeMachine machine;
  fake::fail_next("cudaMallocManaged", cudaErrorMemoryAllocation);
  CHECK(uvm_malloc(kSlot, 0, nullptr) == nullptr);
  CHECK(uvm_last_status() == UVM_ERROR_OUT_OF_MEMORY);
  CHECK_THAT(std::string(uvm_last_error()), Has("a slab of 32 small-tensor segments"));
  CHECK(cudaPeekAtLastError() == cudaSuccess);
  CHECK(stats_of(0).live_bytes == 0);
  fake::fail_next("cudaMemAdvise", cudaErrorInvalidValue);  // the slab exists; the slot's advice fails
  CHECK(uvm_malloc(kSlot, 0, nullptr) == nullptr);
  CHECK(cudaPeekAtLastError() == cudaSuccess);
  CHECK(uvm::live_slabs() == 0);  // the slot went back, and with it its slab
  CHECK(stats_of(0).live_allocations == 0);
}

TEST_CASE("an emptied slab whose cudaFree fails stays, empty, for the next slot", "[malloc][slabs][errors]") {
  // Issue 58 item 5: the slab left uvm's books before cudaFree, so a failure there lost it.
  FakeMachine machine;
  void* slot = uvm_malloc(kSlot, 0, nullptr);
  REQUIRE(slot != nullptr);
  fake::fail_next("cudaFree", cudaErrorLaunchFailure);
  uvm_free(slot, kSlot, 0, nullptr);
  CHECK(uvm_last_status() == UVM_ERROR_CUDA);
  CHECK_THAT(std::string(uvm_last_error()), Has("a slab of small-tensor segments") && Has("cudaErrorLaunchFailure") &&
                                                Has("the slot was freed"));
  CHECK(cudaPeekAtLastError() == cudaSuccess);
  CHECK(uvm_allocation_info(slot, nullptr, nullptr, nullptr) == UVM_ERROR_NOT_MANAGED);  // the slot went
  CHECK(stats_of(0).live_bytes == 0);
  CHECK(uvm::live_slabs() == 1);  // its slab stayed
  const size_t slabs_made = ops_of(fake::OpKind::malloc);
  void* again = uvm_malloc(kSlot, 0, nullptr);
  REQUIRE(again != nullptr);
  CHECK(ops_of(fake::OpKind::malloc) == slabs_made);  // the kept slab served it
  uvm_clear_last_error();
  uvm_free(again, kSlot, 0, nullptr);
  CHECK(uvm_last_status() == UVM_OK);
  CHECK(uvm::live_slabs() == 0);
  CHECK(fake::live_allocations() == 0);
}

TEST_CASE("threads allocating and freeing slots never share one", "[slabs][threads]") {
  FakeMachine machine;
  std::mutex mutex;
  std::set<void*> live;
  int shared = 0;
  std::vector<std::thread> threads;
  for (int t = 0; t < 4; ++t) {
    threads.emplace_back([&] {
      fake::set_thread_context(0);
      std::vector<void*> mine;
      for (int i = 0; i < 300; ++i) {
        if (i % 3 == 2 && !mine.empty()) {
          void* p = mine.back();
          mine.pop_back();
          {
            std::lock_guard<std::mutex> lock(mutex);
            live.erase(p);
          }
          uvm_free(p, kSlot, 0, nullptr);
          continue;
        }
        void* p = uvm_malloc(kSlot, 0, nullptr);
        if (p == nullptr) continue;
        std::lock_guard<std::mutex> lock(mutex);
        if (!live.insert(p).second) ++shared;
        mine.push_back(p);
      }
      for (void* p : mine) {
        {
          std::lock_guard<std::mutex> lock(mutex);
          live.erase(p);
        }
        uvm_free(p, kSlot, 0, nullptr);
      }
    });
  }
  for (auto& t : threads) t.join();
  CHECK(shared == 0);
  CHECK(stats_of(0).live_allocations == 0);
  CHECK(uvm::live_slabs() == 0);
}
