// How fast fresh device memory can be had (cuMemCreate + cuMemMap + cuMemSetAccess), by how many
// host threads ask for it at once, alone and beside host-to-device copies: what a resume of
// releasable memory pays before its copies can land. One process per GPU; run one per GPU at once
// to see the node (scripts/device_run.sh MAP_PROBE=1 does both).
//
// Each round maps PIECES pieces of MiB megabytes with T threads (thread t takes pieces t, t + T, ...),
// timed on the host, then unmaps and releases them: alone; the maps beside pinned copies of the same
// bytes to the device (into a buffer allocated once), as a resume maps; the releases beside copies
// to the host, as a pause gives memory back. The copies' GB/s are printed beside their GB/s alone.
//
//   nvcc -O2 -std=c++17 -o map_threads_probe bench/probes/map_threads_probe.cu -lcuda
//   ./map_threads_probe [device=0] [pieces=64] [MiB=128] [rounds=3]
#include <cuda.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <thread>
#include <vector>

#define CHECK_RT(x) do { cudaError_t e = (x); if (e) { std::printf("%s: %s\n", #x, cudaGetErrorName(e)); std::exit(1); } } while (0)
#define CHECK_DRV(x) do { CUresult r = (x); if (r) { const char* n; cuGetErrorName(r, &n); std::printf("%s: %s\n", #x, n); std::exit(1); } } while (0)

namespace {

using Clock = std::chrono::steady_clock;

double ms_since(Clock::time_point start) {
  return std::chrono::duration<double, std::milli>(Clock::now() - start).count();
}

struct Piece {
  CUdeviceptr va = 0;
  CUmemGenericAllocationHandle handle = 0;
};

// Maps every piece with `threads` threads; returns the wall time in ms.
double map_all(std::vector<Piece>& pieces, size_t bytes, int device, int threads) {
  CUmemAllocationProp prop{};
  prop.type = CU_MEM_ALLOCATION_TYPE_PINNED;
  prop.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
  prop.location.id = device;
  CUmemAccessDesc access{};
  access.location = prop.location;
  access.flags = CU_MEM_ACCESS_FLAGS_PROT_READWRITE;
  CUcontext context = nullptr;
  CHECK_DRV(cuCtxGetCurrent(&context));
  const Clock::time_point start = Clock::now();
  std::vector<std::thread> workers;
  for (int t = 0; t < threads; ++t) {
    workers.emplace_back([&, t] {
      CHECK_DRV(cuCtxSetCurrent(context));
      for (size_t i = t; i < pieces.size(); i += threads) {
        CHECK_DRV(cuMemCreate(&pieces[i].handle, bytes, &prop, 0));
        CHECK_DRV(cuMemMap(pieces[i].va, bytes, 0, pieces[i].handle, 0));
        CHECK_DRV(cuMemSetAccess(pieces[i].va, bytes, &access, 1));
      }
    });
  }
  for (std::thread& w : workers) w.join();
  return ms_since(start);
}

double unmap_all(std::vector<Piece>& pieces, size_t bytes) {
  const Clock::time_point start = Clock::now();
  for (Piece& p : pieces) {
    CHECK_DRV(cuMemUnmap(p.va, bytes));
    CHECK_DRV(cuMemRelease(p.handle));
  }
  return ms_since(start);
}

}  // namespace

int main(int argc, char** argv) {
  const int device = argc > 1 ? std::atoi(argv[1]) : 0;
  const size_t count = argc > 2 ? std::strtoull(argv[2], nullptr, 10) : 64;
  const size_t bytes = (argc > 3 ? std::strtoull(argv[3], nullptr, 10) : 128) << 20;
  const int rounds = argc > 4 ? std::atoi(argv[4]) : 3;
  CHECK_RT(cudaSetDevice(device));
  CHECK_RT(cudaFree(nullptr));
  cudaDeviceProp props{};
  CHECK_RT(cudaGetDeviceProperties(&props, device));
  std::vector<Piece> pieces(count);
  for (Piece& p : pieces) CHECK_DRV(cuMemAddressReserve(&p.va, bytes, 0, 0, 0));
  // The copies beside: as many bytes as the pieces, pinned host to a buffer allocated once.
  const size_t total = count * bytes;
  void* host = nullptr;
  void* target = nullptr;
  CHECK_RT(cudaHostAlloc(&host, total, cudaHostAllocDefault));
  CHECK_RT(cudaMalloc(&target, total));
  cudaStream_t stream;
  CHECK_RT(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
  cudaEvent_t before, after;
  CHECK_RT(cudaEventCreate(&before));
  CHECK_RT(cudaEventCreate(&after));
  std::printf("%s, device %d: %zu pieces of %zu MiB, %d rounds, medians (ms for all pieces; GB/s of the copies)\n",
              props.name, device, count, bytes >> 20, rounds);
  // Copies of all the bytes one way on `stream`, from `before` to `after`.
  const auto issue_copies = [&](bool to_device) {
    CHECK_RT(cudaEventRecord(before, stream));
    for (size_t at = 0; at < total; at += bytes) {
      char* dev = static_cast<char*>(target) + at;
      char* hst = static_cast<char*>(host) + at;
      CHECK_RT(cudaMemcpyAsync(to_device ? static_cast<void*>(dev) : hst, to_device ? static_cast<void*>(hst) : dev,
                               bytes, to_device ? cudaMemcpyHostToDevice : cudaMemcpyDeviceToHost, stream));
    }
    CHECK_RT(cudaEventRecord(after, stream));
  };
  const auto copies_gbps = [&] {
    CHECK_RT(cudaEventSynchronize(after));
    float ms = 0;
    CHECK_RT(cudaEventElapsedTime(&ms, before, after));
    return total / (ms * 1e6);
  };
  const auto median = [](std::vector<double> v) {
    std::sort(v.begin(), v.end());
    return v[v.size() / 2];
  };
  for (const bool to_device : {true, false}) {
    std::vector<double> gbps;
    for (int r = 0; r < rounds; ++r) {
      issue_copies(to_device);
      gbps.push_back(copies_gbps());
    }
    std::printf("device %d copies %s alone: %.1f GB/s\n", device, to_device ? "to the device" : "to the host  ", median(gbps));
  }
  for (const int threads : {1, 4}) {
    std::vector<double> alone_map, alone_release, beside_map, beside_gbps, release_beside, release_gbps;
    for (int r = 0; r < rounds; ++r) {
      alone_map.push_back(map_all(pieces, bytes, device, threads));
      alone_release.push_back(unmap_all(pieces, bytes));
      issue_copies(true);  // a resume: memory mapped while the copies in run
      beside_map.push_back(map_all(pieces, bytes, device, threads));
      beside_gbps.push_back(copies_gbps());
      issue_copies(false);  // a pause: memory given back while the copies out run
      release_beside.push_back(unmap_all(pieces, bytes));
      release_gbps.push_back(copies_gbps());
    }
    std::printf("device %d threads %d: map alone %.1f ms (%.2f a piece), unmap+release alone %.1f ms; "
                "map beside copies to the device %.1f ms, the copies %.1f GB/s; "
                "unmap+release beside copies to the host %.1f ms, the copies %.1f GB/s\n",
                device, threads, median(alone_map), median(alone_map) / count, median(alone_release), median(beside_map),
                median(beside_gbps), median(release_beside), median(release_gbps));
  }
  for (Piece& p : pieces) CHECK_DRV(cuMemAddressFree(p.va, bytes));
  return 0;
}
