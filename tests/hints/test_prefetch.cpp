// uvm_prefetch: validation, capture, capability, accounting of what moved, and the context used.
#include "fixture.hpp"

namespace {
constexpr size_t kSize = 1 << 20;

uvm_stats stats_of(int device) {
  uvm_stats stats{};
  REQUIRE(uvm_get_stats(device, &stats) == UVM_OK);
  return stats;
}

struct Allocation {
  explicit Allocation(size_t size = kSize, int device = 0) : size(size), device(device) {
    ptr = static_cast<char*>(uvm_malloc(size, device, nullptr));
    REQUIRE(ptr != nullptr);
  }
  ~Allocation() { uvm_free(ptr, size, device, nullptr); }
  char* ptr;
  size_t size;
  int device;
};
}  // namespace

TEST_CASE("prefetch both ways is issued, located and accounted", "[prefetch]") {
  FakeMachine machine;
  Allocation a;
  cudaStream_t stream = fake::make_stream();
  const uvm_stats before = stats_of(0);

  REQUIRE(uvm_prefetch(a.ptr, kSize, UVM_LOCATION_CPU, stream) == UVM_OK);
  auto prefetches = FakeMachine::ops_named(fake::OpKind::prefetch);
  REQUIRE(prefetches.size() == 1);
  CHECK(prefetches[0].ptr == a.ptr);
  CHECK(prefetches[0].size == kSize);
  CHECK(prefetches[0].location == cudaCpuDeviceId);
  CHECK(prefetches[0].stream == stream);
  int last = 99;
  REQUIRE(uvm_query_location(a.ptr, kSize, nullptr, &last) == UVM_OK);
  CHECK(last == UVM_LOCATION_CPU);
  uvm_stats moved = stats_of(0);
  CHECK(moved.bytes_to_host - before.bytes_to_host == kSize);
  CHECK(moved.host_resident_bytes - before.host_resident_bytes == kSize);
  CHECK(moved.prefetch_calls - before.prefetch_calls == 1);

  REQUIRE(uvm_prefetch(a.ptr, kSize / 2, 0, stream) == UVM_OK);
  moved = stats_of(0);
  CHECK(moved.bytes_to_device - before.bytes_to_device == kSize / 2);
  CHECK(moved.host_resident_bytes - before.host_resident_bytes == kSize / 2);
  REQUIRE(uvm_query_location(a.ptr, kSize / 2, nullptr, &last) == UVM_OK);
  CHECK(last == 0);
  REQUIRE(uvm_query_location(a.ptr, kSize, nullptr, &last) == UVM_OK);
  CHECK(last == UVM_LOCATION_NONE);  // half on each side
}

TEST_CASE("freeing offloaded memory takes it out of host_resident_bytes", "[prefetch][stats]") {
  FakeMachine machine;
  const uvm_stats before = stats_of(1);
  {
    Allocation a(kSize, 1);
    REQUIRE(uvm_prefetch(a.ptr + 4096, 8192, UVM_LOCATION_CPU, nullptr) == UVM_OK);
    CHECK(stats_of(1).host_resident_bytes == before.host_resident_bytes + 8192);
  }
  CHECK(stats_of(1).host_resident_bytes == before.host_resident_bytes);
}

TEST_CASE("prefetch refuses what the driver would only call invalid", "[prefetch]") {
  FakeMachine machine;
  Allocation a;
  std::vector<char> host(4096);
  SECTION("size 0 is a no-op") {
    CHECK(uvm_prefetch(a.ptr, 0, 0, nullptr) == UVM_OK);
    CHECK(uvm_prefetch(nullptr, 0, 0, nullptr) == UVM_OK);
    CHECK(FakeMachine::ops_named(fake::OpKind::prefetch).empty());
  }
  SECTION("NULL") {
    CHECK(uvm_prefetch(nullptr, 16, 0, nullptr) == UVM_ERROR_INVALID_ARGUMENT);
    CHECK_THAT(last_error(), Has("ptr is NULL"));
  }
  SECTION("host memory is not managed") {
    CHECK(uvm_prefetch(host.data(), host.size(), 0, nullptr) == UVM_ERROR_NOT_MANAGED);
    CHECK_THAT(last_error(), Has("uvm_prefetch(ptr="));
    CHECK_THAT(last_error(), Has("size=4096, device=0): not CUDA managed memory"));
  }
  SECTION("a range past its allocation") {
    CHECK(uvm_prefetch(a.ptr + 100, kSize, 0, nullptr) == UVM_ERROR_INVALID_ARGUMENT);
    CHECK_THAT(last_error(), Has("range ends 100 bytes past the end of its uvm allocation"));
  }
  SECTION("a device that does not exist") {
    CHECK(uvm_prefetch(a.ptr, kSize, 3, nullptr) == UVM_ERROR_INVALID_ARGUMENT);
    CHECK_THAT(last_error(), Has("use -1 for the CPU"));
    CHECK(uvm_prefetch(a.ptr, kSize, -2, nullptr) == UVM_ERROR_INVALID_ARGUMENT);
  }
  CHECK(FakeMachine::ops_named(fake::OpKind::prefetch).empty());
  CHECK(cudaPeekAtLastError() == cudaSuccess);
}

TEST_CASE("prefetch without concurrent managed access is unsupported", "[prefetch]") {
  FakeMachine machine;
  Allocation on_device2(kSize, 2);
  CHECK(uvm_prefetch(on_device2.ptr, kSize, 2, nullptr) == UVM_ERROR_UNSUPPORTED);
  CHECK_THAT(last_error(), Has("device 2 lacks concurrentManagedAccess"));
  CHECK(uvm_prefetch(on_device2.ptr, kSize, UVM_LOCATION_CPU, nullptr) == UVM_ERROR_UNSUPPORTED);
  CHECK(FakeMachine::ops_named(fake::OpKind::prefetch).empty());
}

TEST_CASE("prefetch on a capturing stream is refused before the driver sees it", "[prefetch][capture]") {
  FakeMachine machine;
  Allocation a;
  cudaStream_t stream = fake::make_stream();
  fake::set_capturing(stream, true);
  CHECK(uvm_prefetch(a.ptr, kSize, 0, stream) == UVM_ERROR_CAPTURING);
  CHECK_THAT(last_error(), Has("being captured into a CUDA graph"));
  CHECK(FakeMachine::ops_named(fake::OpKind::prefetch).empty());
  CHECK(cudaPeekAtLastError() == cudaSuccess);
  fake::set_capturing(stream, false);
  CHECK(uvm_prefetch(a.ptr, kSize, 0, stream) == UVM_OK);
}

TEST_CASE("a hint from a thread without a context uses the target's, and restores none", "[prefetch][context]") {
  FakeMachine machine;
  Allocation a(kSize, 1);
  fake::set_thread_context(fake::kNoContext);
  REQUIRE(uvm_prefetch(a.ptr, kSize, 1, nullptr) == UVM_OK);
  CHECK(FakeMachine::ops_named(fake::OpKind::prefetch)[0].context_device == 1);
  CHECK(fake::current_context() == fake::kNoContext);

  fake::set_thread_context(0);  // a caller's own context is used as it is
  REQUIRE(uvm_prefetch(a.ptr, kSize, 1, nullptr) == UVM_OK);
  CHECK(FakeMachine::ops_named(fake::OpKind::prefetch)[1].context_device == 0);
  CHECK(fake::current_context() == 0);
}

TEST_CASE("managed memory uvm did not allocate can be prefetched", "[prefetch]") {
  FakeMachine machine;
  void* foreign = nullptr;
  REQUIRE(cudaMallocManaged(&foreign, 4096, cudaMemAttachGlobal) == cudaSuccess);
  CHECK(uvm_is_managed(foreign) == 1);
  const uvm_stats before = stats_of(0);
  CHECK(uvm_prefetch(foreign, 4096, UVM_LOCATION_CPU, nullptr) == UVM_OK);
  CHECK(FakeMachine::ops_named(fake::OpKind::prefetch).size() == 1);
  CHECK(stats_of(0).bytes_to_host == before.bytes_to_host);  // stats cover uvm allocations only
  CHECK(uvm_prefetch(static_cast<char*>(foreign) + 1, 4096, 0, nullptr) == UVM_ERROR_NOT_MANAGED);
  REQUIRE(cudaFree(foreign) == cudaSuccess);
}
