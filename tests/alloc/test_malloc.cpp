// uvm_malloc / uvm_free: registration, advice, failures, and the caller's context.
#include "fixture.hpp"

namespace {

uvm_stats stats_of(int device) {
  uvm_stats stats{};
  REQUIRE(uvm_get_stats(device, &stats) == UVM_OK);
  return stats;
}

}  // namespace

TEST_CASE("size 0 returns NULL and is not an error", "[malloc]") {
  FakeMachine machine;
  CHECK(uvm_malloc(0, 0, nullptr) == nullptr);
  CHECK(uvm_last_status() == UVM_OK);
  CHECK(fake::ops().empty());
  uvm_free(nullptr, 0, 0, nullptr);
  CHECK(uvm_last_status() == UVM_OK);
}

TEST_CASE("an allocation is managed, registered, counted and freed", "[malloc]") {
  FakeMachine machine;
  const uvm_stats before = stats_of(0);
  void* ptr = uvm_malloc(10000, 0, nullptr);
  REQUIRE(ptr != nullptr);
  CHECK(reinterpret_cast<uintptr_t>(ptr) % 256 == 0);
  CHECK(uvm_is_managed(ptr) == 1);
  CHECK(uvm_is_managed(static_cast<char*>(ptr) + 9999) == 1);

  void* base = nullptr;
  size_t size = 0;
  int device = -5;
  CHECK(uvm_allocation_info(static_cast<char*>(ptr) + 100, &base, &size, &device) == UVM_OK);
  CHECK(base == ptr);
  CHECK(size == 10000);
  CHECK(device == 0);
  // One past the end belongs to whatever lies there, never to this allocation.
  base = nullptr;
  (void)uvm_allocation_info(static_cast<char*>(ptr) + 10000, &base, nullptr, nullptr);
  CHECK(base != ptr);
  uvm_clear_last_error();

  uvm_stats during = stats_of(0);
  CHECK(during.live_bytes == before.live_bytes + 10000);
  CHECK(during.live_allocations == before.live_allocations + 1);
  CHECK(during.total_allocations == before.total_allocations + 1);

  uvm_free(ptr, 10000, 0, nullptr);
  CHECK(uvm_last_status() == UVM_OK);
  CHECK(fake::live_allocations() == 0);
  const uvm_stats after = stats_of(0);
  CHECK(after.live_bytes == before.live_bytes);
  CHECK(after.total_frees == before.total_frees + 1);
  CHECK(uvm_allocation_info(ptr, nullptr, nullptr, nullptr) == UVM_ERROR_NOT_MANAGED);
}

TEST_CASE("default advice: preferred location and accessed-by the device", "[malloc][advice]") {
  FakeMachine machine;
  void* ptr = uvm_malloc(8192, 1, nullptr);
  REQUIRE(ptr != nullptr);
  const auto preferred = FakeMachine::ops_named(fake::OpKind::advise_preferred);
  const auto accessed = FakeMachine::ops_named(fake::OpKind::advise_accessed_by);
  REQUIRE(preferred.size() == 1);
  REQUIRE(accessed.size() == 1);
  CHECK(preferred[0].ptr == ptr);
  CHECK(preferred[0].size == 8192);
  CHECK(preferred[0].location == 1);
  CHECK(accessed[0].location == 1);
  int where = 99;
  CHECK(uvm_query_location(ptr, 8192, &where, nullptr) == UVM_OK);
  CHECK(where == 1);
  uvm_free(ptr, 8192, 1, nullptr);
}

TEST_CASE("advice modes host and none", "[malloc][advice]") {
  FakeMachine machine;
  REQUIRE(uvm_set_default_advice(UVM_ADVICE_HOST) == UVM_OK);
  CHECK(uvm_get_default_advice() == UVM_ADVICE_HOST);
  void* host_preferred = uvm_malloc(4096, 0, nullptr);
  REQUIRE(host_preferred != nullptr);
  REQUIRE(FakeMachine::ops_named(fake::OpKind::advise_preferred).size() == 1);
  CHECK(FakeMachine::ops_named(fake::OpKind::advise_preferred)[0].location == UVM_LOCATION_CPU);
  CHECK(FakeMachine::ops_named(fake::OpKind::advise_accessed_by)[0].location == 0);

  REQUIRE(uvm_set_default_advice(UVM_ADVICE_NONE) == UVM_OK);
  void* plain = uvm_malloc(4096, 0, nullptr);
  REQUIRE(plain != nullptr);
  CHECK(FakeMachine::ops_named(fake::OpKind::advise_preferred).size() == 1);  // none added

  CHECK(uvm_set_default_advice(static_cast<uvm_advice_mode>(7)) == UVM_ERROR_INVALID_ARGUMENT);
  CHECK_THAT(last_error(), Has("mode 7"));
  CHECK(uvm_get_default_advice() == UVM_ADVICE_NONE);
  uvm_free(host_preferred, 4096, 0, nullptr);
  uvm_free(plain, 4096, 0, nullptr);
}

TEST_CASE("no advice on a device without concurrent managed access", "[malloc][advice]") {
  FakeMachine machine;
  void* ptr = uvm_malloc(4096, 2, nullptr);
  REQUIRE(ptr != nullptr);
  CHECK(FakeMachine::ops_named(fake::OpKind::advise_preferred).empty());
  uvm_free(ptr, 4096, 2, nullptr);
}

TEST_CASE("bad device ordinals are refused before CUDA is called", "[malloc]") {
  FakeMachine machine;
  for (int device : {-1, -2, 3, 64, 1000}) {
    CAPTURE(device);
    CHECK(uvm_malloc(4096, device, nullptr) == nullptr);
    CHECK(uvm_last_status() == UVM_ERROR_INVALID_ARGUMENT);
    CHECK_THAT(last_error(), Has("device " + std::to_string(device) + " is not a CUDA device"));
  }
  CHECK(fake::ops().empty());
}

TEST_CASE("a failed allocation leaves stats unchanged and nothing pending", "[malloc]") {
  FakeMachine machine;
  const uvm_stats before = stats_of(0);
  fake::fail_next("cudaMallocManaged", cudaErrorMemoryAllocation);
  CHECK(uvm_malloc(1 << 20, 0, nullptr) == nullptr);
  const uvm_stats after = stats_of(0);
  CHECK(after.live_bytes == before.live_bytes);
  CHECK(after.total_allocations == before.total_allocations);
  CHECK(after.peak_bytes == before.peak_bytes);
  CHECK(cudaPeekAtLastError() == cudaSuccess);
}

TEST_CASE("if advice fails the allocation is released", "[malloc][advice]") {
  FakeMachine machine;
  const uvm_stats before = stats_of(0);
  fake::fail_next("cudaMemAdvise", cudaErrorInvalidValue);
  CHECK(uvm_malloc(4096, 0, nullptr) == nullptr);
  CHECK(uvm_last_status() == UVM_ERROR_CUDA);
  CHECK_THAT(last_error(), Has("cudaMemAdvise(SetPreferredLocation, 0) failed: cudaErrorInvalidValue"));
  CHECK(fake::live_allocations() == 0);
  CHECK(stats_of(0).live_bytes == before.live_bytes);
  CHECK(cudaPeekAtLastError() == cudaSuccess);
}

TEST_CASE("uvm_free: NULL, unknown, interior, double and mismatched frees", "[malloc][free]") {
  FakeMachine machine;
  SECTION("NULL is a no-op") {
    uvm_free(nullptr, 123, 0, nullptr);
    CHECK(uvm_last_status() == UVM_OK);
  }
  SECTION("an unknown pointer is reported and never reaches CUDA") {
    int on_stack = 0;
    uvm_free(&on_stack, sizeof on_stack, 0, nullptr);
    CHECK(uvm_last_status() == UVM_ERROR_NOT_MANAGED);
    CHECK_THAT(last_error(), Has("was not allocated by uvm_malloc"));
    CHECK(FakeMachine::ops_named(fake::OpKind::free).empty());
  }
  SECTION("an interior pointer is refused and the allocation survives") {
    void* ptr = uvm_malloc(4096, 0, nullptr);
    uvm_free(static_cast<char*>(ptr) + 64, 4096, 0, nullptr);
    CHECK(uvm_last_status() == UVM_ERROR_INVALID_ARGUMENT);
    CHECK_THAT(last_error(), Has("not its start"));
    CHECK(uvm_is_managed(ptr) == 1);
    uvm_free(ptr, 4096, 0, nullptr);
  }
  SECTION("a double free is reported") {
    void* ptr = uvm_malloc(4096, 0, nullptr);
    uvm_free(ptr, 4096, 0, nullptr);
    CHECK(uvm_last_status() == UVM_OK);
    uvm_free(ptr, 4096, 0, nullptr);
    CHECK(uvm_last_status() == UVM_ERROR_NOT_MANAGED);
    CHECK(FakeMachine::ops_named(fake::OpKind::free).size() == 1);
  }
  SECTION("a size or device mismatch is reported, and the memory is freed") {
    void* ptr = uvm_malloc(4096, 0, nullptr);
    uvm_free(ptr, 100, 1, nullptr);
    CHECK(uvm_last_status() == UVM_ERROR_INVALID_ARGUMENT);
    CHECK_THAT(last_error(), Has("size=4096 device=0"));
    CHECK(fake::live_allocations() == 0);
  }
  SECTION("cudaErrorCudartUnloading at exit is tolerated") {
    void* ptr = uvm_malloc(4096, 0, nullptr);
    fake::fail_next("cudaFree", cudaErrorCudartUnloading);
    uvm_free(ptr, 4096, 0, nullptr);
    CHECK(uvm_last_status() == UVM_OK);
    CHECK(uvm_allocation_info(ptr, nullptr, nullptr, nullptr) == UVM_ERROR_NOT_MANAGED);
    CHECK(cudaPeekAtLastError() == cudaSuccess);
  }
}

TEST_CASE("a managed allocation whose cudaFree fails stays recorded and counted for a second free", "[malloc][free][errors]") {
  // Issue 58 item 5: the record and its counts went first, so the memory was lost to uvm.
  FakeMachine machine;
  const uint64_t frees = stats_of(0).total_frees;
  void* ptr = uvm_malloc(4096, 0, nullptr);
  REQUIRE(ptr != nullptr);
  fake::fail_next("cudaFree", cudaErrorLaunchFailure);
  uvm_free(ptr, 4096, 0, nullptr);
  CHECK(uvm_last_status() == UVM_ERROR_CUDA);
  CHECK_THAT(last_error(), Has("uvm_free(") && Has("cudaFree") && Has("cudaErrorLaunchFailure"));
  CHECK(cudaPeekAtLastError() == cudaSuccess);
  CHECK(uvm_is_managed(ptr) == 1);
  CHECK(stats_of(0).live_bytes == 4096);
  CHECK(stats_of(0).live_allocations == 1);
  CHECK(stats_of(0).total_frees == frees);
  uvm_clear_last_error();
  uvm_free(ptr, 4096, 0, nullptr);
  CHECK(uvm_last_status() == UVM_OK);
  CHECK(fake::live_allocations() == 0);
  CHECK(stats_of(0).live_bytes == 0);
  CHECK(stats_of(0).total_frees == frees + 1);
}

TEST_CASE("allocating on another device restores the caller's context", "[malloc][context]") {
  FakeMachine machine;
  SECTION("from device 0's context") {
    fake::set_thread_context(0);
    void* ptr = uvm_malloc(4096, 1, nullptr);
    REQUIRE(ptr != nullptr);
    CHECK(FakeMachine::ops_named(fake::OpKind::malloc)[0].context_device == 1);
    CHECK(fake::current_context() == 0);
    uvm_free(ptr, 4096, 1, nullptr);
    CHECK(FakeMachine::ops_named(fake::OpKind::free)[0].context_device == 1);
    CHECK(fake::current_context() == 0);
  }
  SECTION("from a thread with no context: none is created on device 0") {
    fake::reset();
    fake::set_thread_context(fake::kNoContext);
    void* ptr = uvm_malloc(4096, 1, nullptr);
    REQUIRE(ptr != nullptr);
    CHECK(fake::current_context() == fake::kNoContext);
    CHECK(fake::context_created(1));
    CHECK_FALSE(fake::context_created(0));
    int selected = -1;
    cudaGetDevice(&selected);
    CHECK(selected == 0);  // the runtime's selected device is untouched
    uvm_free(ptr, 4096, 1, nullptr);
    CHECK(fake::current_context() == fake::kNoContext);
    CHECK_FALSE(fake::context_created(0));
  }
}

TEST_CASE("without driver entry points a device switch that fails names it and allocates nothing",
          "[no_entry_points][scenario]") {
  // Issue 58 item 5: the runtime's switch is the only way to another device there.
  FakeMachine machine;
  REQUIRE(cudaSetDevice(0) == cudaSuccess);
  const size_t before = fake::live_allocations();
  fake::fail_next("cudaSetDevice", cudaErrorLaunchFailure);
  CHECK(uvm_malloc(4096, 1, nullptr) == nullptr);
  CHECK_THAT(last_error(), Has("cudaSetDevice(1)") && Has("cudaErrorLaunchFailure"));
  CHECK(cudaPeekAtLastError() == cudaSuccess);
  CHECK(fake::live_allocations() == before);
  CHECK(stats_of(1).live_bytes == 0);
  int device = -1;
  cudaGetDevice(&device);
  CHECK(device == 0);
  void* ptr = uvm_malloc(4096, 1, nullptr);  // asked again, it switches
  REQUIRE(ptr != nullptr);
  uvm_free(ptr, 4096, 1, nullptr);
}

TEST_CASE("a device whose primary context cannot be had is refused naming the call and its error",
          "[primary_context][scenario]") {
  // Issue 58 item 5: the message gave a CUresult number, and named cuDevicePrimaryCtxRetain when
  // cuDeviceGet had failed. In a process of its own: a device's context is had once.
  FakeMachine machine;
  for (const char* call : {"cuDeviceGet", "cuDevicePrimaryCtxRetain"}) {
    CAPTURE(call);
    fake::fail_next(call, cudaErrorLaunchFailure);
    uvm_clear_last_error();
    CHECK(uvm_malloc(4096, 2, nullptr) == nullptr);
    CHECK_THAT(last_error(), Has(std::string(call) + "(") && Has("CUDA_ERROR_LAUNCH_FAILED"));
    CHECK(uvm_last_status() == UVM_ERROR_CUDA);
    CHECK(cudaPeekAtLastError() == cudaSuccess);
    CHECK(stats_of(2).live_bytes == 0);
  }
  void* ptr = uvm_malloc(4096, 2, nullptr);
  REQUIRE(ptr != nullptr);
  uvm_free(ptr, 4096, 2, nullptr);
}

TEST_CASE("a device whose capabilities cannot be asked is asked again by the next call", "[first_probe][scenario]") {
  // Issue 58 item 5: the probe ran once per process, so one failed query made the device fail every
  // call for the life of the process. In a process of its own: a device's answer, once had, is kept.
  FakeMachine machine;
  const struct {
    int device;
    const char* call;
  } cases[] = {{1, "cudaDeviceGetAttribute"}, {2, "cudaGetDeviceProperties"}};
  for (const auto& c : cases) {
    CAPTURE(c.call, c.device);
    fake::fail_next(c.call, cudaErrorLaunchFailure);
    uvm_device_caps caps{};
    CHECK(uvm_device_capabilities(c.device, &caps) == UVM_ERROR_CUDA);
    CHECK_THAT(last_error(), Has(std::string(c.call) + "(device " + std::to_string(c.device) + ")") &&
                                 Has("cudaErrorLaunchFailure"));
    CHECK(cudaPeekAtLastError() == cudaSuccess);
    CHECK_FALSE(fake::injection_left(c.call));
    REQUIRE(uvm_device_capabilities(c.device, &caps) == UVM_OK);
    CHECK(caps.managed_memory == 1);
    CHECK(caps.concurrent_managed_access == (c.device != 2));
    CHECK(caps.total_memory == (c.device == 1 ? size_t{512} << 20 : size_t{256} << 20));
    // Known now: the next failure of the query is not asked for.
    fake::fail_next(c.call, cudaErrorLaunchFailure);
    CHECK(uvm_device_capabilities(c.device, &caps) == UVM_OK);
    CHECK(fake::injection_left(c.call));
    fake::clear_injections();
  }
}

TEST_CASE("without driver entry points the runtime device switch is restored", "[no_entry_points][scenario]") {
  FakeMachine machine;
  REQUIRE(cudaSetDevice(0) == cudaSuccess);
  void* ptr = uvm_malloc(4096, 1, nullptr);
  REQUIRE(ptr != nullptr);
  CHECK(FakeMachine::ops_named(fake::OpKind::malloc)[0].context_device == 1);
  int device = -1;
  cudaGetDevice(&device);
  CHECK(device == 0);
  uvm_free(ptr, 4096, 1, nullptr);
  cudaGetDevice(&device);
  CHECK(device == 0);
}

TEST_CASE("no driver: allocation fails with a clear message", "[no_driver][scenario]") {
  FakeMachine machine;
  CHECK(uvm_device_count() == 0);
  CHECK(uvm_last_status() == UVM_ERROR_NO_DEVICE);
  uvm_clear_last_error();
  CHECK(uvm_malloc(4096, 0, nullptr) == nullptr);
  CHECK(uvm_last_status() == UVM_ERROR_NO_DEVICE);
  CHECK_THAT(last_error(), Has("cudaGetDeviceCount failed: cudaErrorInsufficientDriver"));
  CHECK_THAT(last_error(), Has("no usable CUDA device or driver"));
  uvm_stats stats{};
  CHECK(uvm_get_stats(0, &stats) == UVM_ERROR_NO_DEVICE);
  uvm_device_caps caps{};
  CHECK(uvm_device_capabilities(0, &caps) == UVM_ERROR_NO_DEVICE);
  CHECK(cudaPeekAtLastError() == cudaSuccess);
}

TEST_CASE("uvm_device_synchronize waits in the device's own context and says why it could not", "[malloc][devices]") {
  FakeMachine machine;
  fake::set_thread_context(fake::kNoContext);
  REQUIRE(uvm_device_synchronize(1) == UVM_OK);
  const auto syncs = FakeMachine::ops_named(fake::OpKind::device_sync);
  REQUIRE(syncs.size() == 1);
  CHECK(syncs[0].context_device == 1);
  CHECK(fake::current_context() == fake::kNoContext);  // the caller's (none) is restored
  CHECK(uvm_device_synchronize(7) == UVM_ERROR_INVALID_ARGUMENT);
  CHECK_THAT(last_error(), Has("uvm_device_synchronize(device=7)"));
  fake::fail_next("cudaDeviceSynchronize", cudaErrorLaunchFailure);
  CHECK(uvm_device_synchronize(0) == UVM_ERROR_CUDA);
  CHECK_THAT(last_error(), Has("cudaErrorLaunchFailure"));
  CHECK(cudaPeekAtLastError() == cudaSuccess);
}
