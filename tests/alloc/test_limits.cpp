// The per-device limit on live managed bytes and its environment variables.
#include <cstdlib>

#include "../../alloc/limits.hpp"
#include "../../alloc/stats.hpp"
#include "fixture.hpp"

namespace {
constexpr size_t MiB = size_t{1} << 20;

size_t limit_of(int device) {
  size_t limit = 0;
  REQUIRE(uvm_get_limit(device, &limit) == UVM_OK);
  return limit;
}
}  // namespace

TEST_CASE("the default limit is the device's total memory", "[limits]") {
  FakeMachine machine;
  CHECK(limit_of(0) == 1024 * MiB);
  CHECK(limit_of(1) == 512 * MiB);
  uvm_stats stats{};
  REQUIRE(uvm_get_stats(1, &stats) == UVM_OK);
  CHECK(stats.limit_bytes == 512 * MiB);
}

TEST_CASE("allocations past the limit fail and change nothing", "[limits]") {
  FakeMachine machine;
  REQUIRE(uvm_set_limit(0, 64 * MiB) == UVM_OK);
  CHECK(limit_of(0) == 64 * MiB);
  void* first = uvm_malloc(48 * MiB, 0, nullptr);
  REQUIRE(first != nullptr);
  uvm_stats before{};
  REQUIRE(uvm_get_stats(0, &before) == UVM_OK);
  const size_t mallocs_before = FakeMachine::ops_named(fake::OpKind::malloc).size();

  CHECK(uvm_malloc(32 * MiB, 0, nullptr) == nullptr);
  CHECK(uvm_last_status() == UVM_ERROR_LIMIT_EXCEEDED);
  CHECK_THAT(last_error(), Has("would pass the limit of 67108864 bytes on device 0"));
  CHECK(FakeMachine::ops_named(fake::OpKind::malloc).size() == mallocs_before);  // never reached the driver
  uvm_stats after{};
  REQUIRE(uvm_get_stats(0, &after) == UVM_OK);
  CHECK(after.live_bytes == before.live_bytes);
  CHECK(after.total_allocations == before.total_allocations);
  CHECK(after.peak_bytes == before.peak_bytes);

  void* exact_fit = uvm_malloc(16 * MiB, 0, nullptr);  // 48 + 16 = the limit exactly
  CHECK(exact_fit != nullptr);
  uvm_free(exact_fit, 16 * MiB, 0, nullptr);
  uvm_free(first, 48 * MiB, 0, nullptr);
  void* now_fits = uvm_malloc(32 * MiB, 0, nullptr);
  CHECK(now_fits != nullptr);
  uvm_free(now_fits, 32 * MiB, 0, nullptr);
}

TEST_CASE("a huge request never reaches the driver", "[limits]") {
  FakeMachine machine;
  CHECK(uvm_malloc(SIZE_MAX, 0, nullptr) == nullptr);
  CHECK(uvm_last_status() == UVM_ERROR_LIMIT_EXCEEDED);
  CHECK(uvm_malloc(SIZE_MAX - 100, 1, nullptr) == nullptr);
  CHECK(uvm_last_status() == UVM_ERROR_LIMIT_EXCEEDED);
  CHECK(FakeMachine::ops_named(fake::OpKind::malloc).empty());
}

TEST_CASE("limits: below live bytes, unlimited, and back to the default", "[limits]") {
  FakeMachine machine;
  void* ptr = uvm_malloc(8 * MiB, 1, nullptr);
  REQUIRE(ptr != nullptr);
  REQUIRE(uvm_set_limit(1, 4 * MiB) == UVM_OK);  // allowed below what is live
  CHECK(uvm_malloc(4096, 1, nullptr) == nullptr);
  CHECK(uvm_last_status() == UVM_ERROR_LIMIT_EXCEEDED);
  REQUIRE(uvm_set_limit(1, UVM_LIMIT_UNLIMITED) == UVM_OK);
  CHECK(limit_of(1) == UVM_LIMIT_UNLIMITED);
  REQUIRE(uvm_set_limit(1, 0) == UVM_OK);
  CHECK(limit_of(1) == 512 * MiB);
  uvm_free(ptr, 8 * MiB, 1, nullptr);
  CHECK(uvm_set_limit(5, 100) == UVM_ERROR_INVALID_ARGUMENT);
  CHECK(uvm_get_limit(0, nullptr) == UVM_ERROR_INVALID_ARGUMENT);
}

TEST_CASE("an allocation still in flight counts against the limit", "[limits]") {
  // Two allocations racing past the check must not both fit: the check counts reservations that
  // have not reached the driver yet.
  FakeMachine machine;
  REQUIRE(uvm_set_limit(0, MiB) == UVM_OK);
  size_t in_use = 0;
  REQUIRE(uvm::try_reserve(0, 768 << 10, MiB, &in_use));  // another thread's allocation, under way
  CHECK(uvm_malloc(512 << 10, 0, nullptr) == nullptr);
  CHECK(uvm_last_status() == UVM_ERROR_LIMIT_EXCEEDED);
  CHECK_THAT(last_error(), Has("786432 bytes live + 524288 requested"));
  uvm::cancel_reservation(0, 768 << 10);
  void* ptr = uvm_malloc(512 << 10, 0, nullptr);
  CHECK(ptr != nullptr);
  uvm_free(ptr, 512 << 10, 0, nullptr);
}

TEST_CASE("environment: UVM_LIMIT_FRACTION and UVM_DEFAULT_ADVICE", "[env][scenario]") {
  // Run with UVM_LIMIT_FRACTION=0.5 UVM_DEFAULT_ADVICE=host (meson test alloc-env). No FakeMachine:
  // it would choose an advice mode and hide the environment's.
  fake::reset();
  CHECK(limit_of(0) == 512 * MiB);
  CHECK(limit_of(1) == 256 * MiB);
  CHECK(uvm_get_default_advice() == UVM_ADVICE_HOST);  // the variable, not the built-in default
}
