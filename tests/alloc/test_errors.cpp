// Status strings, the thread-local last error, and what failure messages name.
#include <cuda.h>

#include <cstring>
#include <thread>

#include <vector>

#include "fixture.hpp"

TEST_CASE("every status has its own name", "[errors]") {
  CHECK(std::string(uvm_status_string(UVM_OK)) == "UVM_OK");
  CHECK(std::string(uvm_status_string(UVM_ERROR_INVALID_ARGUMENT)) == "UVM_ERROR_INVALID_ARGUMENT");
  CHECK(std::string(uvm_status_string(UVM_ERROR_NOT_MANAGED)) == "UVM_ERROR_NOT_MANAGED");
  CHECK(std::string(uvm_status_string(UVM_ERROR_UNSUPPORTED)) == "UVM_ERROR_UNSUPPORTED");
  CHECK(std::string(uvm_status_string(UVM_ERROR_LIMIT_EXCEEDED)) == "UVM_ERROR_LIMIT_EXCEEDED");
  CHECK(std::string(uvm_status_string(UVM_ERROR_CAPTURING)) == "UVM_ERROR_CAPTURING");
  CHECK(std::string(uvm_status_string(UVM_ERROR_CUDA)) == "UVM_ERROR_CUDA");
  CHECK(std::string(uvm_status_string(UVM_ERROR_OUT_OF_MEMORY)) == "UVM_ERROR_OUT_OF_MEMORY");
  CHECK(std::string(uvm_status_string(UVM_ERROR_NO_DEVICE)) == "UVM_ERROR_NO_DEVICE");
  CHECK(std::string(uvm_status_string(UVM_ERROR_INTERNAL)) == "UVM_ERROR_INTERNAL");
  CHECK(std::string(uvm_status_string(UVM_ERROR_IO)) == "UVM_ERROR_IO");
  CHECK(std::string(uvm_status_string(UVM_ERROR_SHARED)) == "UVM_ERROR_SHARED");
  CHECK(std::string(uvm_status_string(12)) == "UVM_ERROR_UNKNOWN");
  CHECK(std::string(uvm_status_string(-1)) == "UVM_ERROR_UNKNOWN");
}

TEST_CASE("the version string, the header's numbers and meson's project version agree", "[errors]") {
  // Against meson.build's own version, not the macros uvm_version() is built from: a release that
  // bumps one and not the other fails here.
  CHECK(std::string(uvm_version()) == UVM_TEST_PROJECT_VERSION);
  const std::string from_header = std::to_string(UVM_VERSION_MAJOR) + "." + std::to_string(UVM_VERSION_MINOR) +
                                  "." + std::to_string(UVM_VERSION_PATCH);
  CHECK(from_header == UVM_TEST_PROJECT_VERSION);
}

TEST_CASE("the last error is kept errno-style until cleared", "[errors]") {
  FakeMachine machine;
  CHECK(last_error().empty());
  CHECK(uvm_last_status() == UVM_OK);

  CHECK(uvm_malloc(4096, 7, nullptr) == nullptr);
  CHECK(uvm_last_status() == UVM_ERROR_INVALID_ARGUMENT);
  const std::string message = last_error();
  CHECK_THAT(message, Has("uvm_malloc(size=4096, device=7)"));
  CHECK_THAT(message, Has("device 7 is not a CUDA device (there are 3)"));

  void* ptr = uvm_malloc(4096, 0, nullptr);  // a success leaves the failure readable
  REQUIRE(ptr != nullptr);
  CHECK(last_error() == message);
  uvm_free(ptr, 4096, 0, nullptr);

  uvm_clear_last_error();
  CHECK(last_error().empty());
  CHECK(uvm_last_status() == UVM_OK);
}

TEST_CASE("the last error belongs to the thread that failed", "[errors]") {
  FakeMachine machine;
  std::string seen_in_other_thread = "unset";
  void* got = reinterpret_cast<void*>(1);
  std::thread other([&] {  // Catch2 assertions are not thread-safe: checked after the join
    got = uvm_malloc(16, 9, nullptr);
    seen_in_other_thread = last_error();
  });
  other.join();
  CHECK(got == nullptr);
  CHECK_THAT(seen_in_other_thread, Has("device 9"));
  CHECK(last_error().empty());
}

TEST_CASE("a failed CUDA call is named with its error and leaves nothing pending", "[errors]") {
  FakeMachine machine;
  fake::fail_next("cudaMallocManaged", cudaErrorMemoryAllocation);
  CHECK(uvm_malloc(1 << 20, 0, nullptr) == nullptr);
  CHECK(uvm_last_status() == UVM_ERROR_OUT_OF_MEMORY);
  CHECK_THAT(last_error(), Has("uvm_malloc(size=1048576, device=0)"));
  CHECK_THAT(last_error(), Has("cudaMallocManaged failed: cudaErrorMemoryAllocation (out of memory)"));
  CHECK(cudaPeekAtLastError() == cudaSuccess);
}

TEST_CASE("other CUDA errors map to UVM_ERROR_CUDA with the error's name", "[errors]") {
  FakeMachine machine;
  void* ptr = uvm_malloc(4096, 0, nullptr);
  REQUIRE(ptr != nullptr);
  fake::fail_next("cudaMemPrefetchAsync", cudaErrorLaunchFailure);
  CHECK(uvm_prefetch(ptr, 4096, 0, nullptr) == UVM_ERROR_CUDA);
  CHECK_THAT(last_error(), Has("cudaMemPrefetchAsync("));
  CHECK_THAT(last_error(), Has("cudaErrorLaunchFailure"));
  CHECK(cudaPeekAtLastError() == cudaSuccess);
  uvm_free(ptr, 4096, 0, nullptr);
}

TEST_CASE("messages print device sentinels by name and batched calls by count; the failing range's index is kept", "[errors]") {
  FakeMachine machine;
  std::vector<char> host(4096);
  CHECK(uvm_prefetch(host.data(), host.size(), UVM_LOCATION_CPU, nullptr) == UVM_ERROR_NOT_MANAGED);
  CHECK_THAT(last_error(), Has("size=4096, device=cpu)"));
  CHECK(uvm_last_error_index() == -1);
  void* managed = uvm_malloc(1 << 16, 0, nullptr);
  REQUIRE(managed != nullptr);
  const uvm_range ranges[] = {{managed, 4096}, {managed, 4096}, {host.data(), 64}};
  CHECK(uvm_discard_ranges(ranges, 3, nullptr) == UVM_ERROR_NOT_MANAGED);
  CHECK_THAT(last_error(), Has("uvm_discard_ranges(count=3): range 2 of 3 is invalid"));
  CHECK(uvm_last_error_index() == 2);
  uvm_clear_last_error();
  CHECK(uvm_last_error_index() == -1);
  CHECK(uvm_prefetch_ranges(ranges, 3, UVM_LOCATION_CPU, nullptr) == UVM_ERROR_NOT_MANAGED);
  CHECK_THAT(last_error(), Has("uvm_prefetch_ranges(count=3, device=cpu)"));
  CHECK(uvm_last_error_index() == 2);
  CHECK(uvm_malloc(1 << 20, -1, nullptr) == nullptr);  // an ordinal: -1 is no sentinel there
  CHECK_THAT(last_error(), Has("uvm_malloc(size=1048576, device=-1)"));
  CHECK(uvm_last_error_index() == -1);  // a later failure not tied to a range resets it
  uvm_free(managed, 1 << 16, 0, nullptr);
}

TEST_CASE("the CUDA error behind a failure is kept for callers that answer in CUDA's terms", "[errors]") {
  FakeMachine machine;
  CHECK(uvm_last_cuda_error() == 0);
  fake::fail_next("cudaMallocManaged", cudaErrorLaunchFailure);  // a runtime call's error
  CHECK(uvm_malloc(1 << 20, 0, nullptr) == nullptr);
  CHECK(uvm_last_status() == UVM_ERROR_CUDA);
  CHECK(uvm_last_cuda_error() == cudaErrorLaunchFailure);
  fake::fail_next("cuMemCreate", cudaErrorInvalidValue);  // the double answers CUDA_ERROR_INVALID_VALUE
  CHECK(uvm_malloc_releasable(1 << 21, 0, nullptr) == nullptr);
  CHECK(uvm_last_cuda_error() == CUDA_ERROR_INVALID_VALUE);
  CHECK(uvm_malloc(4096, 7, nullptr) == nullptr);  // uvm's own refusal: no CUDA error behind it
  CHECK(uvm_last_status() == UVM_ERROR_INVALID_ARGUMENT);
  CHECK(uvm_last_cuda_error() == 0);
  fake::fail_next("cudaMallocManaged", cudaErrorLaunchFailure);
  CHECK(uvm_malloc(1 << 20, 0, nullptr) == nullptr);
  uvm_clear_last_error();
  CHECK(uvm_last_cuda_error() == 0);
}
