// GPU 0: releasable allocations (uvm_malloc_releasable, CUDA VMM). Offloading all of one gives its
// memory back to the driver: cudaMemGetInfo counts it free at once and a plain cudaMalloc of it
// succeeds; onload maps memory again at the same address and the bytes come back exactly, the
// neighbouring allocation untouched. Sizes stay far below a quarter of the card.
#include <cuda.h>

#include <algorithm>
#include <string>
#include <vector>

#include "gpu_support.hpp"

using gpu::MiB;

namespace {

struct Releasable {
  explicit Releasable(size_t bytes) : size(bytes) {
    ptr = static_cast<unsigned char*>(uvm_malloc_releasable(bytes, 0, nullptr));
    INFO(uvm_last_error());
    REQUIRE(ptr != nullptr);
  }
  ~Releasable() { uvm_free(ptr, size, 0, nullptr); }
  Releasable(const Releasable&) = delete;
  Releasable& operator=(const Releasable&) = delete;
  std::vector<unsigned char> fill(unsigned seed) {
    std::vector<unsigned char> host(size);
    for (size_t i = 0; i < size; ++i) host[i] = static_cast<unsigned char>((i * 131 + seed) >> 3);
    CUDA_REQUIRE(cudaMemcpy(ptr, host.data(), size, cudaMemcpyDefault));
    return host;
  }
  bool holds(const std::vector<unsigned char>& expected) const {
    std::vector<unsigned char> now(size);
    CUDA_REQUIRE(cudaMemcpy(now.data(), ptr, size, cudaMemcpyDefault));
    return now == expected;
  }
  uvm_range whole() const { return uvm_range{ptr, size}; }
  unsigned char* ptr;
  size_t size;
};

size_t free_now() {
  size_t free_bytes = 0, total = 0;
  CUDA_REQUIRE(cudaMemGetInfo(&free_bytes, &total));
  return free_bytes;
}

}  // namespace

TEST_CASE("offloading a releasable allocation frees it for cudaMemGetInfo and cudaMalloc", "[gpu][release]") {
  Releasable before(3 * MiB + 5), a(512 * MiB + 4096), after(7 * MiB);
  const auto expect_before = before.fill(1), expect_a = a.fill(2), expect_after = after.fill(3);
  unsigned char* const address = a.ptr;
  cudaStream_t stream;
  CUDA_REQUIRE(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
  const uvm_range whole = a.whole();
  for (int cycle = 0; cycle < 5; ++cycle) {
    const size_t free_before = free_now();
    INFO("cycle " << cycle << ": " << uvm_last_error());
    REQUIRE(uvm_offload_ranges(&whole, 1, UVM_STRATEGY_AUTO, stream) == UVM_OK);
    const size_t freed = free_now() - free_before;
    CHECK(freed >= a.size / 10 * 9);
    // The freed memory is there for a plain allocation, right now.
    void* claim = nullptr;
    CUDA_REQUIRE(cudaMalloc(&claim, a.size / 10 * 9));
    CUDA_REQUIRE(cudaMemset(claim, 0x5A, a.size / 10 * 9));
    CUDA_REQUIRE(cudaFree(claim));
    CHECK(before.holds(expect_before));
    CHECK(after.holds(expect_after));
    REQUIRE(uvm_onload_ranges(&whole, 1, stream) == UVM_OK);
    CUDA_REQUIRE(cudaStreamSynchronize(stream));
    CHECK(a.ptr == address);
    CHECK(a.holds(expect_a));
  }
  CHECK(cudaGetLastError() == cudaSuccess);
  CUDA_REQUIRE(cudaStreamDestroy(stream));
}

TEST_CASE("after a claim of the freed memory, onload copies every byte back, word-aligned or not",
          "[gpu][release]") {
  // With the SM kernel (UVM_ONLOAD_COPY=auto, the default, takes it here: meson test gpu) a's
  // copies go through it and b's piece, which starts off a 16-byte boundary, through the copy
  // engine; b's other bytes stay.
  Releasable a(64 * MiB + 4096), b(8 * MiB);
  const auto expect_a = a.fill(21), expect_b = b.fill(22);
  cudaStream_t stream;
  CUDA_REQUIRE(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
  const uvm_range moved[] = {a.whole(), uvm_range{b.ptr + 1001, 3 * 4096 + 5}};
  for (int cycle = 0; cycle < 3; ++cycle) {
    INFO("cycle " << cycle << ": " << uvm_last_error());
    REQUIRE(uvm_offload_ranges(moved, 2, UVM_STRATEGY_AUTO, stream) == UVM_OK);
    CUDA_REQUIRE(cudaStreamSynchronize(stream));
    void* claim = nullptr;  // the freed memory used by someone else, as the RL benchmark's claim does
    CUDA_REQUIRE(cudaMalloc(&claim, a.size));
    CUDA_REQUIRE(cudaMemset(claim, 0xA5, a.size));
    CUDA_REQUIRE(cudaFree(claim));
    REQUIRE(uvm_onload_ranges(moved, 2, stream) == UVM_OK);
    CUDA_REQUIRE(cudaStreamSynchronize(stream));
    CHECK(a.holds(expect_a));
    CHECK(b.holds(expect_b));
  }
  CHECK(cudaGetLastError() == cudaSuccess);
  CUDA_REQUIRE(cudaStreamDestroy(stream));
}

TEST_CASE("a discarded releasable allocation is released and comes back writable", "[gpu][release]") {
  Releasable a(64 * MiB);
  a.fill(4);
  const uvm_range whole = a.whole();
  const size_t free_before = free_now();
  REQUIRE(uvm_discard_ranges(&whole, 1, nullptr) == UVM_OK);
  CHECK(free_now() - free_before >= a.size);
  REQUIRE(uvm_onload_ranges(&whole, 1, nullptr) == UVM_OK);
  CUDA_REQUIRE(cudaDeviceSynchronize());
  const auto expect = a.fill(5);
  CHECK(a.holds(expect));
  uvm_residency r{};
  REQUIRE(uvm_get_residency(0, nullptr, &r) == UVM_OK);
  CHECK(r.released_bytes == 0);
}

TEST_CASE("a partly offloaded releasable allocation keeps its memory and its other bytes", "[gpu][release]") {
  Releasable a(32 * MiB);
  const auto expect = a.fill(6);
  const std::vector<uvm_range> parts = {{a.ptr, 4 * MiB}, {a.ptr + 8 * MiB, 512}};
  const size_t free_before = free_now();
  REQUIRE(uvm_offload_ranges(parts.data(), parts.size(), UVM_STRATEGY_AUTO, nullptr) == UVM_OK);
  CUDA_REQUIRE(cudaDeviceSynchronize());
  CHECK(free_now() + 2 * MiB >= free_before);  // nothing released
  std::vector<unsigned char> middle(4 * MiB);
  CUDA_REQUIRE(cudaMemcpy(middle.data(), a.ptr + 4 * MiB, middle.size(), cudaMemcpyDefault));
  CHECK(std::equal(middle.begin(), middle.end(), expect.begin() + 4 * MiB));
  REQUIRE(uvm_onload_ranges(parts.data(), parts.size(), nullptr) == UVM_OK);
  CUDA_REQUIRE(cudaDeviceSynchronize());
  CHECK(a.holds(expect));
}

TEST_CASE("uvm_reserve_staging: the first offload after it allocates no pinned memory", "[gpu][release]") {
  REQUIRE(uvm_release_staging() == UVM_OK);
  Releasable a(300 * MiB);
  const auto expect = a.fill(7);
  REQUIRE(uvm_reserve_staging(a.size) == UVM_OK);
  size_t reserved = 0;
  REQUIRE(uvm_get_staging(&reserved, nullptr) == UVM_OK);
  CHECK(reserved >= a.size);
  const uvm_range whole = a.whole();
  REQUIRE(uvm_offload_ranges(&whole, 1, UVM_STRATEGY_AUTO, nullptr) == UVM_OK);
  size_t after = 0;
  REQUIRE(uvm_get_staging(&after, nullptr) == UVM_OK);
  CHECK(after == reserved);
  REQUIRE(uvm_onload_ranges(&whole, 1, nullptr) == UVM_OK);
  CUDA_REQUIRE(cudaDeviceSynchronize());
  CHECK(a.holds(expect));
}

TEST_CASE("uvm_pause keeps what has a backup, drops the rest and frees both; uvm_resume brings the kept bytes back",
          "[gpu][release][pause]") {
  REQUIRE(uvm_set_thread_tag("gpu-pause") == UVM_OK);
  REQUIRE(uvm_set_thread_backup(UVM_BACKUP_HOST) == UVM_OK);
  Releasable kept(256 * MiB + 4096);
  gpu::Managed kept_managed(64 * MiB);
  REQUIRE(uvm_set_thread_backup(UVM_BACKUP_NONE) == UVM_OK);
  Releasable dropped(128 * MiB);
  REQUIRE(uvm_set_thread_tag(nullptr) == UVM_OK);
  Releasable neighbour(8 * MiB);  // untagged: never paused
  const auto expect_kept = kept.fill(4), expect_neighbour = neighbour.fill(5);
  std::vector<unsigned char> expect_managed(kept_managed.size);
  for (size_t i = 0; i < expect_managed.size(); ++i) expect_managed[i] = static_cast<unsigned char>(i * 7 + 1);
  CUDA_REQUIRE(cudaMemcpy(kept_managed.ptr, expect_managed.data(), kept_managed.size, cudaMemcpyDefault));
  dropped.fill(6);
  for (int cycle = 0; cycle < 3; ++cycle) {
    INFO("cycle " << cycle << ": " << uvm_last_error());
    const size_t free_before = free_now();
    REQUIRE(uvm_pause(0, "gpu-pause") == UVM_OK);
    CHECK(free_now() - free_before >= (kept.size + dropped.size) / 10 * 9);  // both releasable ones given back
    size_t paused = 0;
    REQUIRE(uvm_paused_count(UVM_ANY_DEVICE, "gpu-pause", &paused) == UVM_OK);
    CHECK(paused == 3);
    void* claim = nullptr;  // the freed memory is there for a plain allocation, right now
    CUDA_REQUIRE(cudaMalloc(&claim, kept.size));
    CUDA_REQUIRE(cudaMemset(claim, 0x5A, kept.size));
    CUDA_REQUIRE(cudaFree(claim));
    REQUIRE(uvm_pause(0, "gpu-pause") == UVM_OK);  // paused already: nothing to do
    REQUIRE(uvm_resume(UVM_ANY_DEVICE, "gpu-pause") == UVM_OK);
    CHECK(kept.holds(expect_kept));
    std::vector<unsigned char> now(kept_managed.size);
    CUDA_REQUIRE(cudaMemcpy(now.data(), kept_managed.ptr, kept_managed.size, cudaMemcpyDefault));
    CHECK(now == expect_managed);
    CHECK(neighbour.holds(expect_neighbour));
    dropped.fill(6);  // mapped again and writable
    REQUIRE(uvm_paused_count(0, "gpu-pause", &paused) == UVM_OK);
    CHECK(paused == 0);
  }
  CHECK(cudaGetLastError() == cudaSuccess);
}

TEST_CASE("a tag moves in one call: offload frees its memory, onload brings every byte back, others untouched",
          "[gpu][release][selection]") {
  static const char* const kTag = "gpu-selection";
  REQUIRE(uvm_set_thread_tag(kTag) == UVM_OK);
  Releasable weights(96 * MiB + 512), more(32 * MiB);
  gpu::Managed managed(16 * MiB);
  REQUIRE(uvm_set_thread_tag(nullptr) == UVM_OK);
  Releasable neighbour(8 * MiB);  // untagged
  const auto expect_weights = weights.fill(8), expect_more = more.fill(9), expect_neighbour = neighbour.fill(10);
  std::vector<unsigned char> expect_managed(managed.size);
  for (size_t i = 0; i < expect_managed.size(); ++i) expect_managed[i] = static_cast<unsigned char>(i * 5 + 2);
  CUDA_REQUIRE(cudaMemcpy(managed.ptr, expect_managed.data(), managed.size, cudaMemcpyDefault));
  cudaStream_t stream = nullptr;
  CUDA_REQUIRE(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
  for (int cycle = 0; cycle < 2; ++cycle) {
    INFO("cycle " << cycle << ": " << uvm_last_error());
    const size_t free_before = free_now();
    size_t bytes = 0;
    REQUIRE(uvm_offload_selection(0, &kTag, 1, UVM_STRATEGY_AUTO, stream, &bytes) == UVM_OK);
    CHECK(bytes == weights.size + more.size + managed.size);
    CUDA_REQUIRE(cudaStreamSynchronize(stream));
    CHECK(free_now() - free_before >= (weights.size + more.size) / 10 * 9);  // releasable memory given back
    uvm_move_report report{};
    REQUIRE(uvm_last_move(0, &report) == UVM_OK);
    CHECK(std::string(report.call) == "uvm_offload_selection");
    REQUIRE(uvm_onload_selection(UVM_ANY_DEVICE, &kTag, 1, nullptr, &bytes) == UVM_OK);
    CHECK(bytes == weights.size + more.size + managed.size);
    CUDA_REQUIRE(cudaDeviceSynchronize());
    CHECK(weights.holds(expect_weights));
    CHECK(more.holds(expect_more));
    std::vector<unsigned char> now(managed.size);
    CUDA_REQUIRE(cudaMemcpy(now.data(), managed.ptr, managed.size, cudaMemcpyDefault));
    CHECK(now == expect_managed);
    CHECK(neighbour.holds(expect_neighbour));
  }
  size_t bytes = 0;
  uvm_device_caps caps{};
  REQUIRE(uvm_device_capabilities(0, &caps) == UVM_OK);
  if (caps.discard_supported) {
    REQUIRE(uvm_discard_selection(0, &kTag, 1, stream, &bytes) == UVM_OK);
    CHECK(bytes == weights.size + more.size + managed.size);
  } else {  // a build against CUDA 12 headers: no discard API, refused by name
    CHECK(uvm_discard_selection(0, &kTag, 1, stream, &bytes) == UVM_ERROR_UNSUPPORTED);
    CHECK_THAT(std::string(uvm_last_error()), Has("uvm_discard_selection"));
  }
  CUDA_REQUIRE(cudaStreamSynchronize(stream));
  CHECK(neighbour.holds(expect_neighbour));
  CUDA_REQUIRE(cudaStreamDestroy(stream));
  CHECK(cudaPeekAtLastError() == cudaSuccess);
}

TEST_CASE("releasable memory is GPUDirect RDMA capable where GPU 0 supports it with VMM", "[release][gpu]") {
  // Issue 57 item 9: as torch_memory_saver's, so that a NIC can register a region's tensors.
  using DeviceGet = CUresult (*)(CUdevice*, int);
  using DeviceAttribute = CUresult (*)(int*, CUdevice_attribute, CUdevice);
  using RetainHandle = CUresult (*)(CUmemGenericAllocationHandle*, void*);
  using PropertiesOf = CUresult (*)(CUmemAllocationProp*, CUmemGenericAllocationHandle);
  using Release = CUresult (*)(CUmemGenericAllocationHandle);
  const auto device_get = reinterpret_cast<DeviceGet>(gpu::driver_entry_point("cuDeviceGet"));
  const auto device_attribute = reinterpret_cast<DeviceAttribute>(gpu::driver_entry_point("cuDeviceGetAttribute"));
  const auto retain = reinterpret_cast<RetainHandle>(gpu::driver_entry_point("cuMemRetainAllocationHandle"));
  const auto properties_of = reinterpret_cast<PropertiesOf>(gpu::driver_entry_point("cuMemGetAllocationPropertiesFromHandle"));
  const auto release = reinterpret_cast<Release>(gpu::driver_entry_point("cuMemRelease"));
  CUdevice device = 0;
  REQUIRE(device_get(&device, 0) == CUDA_SUCCESS);
  int supported = -1;
  REQUIRE(device_attribute(&supported, CU_DEVICE_ATTRIBUTE_GPU_DIRECT_RDMA_WITH_CUDA_VMM_SUPPORTED, device) == CUDA_SUCCESS);
  Releasable memory(2 * MiB);
  CUmemGenericAllocationHandle handle = 0;
  REQUIRE(retain(&handle, memory.ptr) == CUDA_SUCCESS);
  CUmemAllocationProp prop{};
  CHECK(properties_of(&prop, handle) == CUDA_SUCCESS);
  CHECK(release(handle) == CUDA_SUCCESS);  // the reference retain took
  INFO("CU_DEVICE_ATTRIBUTE_GPU_DIRECT_RDMA_WITH_CUDA_VMM_SUPPORTED = " << supported);
  CHECK(prop.allocFlags.gpuDirectRDMACapable == (supported != 0 ? 1 : 0));
}
