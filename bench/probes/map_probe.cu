// How fast a pinned host-to-device copy runs into device memory by how that memory came to be,
// for streaming (issue 28: a fetch copies at 46-48 GB/s into memory mapped just before it, against
// 55 for a memcpy into a buffer allocated once). Each round copies MiB megabytes; the copy alone is
// timed with events, and the round (with its driver calls) on the host:
//   cudaMalloc once         a buffer allocated once (the pinned memcpy of the benchmarks)
//   vmm mapped once         cuMemCreate + cuMemMap once, then only copies
//   vmm remapped            one physical allocation kept; each round maps it, copies, unmaps
//   vmm created each round  what uvm does today: cuMemCreate, map, copy, unmap, cuMemRelease
//   vmm created, 2 in turn  the same with two allocations, the previous one released after the
//                           next one's copy is issued (a release beside a copy, as streaming does)
//   vmm kept, 2 in turn     two physical allocations kept; the previous one only unmapped beside
//                           the copy into the next
//
//   nvcc -O2 -std=c++17 -o map_probe bench/probes/map_probe.cu -lcuda && ./map_probe [MiB=436] [rounds=20]
#include <cuda.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <vector>

#define CHECK_RT(x) do { cudaError_t e = (x); if (e) { std::printf("%s: %s\n", #x, cudaGetErrorName(e)); std::exit(1); } } while (0)
#define CHECK_DRV(x) do { CUresult r = (x); if (r) { const char* n; cuGetErrorName(r, &n); std::printf("%s: %s\n", #x, n); std::exit(1); } } while (0)

namespace {

size_t bytes;
void* host;
cudaStream_t stream;
cudaEvent_t before, after;
CUmemAllocationProp prop{};
CUmemAccessDesc access{};

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

// Copies host -> `device`, returning the copy's GB/s by events (the stream synchronized after).
double copy_into(CUdeviceptr device) {
  CHECK_RT(cudaEventRecord(before, stream));
  CHECK_RT(cudaMemcpyAsync(reinterpret_cast<void*>(device), host, bytes, cudaMemcpyHostToDevice, stream));
  CHECK_RT(cudaEventRecord(after, stream));
  CHECK_RT(cudaStreamSynchronize(stream));
  float ms = 0;
  CHECK_RT(cudaEventElapsedTime(&ms, before, after));
  return bytes / (ms * 1e-3) / 1e9;
}

CUmemGenericAllocationHandle create() {
  CUmemGenericAllocationHandle handle;
  CHECK_DRV(cuMemCreate(&handle, bytes, &prop, 0));
  return handle;
}

void map(CUdeviceptr va, CUmemGenericAllocationHandle handle) {
  CHECK_DRV(cuMemMap(va, bytes, 0, handle, 0));
  CHECK_DRV(cuMemSetAccess(va, bytes, &access, 1));
}

void report(const char* name, int rounds, const std::function<double()>& round) {
  std::vector<double> copy, wall;
  round();  // warm-up
  for (int i = 0; i < rounds; ++i) {
    const auto start = std::chrono::steady_clock::now();
    copy.push_back(round());
    const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    wall.push_back(bytes / s / 1e9);
  }
  std::printf("| %-24s | %5.1f | %5.1f |\n", name, median(copy), median(wall));
}

}  // namespace

int main(int argc, char** argv) {
  const size_t mib = argc > 1 ? std::strtoull(argv[1], nullptr, 10) : 436;
  const int rounds = argc > 2 ? std::atoi(argv[2]) : 20;
  CHECK_RT(cudaFree(nullptr));
  prop.type = CU_MEM_ALLOCATION_TYPE_PINNED;
  prop.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
  prop.location.id = 0;
  access.location = prop.location;
  access.flags = CU_MEM_ACCESS_FLAGS_PROT_READWRITE;
  size_t granularity = 0;
  CHECK_DRV(cuMemGetAllocationGranularity(&granularity, &prop, CU_MEM_ALLOC_GRANULARITY_MINIMUM));
  bytes = (mib << 20) / granularity * granularity;
  CHECK_RT(cudaHostAlloc(&host, bytes, cudaHostAllocDefault));
  std::memset(host, 7, bytes);
  CHECK_RT(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
  CHECK_RT(cudaEventCreate(&before));
  CHECK_RT(cudaEventCreate(&after));
  cudaDeviceProp device{};
  CHECK_RT(cudaGetDeviceProperties(&device, 0));
  std::printf("%s: %zu MiB a round, %d rounds, median GB/s\n\n", device.name, bytes >> 20, rounds);
  std::printf("| device memory | copy | round |\n|---|---|---|\n");

  void* plain = nullptr;
  CHECK_RT(cudaMalloc(&plain, bytes));
  report("cudaMalloc once", rounds, [&] { return copy_into(reinterpret_cast<CUdeviceptr>(plain)); });
  CHECK_RT(cudaFree(plain));

  CUdeviceptr va[2];
  for (CUdeviceptr& v : va) CHECK_DRV(cuMemAddressReserve(&v, bytes, 0, 0, 0));
  CUmemGenericAllocationHandle kept = create();
  map(va[0], kept);
  report("vmm mapped once", rounds, [&] { return copy_into(va[0]); });
  CHECK_DRV(cuMemUnmap(va[0], bytes));
  report("vmm remapped", rounds, [&] {
    map(va[0], kept);
    const double gbps = copy_into(va[0]);
    CHECK_DRV(cuMemUnmap(va[0], bytes));
    return gbps;
  });
  CHECK_DRV(cuMemRelease(kept));
  report("vmm created each round", rounds, [&] {
    CUmemGenericAllocationHandle handle = create();
    map(va[0], handle);
    const double gbps = copy_into(va[0]);
    CHECK_DRV(cuMemUnmap(va[0], bytes));
    CHECK_DRV(cuMemRelease(handle));
    return gbps;
  });
  int turn = 0;
  CUmemGenericAllocationHandle live[2] = {0, 0};
  report("vmm created, 2 in turn", rounds, [&] {
    const int next = turn ^ 1;
    live[next] = create();
    map(va[next], live[next]);
    CHECK_RT(cudaEventRecord(before, stream));
    CHECK_RT(cudaMemcpyAsync(reinterpret_cast<void*>(va[next]), host, bytes, cudaMemcpyHostToDevice, stream));
    CHECK_RT(cudaEventRecord(after, stream));
    if (live[turn]) {  // the other one goes while this copy runs
      CHECK_DRV(cuMemUnmap(va[turn], bytes));
      CHECK_DRV(cuMemRelease(live[turn]));
      live[turn] = 0;
    }
    CHECK_RT(cudaStreamSynchronize(stream));
    float ms = 0;
    CHECK_RT(cudaEventElapsedTime(&ms, before, after));
    turn = next;
    return bytes / (ms * 1e-3) / 1e9;
  });
  for (int t = 0; t < 2; ++t) {
    if (live[t]) {
      CHECK_DRV(cuMemUnmap(va[t], bytes));
      CHECK_DRV(cuMemRelease(live[t]));
    }
  }
  CUmemGenericAllocationHandle pool[2] = {create(), create()};
  bool mapped[2] = {false, false};
  turn = 0;
  report("vmm kept, 2 in turn", rounds, [&] {
    const int next = turn ^ 1;
    map(va[next], pool[next]);
    mapped[next] = true;
    CHECK_RT(cudaEventRecord(before, stream));
    CHECK_RT(cudaMemcpyAsync(reinterpret_cast<void*>(va[next]), host, bytes, cudaMemcpyHostToDevice, stream));
    CHECK_RT(cudaEventRecord(after, stream));
    if (mapped[turn]) {  // the other one is unmapped while this copy runs; its memory is kept
      CHECK_DRV(cuMemUnmap(va[turn], bytes));
      mapped[turn] = false;
    }
    CHECK_RT(cudaStreamSynchronize(stream));
    float ms = 0;
    CHECK_RT(cudaEventElapsedTime(&ms, before, after));
    turn = next;
    return bytes / (ms * 1e-3) / 1e9;
  });
  return 0;
}
