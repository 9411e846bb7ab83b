// Two GPUs (run alone, first in its process, by tests/multi_gpu/run.sh, which skips on fewer;
// run directly on one GPU it fails rather than pass having checked nothing): allocation, hints and offload on device 1 from a thread with no context never
// create a context on device 0, and land where they should.
#include <cuda.h>

#include <cstring>
#include <vector>

#include "gpu_support.hpp"

using gpu::MiB;

namespace {

// Whether device `ordinal`'s primary context is active, asked of the driver directly.
bool context_active(int ordinal) {
  using GetState = CUresult (*)(CUdevice, unsigned int*, int*);
  void* fn = gpu::driver_entry_point("cuDevicePrimaryCtxGetState");
  unsigned int flags = 0;
  int active = -1;
  REQUIRE(reinterpret_cast<GetState>(fn)(ordinal, &flags, &active) == CUDA_SUCCESS);
  return active != 0;
}

}  // namespace

TEST_CASE("device 1's memory is handled in device 1's context only", "[multi_gpu]") {
  if (uvm_device_count() < 2) {
    FAIL("needs 2 GPUs and this machine has " << uvm_device_count()
         << ": run it through tests/multi_gpu/run.sh, which skips with the reason");
  }
  REQUIRE_FALSE(context_active(0));  // the premise: nothing touched device 0 yet
  const size_t size = 64 * MiB;
  auto* ptr = static_cast<unsigned char*>(uvm_malloc(size, 1, nullptr));
  INFO(uvm_last_error());
  REQUIRE(ptr != nullptr);
  int device = -1;
  REQUIRE(uvm_allocation_info(ptr, nullptr, nullptr, &device) == UVM_OK);
  CHECK(device == 1);
  std::vector<unsigned char> pattern(size);
  for (size_t i = 0; i < size; ++i) pattern[i] = static_cast<unsigned char>(i * 13 + 1);
  std::memcpy(ptr, pattern.data(), size);  // managed memory: the CPU may write it directly

  const uvm_range r{ptr, size};
  REQUIRE(uvm_prefetch(ptr, size, 1, nullptr) == UVM_OK);
  REQUIRE(uvm_advise_accessed_by(ptr, size, 1) == UVM_OK);
  for (uvm_strategy strategy : {UVM_STRATEGY_MIGRATE, UVM_STRATEGY_STAGED}) {
    REQUIRE(uvm_offload_ranges(&r, 1, strategy, nullptr) == UVM_OK);
    REQUIRE(uvm_onload_ranges(&r, 1, nullptr) == UVM_OK);
  }
  // Every device's allocations in one call: only device 1 holds any, so only its context is used.
  size_t moved = 0;
  REQUIRE(uvm_offload_selection(UVM_ANY_DEVICE, nullptr, 0, UVM_STRATEGY_STAGED, nullptr, &moved) == UVM_OK);
  CHECK(moved == size);
  REQUIRE(uvm_onload_selection(UVM_ANY_DEVICE, nullptr, 0, nullptr, &moved) == UVM_OK);
  CHECK(moved == size);
  uvm_residency residency{};
  REQUIRE(uvm_get_residency(1, nullptr, &residency) == UVM_OK);
  CHECK(residency.device_bytes == size);
  CHECK_FALSE(context_active(0));
  CHECK(context_active(1));

  // The data came back intact: read it on the host after the streams of device 1 finished.
  REQUIRE(uvm_prefetch(ptr, size, UVM_LOCATION_CPU, nullptr) == UVM_OK);
  {
    // A synchronize needs a context: device 1's, the one already in use.
    REQUIRE(cudaSetDevice(1) == cudaSuccess);
    REQUIRE(cudaDeviceSynchronize() == cudaSuccess);
  }
  CHECK(std::memcmp(ptr, pattern.data(), size) == 0);
  uvm_free(ptr, size, 1, nullptr);
  CHECK_FALSE(context_active(0));
}

// Releasable memory on device 1: offload gives its memory back, and onload maps it again and copies
// the staged bytes with uvm's SM kernel (run.sh sets UVM_ONLOAD_COPY=sm, so a kernel that cannot
// run there fails the onload instead of falling back to the copy engine). The kernel is loaded in
// device 1's context; device 0's is never created. A piece of the neighbour, off a 16-byte
// boundary, goes through the copy engine; the neighbour's other bytes stay.
TEST_CASE("device 1's releasable memory is released and copied back in device 1's context only", "[multi_gpu]") {
  if (uvm_device_count() < 2) {
    FAIL("needs 2 GPUs and this machine has " << uvm_device_count()
         << ": run it through tests/multi_gpu/run.sh, which skips with the reason");
  }
  REQUIRE_FALSE(context_active(0));
  const size_t a_size = 32 * MiB + 4096, b_size = 8 * MiB;
  auto* a = static_cast<unsigned char*>(uvm_malloc_releasable(a_size, 1, nullptr));
  auto* b = static_cast<unsigned char*>(uvm_malloc_releasable(b_size, 1, nullptr));
  INFO(uvm_last_error());
  REQUIRE(a != nullptr);
  REQUIRE(b != nullptr);
  REQUIRE(cudaSetDevice(1) == cudaSuccess);  // the copies below need a context: device 1's
  const auto pattern = [](size_t size, unsigned seed) {
    std::vector<unsigned char> host(size);
    for (size_t i = 0; i < size; ++i) host[i] = static_cast<unsigned char>((i * 131 + seed) >> 3);
    return host;
  };
  const auto expect_a = pattern(a_size, 31), expect_b = pattern(b_size, 32);
  REQUIRE(cudaMemcpy(a, expect_a.data(), a_size, cudaMemcpyDefault) == cudaSuccess);
  REQUIRE(cudaMemcpy(b, expect_b.data(), b_size, cudaMemcpyDefault) == cudaSuccess);
  const uvm_range moved[] = {{a, a_size}, {b + 1001, 3 * 4096 + 5}};
  for (int cycle = 0; cycle < 2; ++cycle) {
    INFO("cycle " << cycle << ": " << uvm_last_error());
    REQUIRE(uvm_offload_ranges(moved, 2, UVM_STRATEGY_AUTO, nullptr) == UVM_OK);
    REQUIRE(cudaDeviceSynchronize() == cudaSuccess);
    uvm_residency residency{};
    REQUIRE(uvm_get_residency(1, nullptr, &residency) == UVM_OK);
    CHECK(residency.released_bytes >= a_size);
    void* claim = nullptr;  // the freed memory used by someone else before the onload
    REQUIRE(cudaMalloc(&claim, a_size) == cudaSuccess);
    REQUIRE(cudaMemset(claim, 0xA5, a_size) == cudaSuccess);
    REQUIRE(cudaFree(claim) == cudaSuccess);
    REQUIRE(uvm_onload_ranges(moved, 2, nullptr) == UVM_OK);
    REQUIRE(cudaDeviceSynchronize() == cudaSuccess);
    std::vector<unsigned char> now_a(a_size), now_b(b_size);
    REQUIRE(cudaMemcpy(now_a.data(), a, a_size, cudaMemcpyDefault) == cudaSuccess);
    REQUIRE(cudaMemcpy(now_b.data(), b, b_size, cudaMemcpyDefault) == cudaSuccess);
    CHECK(now_a == expect_a);
    CHECK(now_b == expect_b);
  }
  CHECK(cudaGetLastError() == cudaSuccess);
  uvm_free(a, a_size, 1, nullptr);
  uvm_free(b, b_size, 1, nullptr);
  CHECK_FALSE(context_active(0));
}
