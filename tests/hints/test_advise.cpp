// uvm_advise_*, uvm_query_location and uvm_device_capabilities.
#include "fixture.hpp"

TEST_CASE("preferred location to a device and to the CPU", "[advise]") {
  FakeMachine machine;
  REQUIRE(uvm_set_default_advice(UVM_ADVICE_NONE) == UVM_OK);
  char* ptr = static_cast<char*>(uvm_malloc(1 << 16, 0, nullptr));
  REQUIRE(ptr != nullptr);
  int preferred = 99, last = 99;
  REQUIRE(uvm_query_location(ptr, 1 << 16, &preferred, &last) == UVM_OK);
  CHECK(preferred == UVM_LOCATION_NONE);
  CHECK(last == UVM_LOCATION_NONE);

  REQUIRE(uvm_advise_preferred_location(ptr, 1 << 16, 1) == UVM_OK);
  REQUIRE(uvm_query_location(ptr, 1 << 16, &preferred, nullptr) == UVM_OK);
  CHECK(preferred == 1);
  REQUIRE(uvm_advise_preferred_location(ptr, 1 << 15, UVM_LOCATION_CPU) == UVM_OK);
  REQUIRE(uvm_query_location(ptr, 1 << 15, &preferred, nullptr) == UVM_OK);
  CHECK(preferred == UVM_LOCATION_CPU);
  REQUIRE(uvm_query_location(ptr, 1 << 16, &preferred, nullptr) == UVM_OK);
  CHECK(preferred == UVM_LOCATION_NONE);

  REQUIRE(uvm_advise_accessed_by(ptr, 1 << 16, 1) == UVM_OK);
  const auto accessed = FakeMachine::ops_named(fake::OpKind::advise_accessed_by);
  REQUIRE(accessed.size() == 1);
  CHECK(accessed[0].location == 1);
  uvm_free(ptr, 1 << 16, 0, nullptr);
}

TEST_CASE("advise refuses bad input with a reason", "[advise]") {
  FakeMachine machine;
  char* ptr = static_cast<char*>(uvm_malloc(4096, 0, nullptr));
  REQUIRE(ptr != nullptr);
  const size_t advice_ops = fake::ops().size();
  std::vector<char> host(128);
  CHECK(uvm_advise_accessed_by(ptr, 4096, UVM_LOCATION_CPU) == UVM_ERROR_INVALID_ARGUMENT);
  CHECK_THAT(last_error(), Has("device -1 is not a CUDA device"));
  CHECK(uvm_advise_preferred_location(host.data(), 128, 0) == UVM_ERROR_NOT_MANAGED);
  CHECK(uvm_advise_preferred_location(ptr, 8192, 0) == UVM_ERROR_INVALID_ARGUMENT);
  CHECK(uvm_advise_preferred_location(ptr, 4096, 5) == UVM_ERROR_INVALID_ARGUMENT);
  CHECK(uvm_advise_preferred_location(ptr, 0, 0) == UVM_OK);
  CHECK(fake::ops().size() == advice_ops);
  char* on_device2 = static_cast<char*>(uvm_malloc(4096, 2, nullptr));
  CHECK(uvm_advise_preferred_location(on_device2, 4096, 2) == UVM_ERROR_UNSUPPORTED);
  CHECK(uvm_advise_accessed_by(ptr, 4096, 2) == UVM_ERROR_UNSUPPORTED);
  CHECK(cudaPeekAtLastError() == cudaSuccess);
  uvm_free(on_device2, 4096, 2, nullptr);
  uvm_free(ptr, 4096, 0, nullptr);
}

TEST_CASE("query_location refuses empty and unmanaged ranges", "[residency]") {
  FakeMachine machine;
  int where = 0;
  CHECK(uvm_query_location(&where, 0, &where, nullptr) == UVM_ERROR_INVALID_ARGUMENT);
  CHECK(uvm_query_location(&where, sizeof where, &where, nullptr) == UVM_ERROR_NOT_MANAGED);
}

TEST_CASE("device capabilities", "[capabilities]") {
  FakeMachine machine;
  CHECK(uvm_device_count() == 3);
  uvm_device_caps caps{};
  REQUIRE(uvm_device_capabilities(0, &caps) == UVM_OK);
  CHECK(caps.managed_memory == 1);
  CHECK(caps.concurrent_managed_access == 1);
  CHECK(caps.pageable_memory_access == 0);
  CHECK(caps.discard_supported == (CUDART_VERSION >= 13000));  // the discard API is CUDA 13's
  CHECK(caps.total_memory == size_t{1} << 30);
  REQUIRE(uvm_device_capabilities(2, &caps) == UVM_OK);
  CHECK(caps.concurrent_managed_access == 0);
  CHECK(caps.discard_supported == 0);
  CHECK(uvm_device_capabilities(3, &caps) == UVM_ERROR_INVALID_ARGUMENT);
  CHECK(uvm_device_capabilities(0, nullptr) == UVM_ERROR_INVALID_ARGUMENT);
}
