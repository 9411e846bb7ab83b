// GPU 0: streaming through the C ABI (uvm_fetch_ranges, uvm_drop_clean_ranges), on managed memory
// (needs CUDA 13 discard) and on releasable memory. Each cycle fetches on a copy stream, a copy on
// the compute stream reads the bytes once `arrived`, and the drop follows on the compute stream: the
// read must see every byte, the drop must never overtake it, and the bytes beside the streamed ones
// (written between cycles) must keep what was written. Sizes stay far under the managed budget.
#include <algorithm>
#include <vector>

#include "gpu_support.hpp"

using gpu::MiB;

namespace {

std::vector<unsigned char> pattern(size_t bytes, unsigned seed) {
  std::vector<unsigned char> host(bytes);
  for (size_t i = 0; i < bytes; ++i) host[i] = static_cast<unsigned char>((i * 167 + seed) >> 2);
  return host;
}

// 20 cycles over the first `streamed` bytes of `base` (of `size`), with the rest rewritten each cycle.
void stream_cycles(unsigned char* base, size_t size, size_t streamed) {
  const std::vector<unsigned char> weights = pattern(streamed, 11);
  CUDA_REQUIRE(cudaMemcpy(base, weights.data(), streamed, cudaMemcpyDefault));
  cudaStream_t copy_stream, compute;
  CUDA_REQUIRE(cudaStreamCreateWithFlags(&copy_stream, cudaStreamNonBlocking));
  CUDA_REQUIRE(cudaStreamCreateWithFlags(&compute, cudaStreamNonBlocking));
  cudaEvent_t arrived;
  CUDA_REQUIRE(cudaEventCreateWithFlags(&arrived, cudaEventDisableTiming));
  unsigned char* reads = nullptr;  // what each cycle's "layer" read, one slot a cycle
  constexpr int kCycles = 20;
  CUDA_REQUIRE(cudaMalloc(reinterpret_cast<void**>(&reads), streamed * kCycles));
  const uvm_range range{base, streamed};
  REQUIRE(uvm_offload_ranges(&range, 1, UVM_STRATEGY_STAGED, compute) == UVM_OK);
  for (int cycle = 0; cycle < kCycles; ++cycle) {
    INFO("cycle " << cycle << ": " << uvm_last_error());
    REQUIRE(uvm_fetch_ranges(&range, 1, copy_stream, arrived) == UVM_OK);
    CUDA_REQUIRE(cudaStreamWaitEvent(compute, arrived, 0));
    CUDA_REQUIRE(cudaMemcpyAsync(reads + cycle * streamed, base, streamed, cudaMemcpyDeviceToDevice, compute));
    REQUIRE(uvm_drop_clean_ranges(&range, 1, compute) == UVM_OK);
    // The neighbours: written by the program while the streamed bytes are away.
    CUDA_REQUIRE(cudaMemsetAsync(base + streamed, cycle + 1, size - streamed, compute));
  }
  CUDA_REQUIRE(cudaStreamSynchronize(compute));
  std::vector<unsigned char> got(streamed);
  for (int cycle = 0; cycle < kCycles; ++cycle) {
    CUDA_REQUIRE(cudaMemcpy(got.data(), reads + cycle * streamed, streamed, cudaMemcpyDefault));
    INFO("cycle " << cycle);
    CHECK(got == weights);
  }
  std::vector<unsigned char> rest(size - streamed);
  CUDA_REQUIRE(cudaMemcpy(rest.data(), base + streamed, rest.size(), cudaMemcpyDefault));
  CHECK(std::all_of(rest.begin(), rest.end(), [](unsigned char c) { return c == kCycles; }));
  uvm_residency r{};
  REQUIRE(uvm_get_residency(0, nullptr, &r) == UVM_OK);
  CHECK(r.staged_bytes == streamed);  // dropped: the clean copy is the staged one again
  REQUIRE(uvm_fetch_ranges(&range, 1, compute, nullptr) == UVM_OK);
  CUDA_REQUIRE(cudaStreamSynchronize(compute));
  CUDA_REQUIRE(cudaMemcpy(got.data(), base, streamed, cudaMemcpyDefault));
  CHECK(got == weights);
  CHECK(cudaPeekAtLastError() == cudaSuccess);
  CUDA_REQUIRE(cudaFree(reads));
  CUDA_REQUIRE(cudaEventDestroy(arrived));
  CUDA_REQUIRE(cudaStreamDestroy(copy_stream));
  CUDA_REQUIRE(cudaStreamDestroy(compute));
}

}  // namespace

TEST_CASE("managed bytes stream: fetched, read, dropped clean 20 times; neighbours keep their writes",
          "[gpu][stream]") {
  uvm_device_caps caps{};
  REQUIRE(uvm_device_capabilities(0, &caps) == UVM_OK);
  if (!caps.discard_supported) {
    WARN("not run: dropping managed bytes discards them, which needs a CUDA 13 runtime and driver");
    return;
  }
  gpu::Managed m(48 * MiB);
  stream_cycles(m.ptr, m.size, 40 * MiB);
}

TEST_CASE("a releasable allocation streams, and its memory goes back to the driver at each drop", "[gpu][stream]") {
  const size_t size = 64 * MiB;
  auto* base = static_cast<unsigned char*>(uvm_malloc_releasable(size, 0, nullptr));
  INFO(uvm_last_error());
  REQUIRE(base != nullptr);
  stream_cycles(base, size, size / 2);  // half streamed: the allocation keeps its memory
  const uvm_range whole{base, size};
  REQUIRE(uvm_offload_ranges(&whole, 1, UVM_STRATEGY_STAGED, nullptr) == UVM_OK);
  REQUIRE(uvm_fetch_ranges(&whole, 1, nullptr, nullptr) == UVM_OK);
  CUDA_REQUIRE(cudaDeviceSynchronize());
  size_t before = 0, after = 0, total = 0;
  CUDA_REQUIRE(cudaMemGetInfo(&before, &total));
  REQUIRE(uvm_drop_clean_ranges(&whole, 1, nullptr) == UVM_OK);
  CUDA_REQUIRE(cudaMemGetInfo(&after, &total));
  CHECK(after >= before + size);  // given back, not cached
  uvm_residency r{};
  REQUIRE(uvm_get_residency(0, nullptr, &r) == UVM_OK);
  CHECK(r.released_bytes >= size);
  uvm_free(base, size, 0, nullptr);
}

TEST_CASE("with a spare limit, two releasable layers stream through the same physical memory; it goes back at 0",
          "[gpu][stream][spare]") {
  // Two 32 MiB "layers" in turn: each drop keeps its memory and the other's fetch maps it, so the
  // GPU holds one layer's memory plus one spare, and the bytes read are always the layer's own.
  const size_t size = 32 * MiB;
  unsigned char* layers[2];
  std::vector<unsigned char> weights[2] = {pattern(size, 3), pattern(size, 9)};
  for (int l = 0; l < 2; ++l) {
    layers[l] = static_cast<unsigned char*>(uvm_malloc_releasable(size, 0, nullptr));
    INFO(uvm_last_error());
    REQUIRE(layers[l] != nullptr);
    CUDA_REQUIRE(cudaMemcpy(layers[l], weights[l].data(), size, cudaMemcpyDefault));
    const uvm_range range{layers[l], size};
    REQUIRE(uvm_offload_ranges(&range, 1, UVM_STRATEGY_STAGED, nullptr) == UVM_OK);
  }
  REQUIRE(uvm_set_spare_limit(0, size) == UVM_OK);
  cudaStream_t copy_stream, compute;
  CUDA_REQUIRE(cudaStreamCreateWithFlags(&copy_stream, cudaStreamNonBlocking));
  CUDA_REQUIRE(cudaStreamCreateWithFlags(&compute, cudaStreamNonBlocking));
  cudaEvent_t arrived;
  CUDA_REQUIRE(cudaEventCreateWithFlags(&arrived, cudaEventDisableTiming));
  unsigned char* reads = nullptr;
  constexpr int kSteps = 12;
  CUDA_REQUIRE(cudaMalloc(reinterpret_cast<void**>(&reads), size * kSteps));
  for (int step = 0; step < kSteps; ++step) {
    INFO("step " << step << ": " << uvm_last_error());
    const uvm_range range{layers[step % 2], size};
    REQUIRE(uvm_fetch_ranges(&range, 1, copy_stream, arrived) == UVM_OK);
    CUDA_REQUIRE(cudaStreamWaitEvent(compute, arrived, 0));
    CUDA_REQUIRE(cudaMemcpyAsync(reads + step * size, layers[step % 2], size, cudaMemcpyDeviceToDevice, compute));
    REQUIRE(uvm_drop_clean_ranges(&range, 1, compute) == UVM_OK);
    uvm_stats stats{};
    REQUIRE(uvm_get_stats(0, &stats) == UVM_OK);
    CHECK(stats.spare_bytes == size);  // kept for the next fetch
  }
  CUDA_REQUIRE(cudaStreamSynchronize(compute));
  std::vector<unsigned char> got(size);
  for (int step = 0; step < kSteps; ++step) {
    CUDA_REQUIRE(cudaMemcpy(got.data(), reads + step * size, size, cudaMemcpyDefault));
    INFO("step " << step);
    CHECK(got == weights[step % 2]);
  }
  size_t before = 0, after = 0, total = 0;
  CUDA_REQUIRE(cudaMemGetInfo(&before, &total));
  REQUIRE(uvm_set_spare_limit(0, 0) == UVM_OK);
  CUDA_REQUIRE(cudaMemGetInfo(&after, &total));
  CHECK(after >= before + size);  // the spare went back to the driver
  uvm_stats stats{};
  REQUIRE(uvm_get_stats(0, &stats) == UVM_OK);
  CHECK(stats.spare_bytes == 0);
  CHECK(cudaPeekAtLastError() == cudaSuccess);
  CUDA_REQUIRE(cudaFree(reads));
  CUDA_REQUIRE(cudaEventDestroy(arrived));
  CUDA_REQUIRE(cudaStreamDestroy(copy_stream));
  CUDA_REQUIRE(cudaStreamDestroy(compute));
  for (unsigned char* layer : layers) uvm_free(layer, size, 0, nullptr);
}
