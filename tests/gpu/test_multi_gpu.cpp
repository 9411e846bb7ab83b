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
