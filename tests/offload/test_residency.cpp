// Residency queries (offload/moves/residency.cpp): what uvm moved where, by device and tag, with staged
// bytes read from the staging store; the free memory uvm knows is reclaimable; the staged copy.
#include <cstring>
#include <vector>

#include "fixture.hpp"

namespace {
constexpr size_t kMiB = size_t{1} << 20;

unsigned char* allocate(size_t size, int device, unsigned char fill) {
  auto* p = static_cast<unsigned char*>(uvm_malloc(size, device, nullptr));
  REQUIRE(p != nullptr);
  std::memset(p, fill, size);
  return p;
}
}  // namespace

TEST_CASE("residency counts what uvm moved, by device and tag", "[residency][cuda13]") {
  FakeMachine machine;
  REQUIRE(uvm_set_thread_tag("weights") == UVM_OK);
  unsigned char* a = allocate(kMiB, 0, 1);
  unsigned char* c = allocate(kMiB, 1, 3);
  REQUIRE(uvm_set_thread_tag(nullptr) == UVM_OK);
  unsigned char* b = allocate(kMiB, 0, 2);
  const uvm_range staged{a, kMiB}, migrated{b, kMiB / 2}, dropped{c, kMiB};
  REQUIRE(uvm_offload_ranges(&staged, 1, UVM_STRATEGY_STAGED, nullptr) == UVM_OK);
  REQUIRE(uvm_offload_ranges(&migrated, 1, UVM_STRATEGY_MIGRATE, nullptr) == UVM_OK);
  REQUIRE(uvm_discard_ranges(&dropped, 1, nullptr) == UVM_OK);

  const uvm_residency weights0 = residency(0, "weights");
  CHECK(weights0.allocations == 1);
  CHECK(weights0.live_bytes == kMiB);
  CHECK(weights0.host_bytes == kMiB);
  CHECK(weights0.staged_bytes == kMiB);
  CHECK(weights0.device_bytes == 0);
  const uvm_residency device0 = residency(0, nullptr);
  CHECK(device0.allocations == 2);
  CHECK(device0.host_bytes == kMiB + kMiB / 2);
  CHECK(device0.staged_bytes == kMiB);  // migrated bytes are on the host but not staged
  CHECK(device0.device_bytes == kMiB / 2);
  const uvm_residency weights = residency(UVM_ANY_DEVICE, "weights");
  CHECK(weights.allocations == 2);
  CHECK(weights.discarded_bytes == kMiB);
  CHECK(residency(0, "").allocations == 1);  // untagged

  REQUIRE(uvm_onload_ranges(&staged, 1, nullptr) == UVM_OK);
  CHECK(residency(0, "weights").staged_bytes == 0);
  CHECK(residency(0, "weights").device_bytes == kMiB);
  uvm_free(a, kMiB, 0, nullptr);
  uvm_free(b, kMiB, 0, nullptr);
  uvm_free(c, kMiB, 1, nullptr);
  CHECK(residency(UVM_ANY_DEVICE, nullptr).allocations == 0);
}

TEST_CASE("mem_get_info adds the managed bytes uvm moved off the device as reclaimable", "[residency][cuda13]") {
  FakeMachine machine;
  size_t free_bytes = 0, total = 0, reclaimable = 1;
  REQUIRE(uvm_mem_get_info(0, &free_bytes, &total, &reclaimable) == UVM_OK);
  CHECK(reclaimable == 0);
  CHECK(total > 0);
  unsigned char* a = allocate(2 * kMiB, 0, 7);
  const uvm_range first_half{a, kMiB};
  REQUIRE(uvm_offload_ranges(&first_half, 1, UVM_STRATEGY_STAGED, nullptr) == UVM_OK);
  REQUIRE(uvm_mem_get_info(0, nullptr, nullptr, &reclaimable) == UVM_OK);
  CHECK(reclaimable == kMiB);
  REQUIRE(uvm_mem_get_info(1, nullptr, nullptr, &reclaimable) == UVM_OK);
  CHECK(reclaimable == 0);  // another device's
  REQUIRE(uvm_onload_ranges(&first_half, 1, nullptr) == UVM_OK);
  REQUIRE(uvm_mem_get_info(0, nullptr, nullptr, &reclaimable) == UVM_OK);
  CHECK(reclaimable == 0);
  CHECK(uvm_mem_get_info(9, nullptr, nullptr, nullptr) == UVM_ERROR_INVALID_ARGUMENT);
  CHECK_THAT(last_error(), Has("uvm_mem_get_info(device=9)"));
  uvm_free(a, 2 * kMiB, 0, nullptr);
}

TEST_CASE("the staged copy of bytes staged in one piece is readable while they are away", "[residency][cuda13]") {
  FakeMachine machine;
  unsigned char* a = allocate(kMiB, 0, 0);
  for (size_t i = 0; i < kMiB; ++i) a[i] = static_cast<unsigned char>(i * 13 + 1);
  std::vector<unsigned char> expected(a, a + kMiB);
  const void* host = a;
  CHECK(uvm_get_staged_copy(a, kMiB, &host) == UVM_OK);
  CHECK(host == nullptr);  // not staged
  const uvm_range whole{a, kMiB};
  REQUIRE(uvm_offload_ranges(&whole, 1, UVM_STRATEGY_STAGED, nullptr) == UVM_OK);
  REQUIRE(uvm_get_staged_copy(a, kMiB, &host) == UVM_OK);
  REQUIRE(host != nullptr);
  CHECK(std::memcmp(host, expected.data(), kMiB) == 0);
  REQUIRE(uvm_get_staged_copy(a + 4096, 100, &host) == UVM_OK);  // a part of one piece
  REQUIRE(host != nullptr);
  CHECK(std::memcmp(host, expected.data() + 4096, 100) == 0);
  const uvm_range back{a, 4096};
  REQUIRE(uvm_onload_ranges(&back, 1, nullptr) == UVM_OK);
  REQUIRE(uvm_get_staged_copy(a, kMiB, &host) == UVM_OK);
  CHECK(host == nullptr);  // half back on the device: not staged in one piece
  CHECK(uvm_get_staged_copy(a, kMiB, nullptr) == UVM_ERROR_INVALID_ARGUMENT);
  CHECK(uvm_get_staged_copy(a, 0, &host) == UVM_ERROR_INVALID_ARGUMENT);
  REQUIRE(uvm_onload_ranges(&whole, 1, nullptr) == UVM_OK);
  CHECK(std::memcmp(a, expected.data(), kMiB) == 0);
  uvm_free(a, kMiB, 0, nullptr);
}
