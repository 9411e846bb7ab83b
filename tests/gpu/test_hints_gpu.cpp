// GPU: prefetch both ways (checked with cudaMemRangeGetAttribute), offloaded and discarded memory
// reclaimed by a plain cudaMalloc, and capture refusals that leave the capture intact.
#include <vector>

#include "gpu_support.hpp"

using gpu::GiB;
using gpu::Managed;
using gpu::MiB;

namespace {

// After `bytes` of managed memory left the GPU, a plain cudaMalloc of what cudaMemGetInfo calls
// free plus 90% of those bytes must succeed: the driver takes the pages back although mem_get_info
// still counts them as used.
void check_reclaim(size_t bytes) {
  size_t free_bytes = 0, total = 0;
  CUDA_REQUIRE(cudaMemGetInfo(&free_bytes, &total));
  const size_t request = free_bytes + bytes / 10 * 9;
  void* plain = nullptr;
  const cudaError_t e = cudaMalloc(&plain, request);
  INFO("cudaMalloc(" << (request >> 20) << " MiB) with " << (free_bytes >> 20) << " MiB reported free: "
                     << cudaGetErrorName(e));
  (void)cudaGetLastError();
  CHECK(e == cudaSuccess);
  if (plain) CUDA_REQUIRE(cudaFree(plain));
}

size_t reclaim_size() { return std::min<size_t>(4 * GiB, gpu::managed_budget() / 2); }

}  // namespace

TEST_CASE("prefetch to the CPU and back moves the range and the data survives", "[gpu][prefetch]") {
  REQUIRE(gpu::concurrent_managed_access());
  Managed m(256 * MiB);
  cudaStream_t stream;
  CUDA_REQUIRE(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
  CUDA_REQUIRE(cudaMemsetAsync(m.ptr, 0x3C, m.size, stream));

  REQUIRE(uvm_prefetch(m.ptr, m.size, UVM_LOCATION_CPU, stream) == UVM_OK);
  CUDA_REQUIRE(cudaStreamSynchronize(stream));
  CHECK(gpu::last_prefetch_location(m.ptr, m.size) == cudaCpuDeviceId);
  int last = -99;
  REQUIRE(uvm_query_location(m.ptr, m.size, nullptr, &last) == UVM_OK);
  CHECK(last == UVM_LOCATION_CPU);
  uvm_stats stats{};
  REQUIRE(uvm_get_stats(0, &stats) == UVM_OK);
  CHECK(stats.host_resident_bytes == m.size);

  REQUIRE(uvm_prefetch(m.ptr, m.size, 0, stream) == UVM_OK);
  CUDA_REQUIRE(cudaStreamSynchronize(stream));
  CHECK(gpu::last_prefetch_location(m.ptr, m.size) == 0);
  REQUIRE(uvm_get_stats(0, &stats) == UVM_OK);
  CHECK(stats.host_resident_bytes == 0);
  size_t wrong = 0;
  for (size_t i = 0; i < m.size; i += 4096) wrong += m.ptr[i] != 0x3C;
  CHECK(wrong == 0);
  CUDA_REQUIRE(cudaStreamDestroy(stream));
}

TEST_CASE("prefetch_ranges moves many pieces with one driver call", "[gpu][prefetch]") {
  Managed m(64 * MiB);
  std::vector<uvm_range> pieces;
  for (size_t offset = 0; offset < m.size; offset += 512 * 1024) pieces.push_back({m.ptr + offset, 512 * 1024});
  uvm_stats before{};
  REQUIRE(uvm_get_stats(0, &before) == UVM_OK);
  REQUIRE(uvm_prefetch_ranges(pieces.data(), pieces.size(), UVM_LOCATION_CPU, nullptr) == UVM_OK);
  CUDA_REQUIRE(cudaDeviceSynchronize());
  uvm_stats after{};
  REQUIRE(uvm_get_stats(0, &after) == UVM_OK);
  CHECK(after.prefetch_calls - before.prefetch_calls == 1);
  CHECK(gpu::last_prefetch_location(m.ptr, m.size) == cudaCpuDeviceId);
}

TEST_CASE("offloaded pages are reclaimed by a plain cudaMalloc", "[gpu][reclaim]") {
  Managed m(reclaim_size());
  CUDA_REQUIRE(cudaMemset(m.ptr, 0x7E, m.size));  // resident on the GPU
  CUDA_REQUIRE(cudaDeviceSynchronize());
  REQUIRE(uvm_prefetch(m.ptr, m.size, UVM_LOCATION_CPU, nullptr) == UVM_OK);
  CUDA_REQUIRE(cudaDeviceSynchronize());
  check_reclaim(m.size);
  size_t wrong = 0;
  for (size_t i = 0; i < m.size; i += 1 << 16) wrong += m.ptr[i] != 0x7E;
  CHECK(wrong == 0);  // the data stayed on the host
}

TEST_CASE("discarded pages are reclaimed, and the range is usable again", "[gpu][discard]") {
  uvm_device_caps caps{};
  REQUIRE(uvm_device_capabilities(0, &caps) == UVM_OK);
  if (!caps.discard_supported) {
    Managed m(MiB);
    CHECK(uvm_discard(m.ptr, m.size, nullptr) == UVM_ERROR_UNSUPPORTED);
    WARN("discard is unsupported with this runtime/driver; checked the clean refusal only");
    return;
  }
  Managed m(reclaim_size());
  CUDA_REQUIRE(cudaMemset(m.ptr, 0x11, m.size));
  CUDA_REQUIRE(cudaDeviceSynchronize());
  REQUIRE(uvm_discard(m.ptr, m.size, nullptr) == UVM_OK);  // legacy stream, through uvm's own
  CUDA_REQUIRE(cudaDeviceSynchronize());
  CHECK(cudaPeekAtLastError() == cudaSuccess);
  check_reclaim(m.size);
  cudaStream_t stream;
  CUDA_REQUIRE(cudaStreamCreate(&stream));
  REQUIRE(uvm_prefetch(m.ptr, m.size, 0, stream) == UVM_OK);
  CUDA_REQUIRE(cudaMemsetAsync(m.ptr, 0x22, m.size, stream));
  REQUIRE(uvm_discard(m.ptr + m.size / 2, m.size / 2, stream) == UVM_OK);
  CUDA_REQUIRE(cudaStreamSynchronize(stream));
  size_t wrong = 0;
  for (size_t i = 0; i < m.size / 2; i += 1 << 16) wrong += m.ptr[i] != 0x22;
  CHECK(wrong == 0);
  uvm_stats stats{};
  REQUIRE(uvm_get_stats(0, &stats) == UVM_OK);
  CHECK(stats.bytes_discarded >= m.size + m.size / 2);
  CUDA_REQUIRE(cudaStreamDestroy(stream));
}

TEST_CASE("hints during stream capture are refused and the capture stays valid", "[gpu][capture]") {
  Managed m(8 * MiB);
  cudaStream_t stream;
  CUDA_REQUIRE(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
  const auto mode = GENERATE(cudaStreamCaptureModeGlobal, cudaStreamCaptureModeThreadLocal,
                             cudaStreamCaptureModeRelaxed);
  CAPTURE(static_cast<int>(mode));
  CUDA_REQUIRE(cudaStreamBeginCapture(stream, mode));
  CHECK(uvm_prefetch(m.ptr, m.size, 0, stream) == UVM_ERROR_CAPTURING);
  CHECK_THAT(last_error(), Has("captured"));
  const uvm_range range = {m.ptr, m.size};
  CHECK(uvm_prefetch_ranges(&range, 1, UVM_LOCATION_CPU, stream) == UVM_ERROR_CAPTURING);
  CHECK(uvm_discard(m.ptr, m.size, stream) != UVM_OK);
  CHECK(cudaPeekAtLastError() == cudaSuccess);
  CUDA_REQUIRE(cudaMemsetAsync(m.ptr, 0x42, m.size, stream));
  cudaGraph_t graph = nullptr;
  CUDA_REQUIRE(cudaStreamEndCapture(stream, &graph));  // not invalidated by the refusals
  cudaGraphExec_t exec = nullptr;
  CUDA_REQUIRE(cudaGraphInstantiate(&exec, graph, 0));
  CUDA_REQUIRE(cudaGraphLaunch(exec, stream));
  CUDA_REQUIRE(cudaStreamSynchronize(stream));
  CHECK(m.ptr[0] == 0x42);
  CHECK(m.ptr[m.size - 1] == 0x42);
  CUDA_REQUIRE(cudaGraphExecDestroy(exec));
  CUDA_REQUIRE(cudaGraphDestroy(graph));
  CUDA_REQUIRE(cudaStreamDestroy(stream));
}

TEST_CASE("a hint on the legacy stream while another stream captures globally", "[gpu][capture][api_error_probe]") {
  // A non-blocking stream's capture does not involve the legacy stream, so the prefetch is legal
  // there; a blocking stream's capture would pull the legacy stream in, so uvm must refuse. Either
  // way the capture must survive.
  Managed m(8 * MiB);
  const bool blocking = GENERATE(false, true);
  CAPTURE(blocking);
  cudaStream_t stream;
  CUDA_REQUIRE(cudaStreamCreateWithFlags(&stream, blocking ? cudaStreamDefault : cudaStreamNonBlocking));
  CUDA_REQUIRE(cudaStreamBeginCapture(stream, cudaStreamCaptureModeGlobal));
  const uvm_status status = uvm_prefetch(m.ptr, m.size, 0, nullptr);
  INFO(uvm_last_error());
  CHECK(status == (blocking ? UVM_ERROR_CAPTURING : UVM_OK));
  CHECK(cudaPeekAtLastError() == cudaSuccess);
  CUDA_REQUIRE(cudaMemsetAsync(m.ptr, 0x43, m.size, stream));
  cudaGraph_t graph = nullptr;
  CHECK(cudaStreamEndCapture(stream, &graph) == cudaSuccess);
  (void)cudaGetLastError();
  if (graph) CUDA_REQUIRE(cudaGraphDestroy(graph));
  CUDA_REQUIRE(cudaDeviceSynchronize());
  CUDA_REQUIRE(cudaStreamDestroy(stream));
}
