// uvm_malloc_releasable and uvm_free of releasable memory against the fake driver: address range,
// physical memory and bookkeeping appear and go together, and every failure leaves nothing behind.
#include <cstring>
#include <string>

#include "fixture.hpp"

namespace {
constexpr size_t kSize = (size_t{1} << 20) + 100;  // not a multiple of the granularity

uvm_stats stats_of(int device) {
  uvm_stats s{};
  REQUIRE(uvm_get_stats(device, &s) == UVM_OK);
  return s;
}

bool no_cuda_error_pending() { return cudaPeekAtLastError() == cudaSuccess; }
}  // namespace

TEST_CASE("a releasable allocation is mapped device memory that uvm tracks like any other", "[releasable]") {
  FakeMachine machine;
  REQUIRE(uvm_set_thread_tag("weights") == UVM_OK);
  auto* p = static_cast<unsigned char*>(uvm_malloc_releasable(kSize, 1, nullptr));
  REQUIRE(uvm_set_thread_tag(nullptr) == UVM_OK);
  REQUIRE(p != nullptr);
  std::memset(p, 7, kSize);  // mapped read-write
  CHECK(fake::mapped_reservations() == 1);
  CHECK(uvm_is_managed(p) == 0);
  void* base = nullptr;
  size_t size = 0;
  int device = -5;
  REQUIRE(uvm_allocation_info(p + 10, &base, &size, &device) == UVM_OK);
  CHECK(base == p);
  CHECK(size == kSize);
  CHECK(device == 1);
  CHECK(stats_of(1).live_bytes == kSize);
  uvm_range found{};
  size_t count = 0;
  REQUIRE(uvm_allocation_ranges(1, "weights", &found, 1, &count) == UVM_OK);
  CHECK(count == 1);
  CHECK(found.ptr == p);

  fake::reset_ops();
  uvm_free(p, kSize, 1, nullptr);
  CHECK(uvm_last_status() == UVM_OK);
  // Like cudaFree, the free waits for the device before the memory goes.
  const auto ops = fake::ops();
  REQUIRE(ops.size() >= 2);
  CHECK(ops[0].call == fake::OpKind::device_sync);
  CHECK(FakeMachine::ops_named(fake::OpKind::vmm_unmap).size() == 1);
  CHECK(fake::live_reservations() == 0);
  CHECK(stats_of(1).live_bytes == 0);
  CHECK(uvm_allocation_info(p, nullptr, nullptr, nullptr) == UVM_ERROR_NOT_MANAGED);
}

TEST_CASE("a releasable allocation the driver cannot back fails cleanly", "[releasable]") {
  FakeMachine machine;
  fake::fail_next("cuMemCreate", cudaErrorMemoryAllocation);
  CHECK(uvm_malloc_releasable(kSize, 0, nullptr) == nullptr);
  CHECK(uvm_last_status() == UVM_ERROR_OUT_OF_MEMORY);
  const std::string message = uvm_last_error();
  CHECK(message.find("uvm_malloc_releasable") != std::string::npos);
  CHECK(message.find("cuMemCreate") != std::string::npos);
  CHECK(message.find("CUDA_ERROR_OUT_OF_MEMORY") != std::string::npos);
  CHECK(fake::live_reservations() == 0);  // the address range went back too
  CHECK(stats_of(0).live_bytes == 0);     // and the limit's reservation
  CHECK(no_cuda_error_pending());

  fake::fail_next("cuMemMap", cudaErrorInvalidValue);
  CHECK(uvm_malloc_releasable(kSize, 0, nullptr) == nullptr);
  CHECK(std::string(uvm_last_error()).find("cuMemMap") != std::string::npos);
  CHECK(fake::live_reservations() == 0);
}

TEST_CASE("releasable allocations obey the device's limit", "[releasable]") {
  FakeMachine machine;
  REQUIRE(uvm_set_limit(0, kSize) == UVM_OK);
  void* p = uvm_malloc_releasable(kSize, 0, nullptr);
  REQUIRE(p != nullptr);
  CHECK(uvm_malloc_releasable(1, 0, nullptr) == nullptr);
  CHECK(uvm_last_status() == UVM_ERROR_LIMIT_EXCEEDED);
  CHECK(fake::live_reservations() == 1);
  uvm_free(p, kSize, 0, nullptr);
}

TEST_CASE("prefetch and advise refuse releasable memory by name", "[releasable]") {
  FakeMachine machine;
  void* p = uvm_malloc_releasable(kSize, 0, nullptr);
  REQUIRE(p != nullptr);
  fake::reset_ops();
  CHECK(uvm_prefetch(p, 4096, UVM_LOCATION_CPU, fake::make_stream()) == UVM_ERROR_NOT_MANAGED);
  CHECK(std::string(uvm_last_error()).find("uvm_malloc_releasable") != std::string::npos);
  const uvm_range range{p, 4096};
  CHECK(uvm_prefetch_ranges(&range, 1, 0, fake::make_stream()) == UVM_ERROR_NOT_MANAGED);
  CHECK(uvm_advise_preferred_location(p, 4096, 0) == UVM_ERROR_NOT_MANAGED);
  CHECK(std::string(uvm_last_error()).find("advise does not apply") != std::string::npos);
  CHECK(fake::ops().empty());
  uvm_free(p, kSize, 0, nullptr);
}

TEST_CASE("without driver entry points releasable allocation is unsupported, by name", "[no_entry_points][scenario]") {
  FakeMachine machine;
  CHECK(uvm_malloc_releasable(kSize, 0, nullptr) == nullptr);
  CHECK(uvm_last_status() == UVM_ERROR_UNSUPPORTED);
  CHECK(std::string(uvm_last_error()).find("cuMemCreate") != std::string::npos);
  CHECK(stats_of(0).live_bytes == 0);
}
