// How fast can device bytes land in fresh pageable (mmap'ed) host memory, the memory an mmap backup
// must end in (issue 26: within 10 % of the pinned backup's pause)? Each way, side by side, rounds
// alternating; a fresh mapping every time, as each pause makes one:
//   pinned       the pinned pause's way: map, huge pages, fault in (8 threads) and cudaHostRegister
//                in 256 MiB steps on a thread of their own, the next step faulted in while this one
//                registers; each step copied into (D2H) as soon as it is registered. The memory
//                stays pinned (the reference).
//   pin+unpin    the same, then every step unregistered after the copies: pageable at the end.
//   pin+unpin overlapped   the same, each step unregistered once its copy is done, while later
//                steps are still pinned and copied.
//   bounce       uvm's mmap backup: 8 worker threads (and 16), each copying 16 MiB batches to a
//                pinned bounce buffer of its own and memcpy'ing them into the mapping (page faults
//                there); and 16 threads into one mapping per 64 MiB, as uvm maps one per allocation,
//                and 16 threads copying batches of 16 MiB - 64 B (as uvm planned them before).
// Prints GB/s per way and round, and the median.
//
//   g++ -O2 -std=c++17 bench/probes/mmap_probe.cpp -I$CUDA_HOME/include -L$CUDA_HOME/lib64 -lcudart -lpthread -o mmap_probe
//   ./mmap_probe [GiB=4] [rounds=3]
#include <cuda_runtime_api.h>
#include <sys/mman.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

namespace {

constexpr size_t kMiB = size_t{1} << 20;
constexpr size_t kStep = 256 * kMiB;
constexpr size_t kBounce = 16 * kMiB;
constexpr unsigned kThreads = 8;

void check(cudaError_t e, const char* what) {
  if (e != cudaSuccess) {
    std::fprintf(stderr, "%s: %s\n", what, cudaGetErrorName(e));
    std::exit(1);
  }
}

double now() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

char* map_fresh(size_t bytes) {
  void* p = mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
  if (p == MAP_FAILED) {
    std::perror("mmap");
    std::exit(1);
  }
  madvise(p, bytes, MADV_HUGEPAGE);
  return static_cast<char*>(p);
}

void fault_in(char* host, size_t bytes) {
  const size_t share = (bytes / kThreads + 4095) / 4096 * 4096;
  std::vector<std::thread> workers;
  for (unsigned t = 0; t < kThreads; ++t) {
    workers.emplace_back([=] {
      const size_t begin = t * share, end = std::min(bytes, begin + share);
      for (size_t i = begin; i < end; i += 4096) host[i] = 0;
    });
  }
  for (auto& w : workers) w.join();
}

// Pins `host` step by step on a thread; `copy_step(k)` runs on the caller as each step is ready.
// `unpin`: 0 keep pinned, 1 unregister all at the end, 2 unregister each step once its copy is done.
double pinned_way(const char* device, size_t bytes, int unpin) {
  const double start = now();
  char* host = map_fresh(bytes);
  const size_t steps = (bytes + kStep - 1) / kStep;
  std::mutex mutex;
  std::condition_variable changed;
  size_t ready = 0;
  int current = 0;
  check(cudaGetDevice(&current), "cudaGetDevice");
  std::thread pinner([&] {
    check(cudaSetDevice(current), "cudaSetDevice");
    fault_in(host, std::min(kStep, bytes));
    for (size_t k = 0; k < steps; ++k) {
      const size_t at = k * kStep, size = std::min(kStep, bytes - at);
      std::thread ahead;
      if (at + kStep < bytes) ahead = std::thread([&, at] { fault_in(host + at + kStep, std::min(kStep, bytes - at - kStep)); });
      check(cudaHostRegister(host + at, size, cudaHostRegisterPortable), "cudaHostRegister");
      if (ahead.joinable()) ahead.join();
      std::lock_guard<std::mutex> lock(mutex);
      ready = k + 1;
      changed.notify_all();
    }
  });
  cudaStream_t stream;
  check(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking), "cudaStreamCreate");
  std::vector<cudaEvent_t> done(steps);
  // Unregistering beside the copies: a thread of its own waits for each step's copy.
  std::atomic<size_t> issued{0};
  std::thread unpinner;
  if (unpin == 2) {
    unpinner = std::thread([&] {
      check(cudaSetDevice(current), "cudaSetDevice");
      for (size_t k = 0; k < steps; ++k) {
        while (issued.load() <= k) std::this_thread::yield();
        check(cudaEventSynchronize(done[k]), "cudaEventSynchronize");
        check(cudaHostUnregister(host + k * kStep), "cudaHostUnregister");
      }
    });
  }
  for (size_t k = 0; k < steps; ++k) {
    {
      std::unique_lock<std::mutex> lock(mutex);
      changed.wait(lock, [&] { return ready > k; });
    }
    const size_t at = k * kStep, size = std::min(kStep, bytes - at);
    check(cudaMemcpyAsync(host + at, device + at, size, cudaMemcpyDeviceToHost, stream), "cudaMemcpyAsync");
    check(cudaEventCreateWithFlags(&done[k], cudaEventDisableTiming), "cudaEventCreate");
    check(cudaEventRecord(done[k], stream), "cudaEventRecord");
    issued = k + 1;
  }
  check(cudaStreamSynchronize(stream), "cudaStreamSynchronize");
  pinner.join();
  if (unpin == 1) {
    for (size_t k = 0; k < steps; ++k) check(cudaHostUnregister(host + k * kStep), "cudaHostUnregister");
  }
  if (unpinner.joinable()) unpinner.join();
  const double seconds = now() - start;
  if (unpin == 0) {
    for (size_t k = 0; k < steps; ++k) check(cudaHostUnregister(host + k * kStep), "cudaHostUnregister");
  }
  for (cudaEvent_t e : done) cudaEventDestroy(e);
  cudaStreamDestroy(stream);
  munmap(host, bytes);
  return seconds;
}

// `target_bytes`: the mapping is made of separate mappings of that size (uvm makes one per
// allocation), 0: one mapping.
// `chunk`: the bytes each batch copies (kBounce, or less: uvm copied kBounce - 64 before).
double bounce_way(const char* device, size_t bytes, unsigned threads, size_t target_bytes = 0, size_t chunk = kBounce) {
  const double start = now();
  std::vector<char*> targets;
  char* host = nullptr;
  if (target_bytes == 0) {
    host = map_fresh(bytes);
  } else {
    for (size_t at = 0; at < bytes; at += target_bytes) targets.push_back(map_fresh(std::min(target_bytes, bytes - at)));
  }
  auto destination = [&](size_t at) { return target_bytes == 0 ? host + at : targets[at / target_bytes] + at % target_bytes; };
  const size_t batches = (bytes + chunk - 1) / chunk;
  std::atomic<size_t> next{0};
  int current = 0;
  check(cudaGetDevice(&current), "cudaGetDevice");
  static std::vector<char*> buffers;
  while (buffers.size() < threads) {
    {
      void* b = nullptr;
      check(cudaHostAlloc(&b, kBounce, cudaHostAllocPortable), "cudaHostAlloc");
      buffers.push_back(static_cast<char*>(b));
    }
  }
  std::vector<std::thread> workers;
  for (unsigned t = 0; t < threads; ++t) {
    workers.emplace_back([&, t] {
      check(cudaSetDevice(current), "cudaSetDevice");
      cudaStream_t stream;
      check(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking), "cudaStreamCreate");
      for (size_t i = next++; i < batches; i = next++) {
        const size_t at = i * chunk, size = std::min(chunk, bytes - at);
        check(cudaMemcpyAsync(buffers[t], device + at, size, cudaMemcpyDeviceToHost, stream), "cudaMemcpyAsync");
        check(cudaStreamSynchronize(stream), "cudaStreamSynchronize");
        std::memcpy(destination(at), buffers[t], size);
      }
      cudaStreamDestroy(stream);
    });
  }
  for (auto& w : workers) w.join();
  const double seconds = now() - start;
  if (host != nullptr) munmap(host, bytes);
  for (size_t k = 0; k < targets.size(); ++k) munmap(targets[k], std::min(target_bytes, bytes - k * target_bytes));
  return seconds;
}

}  // namespace

int main(int argc, char** argv) {
  const double gib = argc > 1 ? std::atof(argv[1]) : 4.0;
  const int rounds = argc > 2 ? std::atoi(argv[2]) : 3;
  const size_t bytes = static_cast<size_t>(gib * 1024) * kMiB;
  char* device = nullptr;
  check(cudaMalloc(reinterpret_cast<void**>(&device), bytes), "cudaMalloc");
  check(cudaMemset(device, 7, bytes), "cudaMemset");
  check(cudaDeviceSynchronize(), "cudaDeviceSynchronize");
  cudaDeviceProp prop{};
  check(cudaGetDeviceProperties(&prop, 0), "cudaGetDeviceProperties");
  std::printf("%s, %.1f GiB, %d rounds, THP %s\n", prop.name, gib, rounds, "advised (MADV_HUGEPAGE)");
  const char* names[] = {"pinned (reference: stays pinned)", "pin+unpin at the end", "pin+unpin overlapped",
                         "bounce (8 x 16 MiB, memcpy)", "bounce (16 x 16 MiB, memcpy)",
                         "bounce (16), 64 MiB mappings", "bounce (16), chunks of 16 MiB - 64 B"};
  constexpr int kWays = 7;
  std::vector<std::vector<double>> gbps(kWays);
  for (int round = 0; round < rounds; ++round) {
    for (int way = 0; way < kWays; ++way) {
      const double s = way < 3    ? pinned_way(device, bytes, way)
                       : way < 5  ? bounce_way(device, bytes, way == 3 ? 8 : 16)
                       : way == 5 ? bounce_way(device, bytes, 16, 64 * kMiB)
                                  : bounce_way(device, bytes, 16, 0, kBounce - 64);
      gbps[way].push_back(bytes / s / 1e9);
      std::printf("round %d  %-34s %6.1f GB/s\n", round + 1, names[way], bytes / s / 1e9);
      std::fflush(stdout);
    }
  }
  std::printf("\n| way | GB/s (median) | / pinned |\n|---|---|---|\n");
  std::vector<double> median(kWays);
  for (int way = 0; way < kWays; ++way) {
    std::vector<double> v = gbps[way];
    std::sort(v.begin(), v.end());
    median[way] = v[v.size() / 2];
  }
  for (int way = 0; way < kWays; ++way) {
    std::printf("| %s | %.1f | %.2f |\n", names[way], median[way], median[way] / median[0]);
  }
  cudaFree(device);
  return 0;
}
