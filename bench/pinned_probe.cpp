// How fast can pinned host memory be had? Times, side by side in one run, the ways to get N GiB of
// page-locked memory a GPU copies into at full speed, and the copy speed into each:
//   cudaHostAlloc, cudaMallocHost, and mmap + fault-in (1 or T threads, 4 KiB or transparent huge
//   pages) + cudaHostRegister; then how long each takes to give back.
// Plain C++ against cudart, no kernel (arguments: GiB, threads):
//   g++ -O2 -std=c++17 bench/pinned_probe.cpp -I$CUDA_HOME/include -L$CUDA_HOME/lib64 -lcudart
//       -lpthread -o pinned_probe && ./pinned_probe 4 8
#include <cuda_runtime_api.h>
#include <sys/mman.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <thread>
#include <vector>

namespace {

double now() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

void check(cudaError_t e, const char* what) {
  if (e != cudaSuccess) {
    std::fprintf(stderr, "%s: %s\n", what, cudaGetErrorName(e));
    std::exit(1);
  }
}

// Touches one byte per 4 KiB page of [p, p + bytes) on `threads` threads.
void fault_in(char* p, size_t bytes, int threads) {
  std::vector<std::thread> workers;
  const size_t share = (bytes / threads + 4095) / 4096 * 4096;
  for (int t = 0; t < threads; ++t) {
    workers.emplace_back([=] {
      const size_t begin = t * share, end = std::min(bytes, begin + share);
      for (size_t i = begin; i < end; i += 4096) p[i] = 0;
    });
  }
  for (auto& w : workers) w.join();
}

struct Result {
  std::string name;
  double get_s = 0, free_s = 0, d2h_gbps = 0, h2d_gbps = 0;
  bool ok = true;
};

double copy_gbps(void* dst, const void* src, size_t bytes, cudaMemcpyKind kind, cudaStream_t stream) {
  check(cudaMemcpyAsync(dst, src, bytes, kind, stream), "warm-up copy");
  check(cudaStreamSynchronize(stream), "sync");
  const double t = now();
  check(cudaMemcpyAsync(dst, src, bytes, kind, stream), "copy");
  check(cudaStreamSynchronize(stream), "sync");
  return bytes / (now() - t) / 1e9;
}

template <typename Get, typename Give>
Result measure(const std::string& name, size_t bytes, void* device, cudaStream_t stream, Get get, Give give) {
  Result r;
  r.name = name;
  double t = now();
  void* host = get();
  r.get_s = now() - t;
  if (host == nullptr) {
    r.ok = false;
    return r;
  }
  r.d2h_gbps = copy_gbps(host, device, bytes, cudaMemcpyDeviceToHost, stream);
  r.h2d_gbps = copy_gbps(device, host, bytes, cudaMemcpyHostToDevice, stream);
  t = now();
  give(host);
  r.free_s = now() - t;
  return r;
}

}  // namespace

int main(int argc, char** argv) {
  const size_t gib = argc > 1 ? std::strtoul(argv[1], nullptr, 10) : 4;
  const int threads = argc > 2 ? std::atoi(argv[2]) : 8;
  const size_t bytes = gib << 30;
  check(cudaFree(nullptr), "context");
  void* device = nullptr;
  check(cudaMalloc(&device, bytes), "cudaMalloc");
  cudaStream_t stream;
  check(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking), "stream");
  const unsigned reg = cudaHostRegisterPortable;
  auto registered = [&](bool huge, int fault_threads) {
    return [=]() -> void* {
      void* p = mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
      if (p == MAP_FAILED) return nullptr;
      if (huge) madvise(p, bytes, MADV_HUGEPAGE);
      if (fault_threads > 0) fault_in(static_cast<char*>(p), bytes, fault_threads);
      if (cudaHostRegister(p, bytes, reg) != cudaSuccess) {
        cudaGetLastError();
        munmap(p, bytes);
        return nullptr;
      }
      return p;
    };
  };
  auto unregister = [&](void* p) {
    check(cudaHostUnregister(p), "cudaHostUnregister");
    munmap(p, bytes);
  };
  std::vector<Result> results;
  for (int round = 0; round < 2; ++round) {  // the first round also pays first-touch costs of the driver
    results.push_back(measure("cudaHostAlloc(Portable)", bytes, device, stream, [&]() -> void* {
      void* p = nullptr;
      return cudaHostAlloc(&p, bytes, cudaHostAllocPortable) == cudaSuccess ? p : nullptr;
    }, [](void* p) { check(cudaFreeHost(p), "cudaFreeHost"); }));
    results.push_back(measure("cudaMallocHost", bytes, device, stream, [&]() -> void* {
      void* p = nullptr;
      return cudaMallocHost(&p, bytes) == cudaSuccess ? p : nullptr;
    }, [](void* p) { check(cudaFreeHost(p), "cudaFreeHost"); }));
    results.push_back(measure("mmap + register (driver faults in)", bytes, device, stream, registered(false, 0), unregister));
    results.push_back(measure("mmap + 1 thread faults in + register", bytes, device, stream, registered(false, 1), unregister));
    results.push_back(measure("mmap + " + std::to_string(threads) + " threads fault in + register", bytes, device,
                              stream, registered(false, threads), unregister));
    results.push_back(measure("mmap + THP + register (driver faults in)", bytes, device, stream, registered(true, 0), unregister));
    results.push_back(measure("mmap + THP + " + std::to_string(threads) + " threads fault in + register", bytes, device,
                              stream, registered(true, threads), unregister));
  }
  cudaDeviceProp prop{};
  check(cudaGetDeviceProperties(&prop, 0), "props");
  int driver = 0, runtime = 0;
  cudaDriverGetVersion(&driver);
  cudaRuntimeGetVersion(&runtime);
  std::FILE* thp = std::fopen("/sys/kernel/mm/transparent_hugepage/enabled", "r");
  char thp_mode[128] = "?";
  if (thp) {
    if (!std::fgets(thp_mode, sizeof thp_mode, thp)) std::strcpy(thp_mode, "?");
    std::fclose(thp);
    thp_mode[std::strcspn(thp_mode, "\n")] = 0;
  }
  std::printf("%s, driver %d, runtime %d, %zu GiB, THP: %s\n", prop.name, driver, runtime, gib, thp_mode);
  std::printf("| round | how | get (s) | GiB/s to get | free (s) | D2H GB/s | H2D GB/s |\n|---|---|---|---|---|---|---|\n");
  for (size_t i = 0; i < results.size(); ++i) {
    const Result& r = results[i];
    if (!r.ok) {
      std::printf("| %zu | %s | failed | | | | |\n", i / 7 + 1, r.name.c_str());
      continue;
    }
    std::printf("| %zu | %s | %.3f | %.1f | %.3f | %.1f | %.1f |\n", i / 7 + 1, r.name.c_str(), r.get_s,
                gib / r.get_s, r.free_s, r.d2h_gbps, r.h2d_gbps);
  }
  return 0;
}
