// uvm_discard: streams (including the legacy NULL stream the driver rejects), accounting, support.
#include "fixture.hpp"

namespace {
constexpr size_t kSize = 1 << 20;
}

TEST_CASE("discard on an explicit stream", "[discard][cuda13]") {
  FakeMachine machine;
  char* ptr = static_cast<char*>(uvm_malloc(kSize, 0, nullptr));
  REQUIRE(ptr != nullptr);
  REQUIRE(uvm_prefetch(ptr, kSize, UVM_LOCATION_CPU, nullptr) == UVM_OK);
  uvm_stats before{};
  REQUIRE(uvm_get_stats(0, &before) == UVM_OK);
  cudaStream_t stream = fake::make_stream();

  REQUIRE(uvm_discard(ptr, kSize / 4, stream) == UVM_OK);
  const auto discards = FakeMachine::ops_named(fake::OpKind::discard);
  REQUIRE(discards.size() == 1);
  CHECK(discards[0].ptr == ptr);
  CHECK(discards[0].size == kSize / 4);
  CHECK(discards[0].stream == stream);
  uvm_stats after{};
  REQUIRE(uvm_get_stats(0, &after) == UVM_OK);
  CHECK(after.bytes_discarded - before.bytes_discarded == kSize / 4);
  CHECK(before.host_resident_bytes - after.host_resident_bytes == kSize / 4);
  uvm_free(ptr, kSize, 0, nullptr);
}

TEST_CASE("discard on the legacy stream goes through uvm's ordering stream", "[discard][cuda13]") {
  FakeMachine machine;
  char* ptr = static_cast<char*>(uvm_malloc(kSize, 0, nullptr));
  REQUIRE(ptr != nullptr);
  REQUIRE(uvm_discard(ptr, kSize, nullptr) == UVM_OK);
  REQUIRE(uvm_discard(ptr, kSize, cudaStreamLegacy) == UVM_OK);
  const auto discards = FakeMachine::ops_named(fake::OpKind::discard);
  REQUIRE(discards.size() == 2);
  CHECK(discards[0].stream != nullptr);
  CHECK(discards[0].stream != cudaStreamLegacy);
  CHECK(discards[1].stream == discards[0].stream);  // created once per device, then reused
  CHECK(uvm_discard(ptr, kSize, cudaStreamPerThread) == UVM_OK);
  CHECK(FakeMachine::ops_named(fake::OpKind::discard)[2].stream == cudaStreamPerThread);
  uvm_free(ptr, kSize, 0, nullptr);
}

TEST_CASE("an ordering stream that cannot be made fails the discard, and the next discard makes it",
          "[first_stream][scenario][cuda13]") {
  // Issue 58 item 5. In a process of its own: uvm makes a device's ordering stream once.
  FakeMachine machine;
  char* ptr = static_cast<char*>(uvm_malloc(kSize, 0, nullptr));
  REQUIRE(ptr != nullptr);
  REQUIRE(uvm_prefetch(ptr, kSize, UVM_LOCATION_CPU, nullptr) == UVM_OK);
  const uvm_stats before = [] {
    uvm_stats s{};
    uvm_get_stats(0, &s);
    return s;
  }();
  fake::fail_next("cudaStreamCreateWithFlags", cudaErrorLaunchFailure);
  CHECK(uvm_discard(ptr, kSize, nullptr) == UVM_ERROR_CUDA);
  CHECK_THAT(last_error(), Has("uvm_discard(ptr=") && Has("cudaStreamCreateWithFlags") &&
                               Has("device 0") && Has("cudaErrorLaunchFailure"));
  CHECK(cudaPeekAtLastError() == cudaSuccess);
  CHECK(FakeMachine::ops_named(fake::OpKind::discard).empty());
  uvm_stats after{};
  REQUIRE(uvm_get_stats(0, &after) == UVM_OK);
  CHECK(after.bytes_discarded == before.bytes_discarded);
  CHECK(after.host_resident_bytes == before.host_resident_bytes);

  REQUIRE(uvm_discard(ptr, kSize, nullptr) == UVM_OK);
  const auto discards = FakeMachine::ops_named(fake::OpKind::discard);
  REQUIRE(discards.size() == 1);
  CHECK(discards[0].stream != nullptr);
  CHECK(discards[0].stream != cudaStreamLegacy);
  uvm_free(ptr, kSize, 0, nullptr);
}

TEST_CASE("discard refuses what it cannot do", "[discard][cuda13]") {
  FakeMachine machine;
  char* ptr = static_cast<char*>(uvm_malloc(kSize, 0, nullptr));
  char* on_device2 = static_cast<char*>(uvm_malloc(kSize, 2, nullptr));
  std::vector<char> host(64);
  CHECK(uvm_discard(host.data(), 64, nullptr) == UVM_ERROR_NOT_MANAGED);
  CHECK(uvm_discard(ptr, kSize + 1, nullptr) == UVM_ERROR_INVALID_ARGUMENT);
  CHECK(uvm_discard(on_device2, kSize, nullptr) == UVM_ERROR_UNSUPPORTED);
  cudaStream_t stream = fake::make_stream();
  fake::set_capturing(stream, true);
  CHECK(uvm_discard(ptr, kSize, stream) == UVM_ERROR_CAPTURING);
  fake::fail_next("cudaMemDiscardBatchAsync", cudaErrorInvalidValue);
  CHECK(uvm_discard(ptr, kSize, fake::make_stream()) == UVM_ERROR_CUDA);
  CHECK_THAT(last_error(), Has("uvm_discard(ptr="));
  CHECK_THAT(last_error(), Has("cudaMemDiscardBatchAsync(1 ranges) failed: cudaErrorInvalidValue"));
  CHECK(FakeMachine::ops_named(fake::OpKind::discard).empty());
  CHECK(cudaPeekAtLastError() == cudaSuccess);
  uvm_free(ptr, kSize, 0, nullptr);
  uvm_free(on_device2, kSize, 2, nullptr);
}

TEST_CASE("with a CUDA 12 driver discard is cleanly unsupported", "[cuda12][scenario]") {
  FakeMachine machine;
  uvm_device_caps caps{};
  REQUIRE(uvm_device_capabilities(0, &caps) == UVM_OK);
  CHECK(caps.discard_supported == 0);
  char* ptr = static_cast<char*>(uvm_malloc(kSize, 0, nullptr));
  REQUIRE(ptr != nullptr);
  CHECK(uvm_discard(ptr, kSize, fake::make_stream()) == UVM_ERROR_UNSUPPORTED);
  CHECK_THAT(last_error(), Has("needs a CUDA 13 runtime and driver"));
  CHECK(FakeMachine::ops_named(fake::OpKind::discard).empty());
  CHECK(uvm_prefetch(ptr, kSize, UVM_LOCATION_CPU, nullptr) == UVM_OK);  // the rest still works
  uvm_free(ptr, kSize, 0, nullptr);
}

// The registry records managed bytes a discard dropped (mark_discarded), so that residency reports
// them and a later move knows their pages hold nothing to copy.
TEST_CASE("a discard of managed memory is recorded as discarded bytes, exactly those", "[discard][cuda13]") {
  FakeMachine machine;
  char* ptr = static_cast<char*>(uvm_malloc(kSize, 0, nullptr));
  REQUIRE(ptr != nullptr);
  REQUIRE(uvm_set_allocation_tag(ptr, "discard-count") == UVM_OK);
  uvm_residency before{};
  REQUIRE(uvm_get_residency(0, "discard-count", &before) == UVM_OK);
  CHECK(before.discarded_bytes == 0);
  REQUIRE(uvm_discard(ptr + kSize / 4, kSize / 2, fake::make_stream()) == UVM_OK);
  uvm_residency after{};
  REQUIRE(uvm_get_residency(0, "discard-count", &after) == UVM_OK);
  CHECK(after.discarded_bytes == kSize / 2);
  uvm_free(ptr, kSize, 0, nullptr);
}
