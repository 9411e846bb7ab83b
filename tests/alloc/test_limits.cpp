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

TEST_CASE("limit environment values are parsed strictly", "[limits]") {
  using uvm::parse_limit_env;
  const size_t total = 80 * (size_t{1} << 30);
  size_t limit = 0;
  std::string why;
  CHECK(parse_limit_env(nullptr, nullptr, total, &limit, &why));
  CHECK(limit == total);
  CHECK(parse_limit_env("", "", total, &limit, &why));
  CHECK(limit == total);
  CHECK(parse_limit_env("1048576", nullptr, total, &limit, &why));
  CHECK(limit == MiB);
  CHECK(parse_limit_env("64G", nullptr, total, &limit, &why));
  CHECK(limit == 64 * (size_t{1} << 30));
  CHECK(parse_limit_env("512MiB", nullptr, total, &limit, &why));
  CHECK(limit == 512 * MiB);
  CHECK(parse_limit_env("2k", nullptr, total, &limit, &why));
  CHECK(limit == 2048);
  CHECK(parse_limit_env(nullptr, "0.25", total, &limit, &why));
  CHECK(limit == total / 4);
  CHECK(parse_limit_env(nullptr, "1.5", total, &limit, &why));  // explicit oversubscription
  CHECK(limit == total / 2 * 3);
  // The last two overflow 64 bits only through their suffix; wrapped, they would read 1 GiB and 1 TiB.
  for (const char* bad : {"lots", "-5", "0", "12X", "64GB!", "99999999999999999999999", "17179869185G",
                          "16777217T"}) {
    CAPTURE(bad);
    CHECK_FALSE(parse_limit_env(bad, nullptr, total, &limit, &why));
    CHECK_THAT(why, Has("UVM_LIMIT_BYTES='"));
  }
  for (const char* bad : {"0", "-1", "half", "nan", "inf", "0.5x"}) {
    CAPTURE(bad);
    CHECK_FALSE(parse_limit_env(nullptr, bad, total, &limit, &why));
    CHECK_THAT(why, Has("UVM_LIMIT_FRACTION='"));
  }
  CHECK_FALSE(parse_limit_env("1G", "0.5", total, &limit, &why));
  CHECK_THAT(why, Has("set only one of"));
}

TEST_CASE("a malformed limit variable fails allocation, naming the variable", "[limits]") {
  FakeMachine machine;
  setenv("UVM_LIMIT_BYTES", "lots", 1);
  CHECK(uvm_malloc(4096, 0, nullptr) == nullptr);
  CHECK(uvm_last_status() == UVM_ERROR_INVALID_ARGUMENT);
  CHECK_THAT(last_error(), Has("UVM_LIMIT_BYTES='lots'"));
  REQUIRE(uvm_set_limit(0, 64 * MiB) == UVM_OK);  // an explicit limit overrides the environment
  void* ptr = uvm_malloc(4096, 0, nullptr);
  CHECK(ptr != nullptr);
  uvm_free(ptr, 4096, 0, nullptr);
  unsetenv("UVM_LIMIT_BYTES");
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
