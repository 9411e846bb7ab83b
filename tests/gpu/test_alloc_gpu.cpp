// GPU: allocation sizes, data written by the GPU read on the CPU, limits, errors and threads.
#include <cuda.h>

#include <thread>
#include <vector>

#include "gpu_support.hpp"
#include "stress.hpp"

using gpu::GiB;
using gpu::Managed;
using gpu::MiB;

TEST_CASE("sizes from 1 byte to 1 GiB are managed, aligned and hold GPU-written data", "[gpu][alloc]") {
  for (size_t size : {size_t{1}, size_t{255}, size_t{4096}, MiB + 3, 64 * MiB, GiB}) {
    CAPTURE(size);
    uvm_stats before{};
    REQUIRE(uvm_get_stats(0, &before) == UVM_OK);
    {
      Managed m(size);
      CHECK(reinterpret_cast<uintptr_t>(m.ptr) % 256 == 0);
      CHECK(uvm_is_managed(m.ptr) == 1);
      cudaPointerAttributes attributes{};
      CUDA_REQUIRE(cudaPointerGetAttributes(&attributes, m.ptr));
      CHECK(attributes.type == cudaMemoryTypeManaged);
      CUDA_REQUIRE(cudaMemset(m.ptr, 0xA5, size));
      CUDA_REQUIRE(cudaDeviceSynchronize());
      size_t wrong = 0;
      for (size_t i = 0; i < size; i += (size > 4096 ? 4093 : 1)) wrong += m.ptr[i] != 0xA5;
      wrong += m.ptr[size - 1] != 0xA5;
      CHECK(wrong == 0);
      uvm_stats during{};
      REQUIRE(uvm_get_stats(0, &during) == UVM_OK);
      CHECK(during.live_bytes - before.live_bytes == size);
    }
    uvm_stats after{};
    REQUIRE(uvm_get_stats(0, &after) == UVM_OK);
    CHECK(after.live_bytes == before.live_bytes);
    CHECK(after.total_frees == before.total_frees + 1);
  }
}

TEST_CASE("a GPU copy between two allocations is read back exactly on the CPU", "[gpu][alloc]") {
  Managed source(32 * MiB), target(32 * MiB);
  for (size_t i = 0; i < source.size; ++i) source.ptr[i] = static_cast<unsigned char>(i * 131 + 7);
  CUDA_REQUIRE(cudaMemcpy(target.ptr, source.ptr, source.size, cudaMemcpyDefault));
  CUDA_REQUIRE(cudaDeviceSynchronize());
  size_t wrong = 0;
  for (size_t i = 0; i < target.size; ++i) wrong += target.ptr[i] != static_cast<unsigned char>(i * 131 + 7);
  CHECK(wrong == 0);
}

TEST_CASE("the default advice is applied on the device", "[gpu][advice]") {
  if (!gpu::concurrent_managed_access()) {
    WARN("GPU 0 lacks concurrentManagedAccess: uvm sets no advice there, nothing to check");
    return;
  }
  Managed m(16 * MiB);
  int preferred = -99;
  CUDA_REQUIRE(cudaMemRangeGetAttribute(&preferred, sizeof preferred,
                                        cudaMemRangeAttributePreferredLocation, m.ptr, m.size));
  CHECK(preferred == 0);
  int located = -99;
  REQUIRE(uvm_query_location(m.ptr, m.size, &located, nullptr) == UVM_OK);
  CHECK(located == 0);
}

TEST_CASE("a small limit refuses the allocation and keeps stats", "[gpu][limits]") {
  REQUIRE(uvm_set_limit(0, 64 * MiB) == UVM_OK);
  uvm_stats before{};
  REQUIRE(uvm_get_stats(0, &before) == UVM_OK);
  REQUIRE(before.live_bytes == 0);
  {
    Managed first(48 * MiB);
    CHECK(uvm_malloc(32 * MiB, 0, nullptr) == nullptr);
    CHECK(uvm_last_status() == UVM_ERROR_LIMIT_EXCEEDED);
    CHECK(cudaPeekAtLastError() == cudaSuccess);
    uvm_stats after{};
    REQUIRE(uvm_get_stats(0, &after) == UVM_OK);
    CHECK(after.live_bytes == 48 * MiB);
    CHECK(after.total_allocations == before.total_allocations + 1);
  }
  REQUIRE(uvm_set_limit(0, 0) == UVM_OK);
  size_t limit = 0;
  REQUIRE(uvm_get_limit(0, &limit) == UVM_OK);
  CHECK(limit == gpu::total_memory());
}

TEST_CASE("failures name the problem and leave no CUDA error pending", "[gpu][errors]") {
  void* plain = nullptr;
  CUDA_REQUIRE(cudaMalloc(&plain, MiB));
  std::vector<char> host(4096);
  CHECK(uvm_prefetch(plain, MiB, 0, nullptr) == UVM_ERROR_NOT_MANAGED);
  CHECK_THAT(last_error(), Has("not CUDA managed memory"));
  CHECK(cudaPeekAtLastError() == cudaSuccess);
  CHECK(uvm_advise_preferred_location(plain, MiB, 0) == UVM_ERROR_NOT_MANAGED);
  CHECK(cudaPeekAtLastError() == cudaSuccess);
  CHECK(uvm_discard(host.data(), host.size(), nullptr) == UVM_ERROR_NOT_MANAGED);
  CHECK(uvm_query_location(host.data(), host.size(), nullptr, nullptr) == UVM_ERROR_NOT_MANAGED);
  CHECK(cudaPeekAtLastError() == cudaSuccess);
  uvm_free(plain, MiB, 0, nullptr);  // not uvm's: reported, never passed to cudaFree
  CHECK(uvm_last_status() == UVM_ERROR_NOT_MANAGED);
  CHECK(uvm_malloc(MiB, uvm_device_count(), nullptr) == nullptr);
  CHECK(uvm_last_status() == UVM_ERROR_INVALID_ARGUMENT);
  CHECK(cudaPeekAtLastError() == cudaSuccess);
  CUDA_REQUIRE(cudaFree(plain));
}

TEST_CASE("a thread with no context gets none left behind by uvm", "[gpu][context]") {
  void* get_current = gpu::driver_entry_point("cuCtxGetCurrent");
  auto ctx_get_current = reinterpret_cast<CUresult (*)(CUcontext*)>(get_current);
  CUcontext before = reinterpret_cast<CUcontext>(1), after = reinterpret_cast<CUcontext>(1);
  void* ptr = nullptr;
  std::thread fresh([&] {
    ctx_get_current(&before);
    ptr = uvm_malloc(MiB, 0, nullptr);
    uvm_free(ptr, MiB, 0, nullptr);
    ctx_get_current(&after);
  });
  fresh.join();
  CHECK(ptr != nullptr);
  CHECK(before == nullptr);
  CHECK(after == nullptr);
}

TEST_CASE("8 threads x 10000 allocations and frees keep exact stats", "[gpu][threads]") {
  check_threaded_alloc_free(8, 10000, 64 * 1024);
  CHECK(cudaPeekAtLastError() == cudaSuccess);
}
