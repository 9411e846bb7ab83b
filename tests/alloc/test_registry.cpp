// The registry's queries (alloc/registry.cpp): which allocations uvm holds, found by pointer, by
// device and by tag, each listed with its device and backing; and what it asks of the part of a
// record another room keeps there (RoomPart).
#include <memory>
#include <thread>
#include <utility>
#include <vector>

#include "../../alloc/registry.hpp"
#include "fixture.hpp"

namespace {

// Whether no thread holds the registry's lock (false: this thread holds it). Tried, not waited for.
bool registry_lock_is_free() { return uvm::registry().lock_is_free_for_test(); }

// What a part gives back from forget(): notes, when destroyed, whether the registry's lock was free.
struct LetGo final : uvm::RoomPart {
  std::vector<bool>* destroyed_unlocked;
  explicit LetGo(std::vector<bool>* out) : destroyed_unlocked(out) {}
  ~LetGo() override { destroyed_unlocked->push_back(registry_lock_is_free()); }
  bool keeps(uintptr_t, uintptr_t) const override { return false; }
  std::unique_ptr<uvm::RoomPart> forget(uintptr_t, uintptr_t) override { return nullptr; }
};

// A room's part that keeps [kept_begin, kept_end) and records what it is told was discarded.
struct ProbePart final : uvm::RoomPart {
  uintptr_t kept_begin = 0, kept_end = 0;
  std::vector<std::pair<uintptr_t, uintptr_t>> forgotten;
  std::vector<bool>* destroyed_unlocked = nullptr;
  bool keeps(uintptr_t begin, uintptr_t end) const override { return begin < kept_end && kept_begin < end; }
  std::unique_ptr<uvm::RoomPart> forget(uintptr_t begin, uintptr_t end) override {
    forgotten.emplace_back(begin, end);
    return std::make_unique<LetGo>(destroyed_unlocked);
  }
};

std::vector<uvm_allocation> list(int device, const char* tag) {
  size_t count = 0;
  REQUIRE(uvm_list_allocations(device, tag, nullptr, 0, &count) == UVM_OK);
  std::vector<uvm_allocation> found(count);
  size_t again = 0;
  REQUIRE(uvm_list_allocations(device, tag, found.data(), found.size(), &again) == UVM_OK);
  REQUIRE(again == count);
  return found;
}

}  // namespace

TEST_CASE("allocations are listed with their device and backing, selected by device and tag", "[registry]") {
  FakeMachine machine;
  REQUIRE(uvm_set_thread_tag("weights") == UVM_OK);
  void* managed0 = uvm_malloc(1 << 20, 0, nullptr);
  void* releasable0 = uvm_malloc_releasable(1 << 21, 0, nullptr);
  void* managed1 = uvm_malloc(1 << 16, 1, nullptr);
  REQUIRE(uvm_set_thread_tag(nullptr) == UVM_OK);
  void* untagged = uvm_malloc(4096, 1, nullptr);
  REQUIRE((managed0 && releasable0 && managed1 && untagged));

  const auto weights = list(UVM_ANY_DEVICE, "weights");
  REQUIRE(weights.size() == 3);
  for (const uvm_allocation& a : weights) {
    if (a.ptr == managed0) CHECK((a.size == (1u << 20) && a.device == 0 && a.releasable == 0));
    else if (a.ptr == releasable0) CHECK((a.size == (1u << 21) && a.device == 0 && a.releasable == 1));
    else if (a.ptr == managed1) CHECK((a.size == (1u << 16) && a.device == 1 && a.releasable == 0));
    else FAIL("an allocation that was not made");
  }
  CHECK(weights[0].ptr < weights[1].ptr);  // by address
  CHECK(weights[1].ptr < weights[2].ptr);
  CHECK(list(1, nullptr).size() == 2);      // managed1 and the untagged one
  CHECK(list(1, "").size() == 1);           // untagged only
  CHECK(list(1, "").front().ptr == untagged);
  CHECK(list(0, "kv_cache").empty());       // a tag never set

  // uvm_allocation_ranges lists the same selection as plain ranges, in the same order.
  size_t count = 0;
  REQUIRE(uvm_allocation_ranges(UVM_ANY_DEVICE, "weights", nullptr, 0, &count) == UVM_OK);
  std::vector<uvm_range> ranges(count);
  REQUIRE(uvm_allocation_ranges(UVM_ANY_DEVICE, "weights", ranges.data(), count, &count) == UVM_OK);
  REQUIRE(count == weights.size());
  for (size_t i = 0; i < count; ++i) CHECK((ranges[i].ptr == weights[i].ptr && ranges[i].size == weights[i].size));

  // A capacity smaller than the selection writes only that many, and says how many there are.
  uvm_allocation first{};
  REQUIRE(uvm_list_allocations(UVM_ANY_DEVICE, "weights", &first, 1, &count) == UVM_OK);
  CHECK(count == 3);
  CHECK(first.ptr == weights[0].ptr);

  // Found by any byte inside, not past the end.
  void* base = nullptr;
  size_t size = 0;
  int device = -5;
  REQUIRE(uvm_allocation_info(static_cast<char*>(managed1) + 100, &base, &size, &device) == UVM_OK);
  CHECK((base == managed1 && size == (1u << 16) && device == 1));
  CHECK(uvm_allocation_info(static_cast<char*>(managed1) + (1 << 16), &base, nullptr, nullptr) ==
        UVM_ERROR_NOT_MANAGED);
  CHECK(uvm_is_managed(managed0) == 1);
  CHECK(uvm_is_managed(releasable0) == 0);  // device memory, not managed

  uvm_free(managed0, 1 << 20, 0, nullptr);
  uvm_free(releasable0, 1 << 21, 0, nullptr);
  uvm_free(managed1, 1 << 16, 1, nullptr);
  uvm_free(untagged, 4096, 1, nullptr);
  CHECK(list(UVM_ANY_DEVICE, nullptr).empty());
}

TEST_CASE("listing refuses what it cannot fill and names the selection by its sentinel", "[registry]") {
  FakeMachine machine;
  size_t count = 0;
  CHECK(uvm_list_allocations(UVM_ANY_DEVICE, nullptr, nullptr, 0, nullptr) == UVM_ERROR_INVALID_ARGUMENT);
  CHECK_THAT(last_error(), Has("uvm_list_allocations(device=any): count is NULL"));
  CHECK(uvm_last_error_index() == -1);  // not a batched call's range
  CHECK(uvm_list_allocations(0, nullptr, nullptr, 2, &count) == UVM_ERROR_INVALID_ARGUMENT);
  CHECK_THAT(last_error(), Has("out is NULL but capacity is 2"));
  CHECK(uvm_list_allocations(9, nullptr, nullptr, 0, &count) == UVM_ERROR_INVALID_ARGUMENT);
  CHECK_THAT(last_error(), Has("uvm_list_allocations(device=9)"));
  uvm_residency residency{};
  CHECK(uvm_get_residency(UVM_ANY_DEVICE, nullptr, nullptr) == UVM_ERROR_INVALID_ARGUMENT);
  CHECK_THAT(last_error(), Has("uvm_get_residency(device=any)"));
  CHECK(uvm_get_residency(UVM_ANY_DEVICE, nullptr, &residency) == UVM_OK);
}

TEST_CASE("a room's part of a record is asked what it keeps, told what was discarded, and let go after the lock",
          "[registry]") {
  FakeMachine machine;
  const size_t size = 1 << 20;
  void* first = uvm_malloc(size, 0, nullptr);
  void* second = uvm_malloc(size, 0, nullptr);
  REQUIRE((first && second));
  const auto a = reinterpret_cast<uintptr_t>(first), b = reinterpret_cast<uintptr_t>(second);
  std::vector<bool> destroyed_unlocked;
  ProbePart* parts[2] = {};
  uvm::registry().with_records([&](uvm::Registry::Records& records) {
    for (int i = 0; i < 2; ++i) {
      auto part = std::make_unique<ProbePart>();
      const uintptr_t base = i == 0 ? a : b;
      part->kept_begin = base + 4096;
      part->kept_end = base + 8192;
      part->destroyed_unlocked = &destroyed_unlocked;
      parts[i] = part.get();
      records.holding(base)->offload = std::move(part);
    }
  });

  // Discarded bytes reach only the parts of the records they touch, clipped by nobody: each part
  // is told the range as given.
  uvm::registry().forget(a + 4096, a + 6000);
  REQUIRE(parts[0]->forgotten.size() == 1);
  CHECK(parts[0]->forgotten[0] == std::make_pair(a + 4096, a + 6000));
  CHECK(parts[1]->forgotten.empty());
  // What a part let go is destroyed once the registry's lock is free (its end may take another
  // room's lock).
  REQUIRE(destroyed_unlocked.size() == 1);
  CHECK(destroyed_unlocked[0]);

  // A block's state says whether the part keeps something of the block's bytes.
  uvm::BlockState state;
  REQUIRE(uvm::registry().block_state(a + 8000, a + 9000, &state));
  CHECK(state.copied);
  REQUIRE(uvm::registry().block_state(a + 8192, a + 9000, &state));
  CHECK_FALSE(state.copied);
  REQUIRE(uvm::registry().block_state(b, b + 4096, &state));
  CHECK_FALSE(state.copied);

  // The parts go before the frees (uvm_free's own room reads its part as its own kind), let go
  // after the lock as the registry asks.
  std::unique_ptr<uvm::RoomPart> taken[2];
  uvm::registry().with_records([&](uvm::Registry::Records& records) {
    taken[0] = std::move(records.holding(a)->offload);
    taken[1] = std::move(records.holding(b)->offload);
  });
  uvm_free(first, size, 0, nullptr);
  uvm_free(second, size, 0, nullptr);
}
