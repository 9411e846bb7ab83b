// How fast can pinned host memory be had? Times, side by side in one run, the ways to get N GiB of
// page-locked memory a GPU copies into at full speed, and the copy speed into each:
//   cudaHostAlloc, cudaMallocHost, and mmap + fault-in (1 or T threads, 4 KiB or transparent huge
//   pages) + cudaHostRegister, and a memory pool of the host's NUMA node (the driver allocating and
//   pinning the pages itself, CUDA 12.2+); then how long each takes to give back.
// Plain C++ against cudart, no kernel (arguments: GiB, threads):
//   g++ -O2 -std=c++17 bench/probes/pinned_probe.cpp -I$CUDA_HOME/include -L$CUDA_HOME/lib64 -lcudart
//       -lpthread -o pinned_probe && ./pinned_probe 4 8
// `./pinned_probe 4 16 wall` times each stage of holding the bytes in fresh host memory apart
// (faulting in at 1 to 16 threads, the host's write bandwidth, registering, the link), MAP_HUGETLB
// where the host has huge pages, and the RSS each way: the wall a pause without retained memory meets.
// `./pinned_probe 4 16 registrars` registers on 1 to 4 threads at once, then pauses with 2 registrars
// or a 64 MiB first step: the levers left once each step copies at the link.
// `./pinned_probe 4 16 overlap` asks why faulting in and registering do not overlap in a pipeline:
// each alone, both at once on separate mappings and on one, with the process's CPU time, then whole
// pauses into fresh memory: uvm's way, a fault-in pool that stays, a mapping per step, and a bounce
// path (copies into a small pinned ring, threads copying the ring into fresh pageable memory).
// `./pinned_probe 4 8 first` times instead a first offload with no pinned memory yet: the split of
// pinning into faulting in and registering, then pinning all before copying (uvm today) against
// pinning chunk by chunk with the copies of the chunks before running meanwhile, serially, with
// faulting in a chunk ahead on other threads, and with several threads pinning chunks at once.
#include <cuda_runtime_api.h>
#include <sys/mman.h>
#include <sys/resource.h>
#include <sys/utsname.h>

#include <atomic>
#include <cerrno>
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

constexpr size_t kStepBytes = size_t{256} << 20;  // offload/media/pinned.hpp's kPinStepBytes

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

char* map_huge(size_t bytes) {
  void* p = mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  if (p == MAP_FAILED) {
    std::perror("mmap");
    std::exit(1);
  }
  madvise(p, bytes, MADV_HUGEPAGE);
  return static_cast<char*>(p);
}

// A first offload of `bytes` from `device` into memory pinned on the way, in chunks of `chunk`:
// `how` 0 pins everything, then copies; 1 pins a chunk (fault-in on `threads`, register), issues its
// copy, pins the next; 2 like 1, with the next chunk faulted in by the threads while this one is
// registered; 3 `threads` workers each fault in and register chunks of their own, the copies issued
// as chunks are ready. Returns seconds until the last copy ends.
double first_offload(int how, size_t bytes, size_t chunk, int threads, void* device, cudaStream_t stream) {
  char* host = map_huge(bytes);
  const size_t chunks = (bytes + chunk - 1) / chunk;
  auto span = [&](size_t i) { return std::min(chunk, bytes - i * chunk); };
  auto reg = [&](size_t i) { check(cudaHostRegister(host + i * chunk, span(i), cudaHostRegisterPortable), "register"); };
  auto copy = [&](size_t i) {
    check(cudaMemcpyAsync(host + i * chunk, static_cast<char*>(device) + i * chunk, span(i), cudaMemcpyDeviceToHost,
                          stream), "copy");
  };
  const double t = now();
  if (how == 0) {
    fault_in(host, bytes, threads);
    for (size_t i = 0; i < chunks; ++i) reg(i);
    for (size_t i = 0; i < chunks; ++i) copy(i);
  } else if (how == 1) {
    for (size_t i = 0; i < chunks; ++i) {
      fault_in(host + i * chunk, span(i), threads);
      reg(i);
      copy(i);
    }
  } else if (how == 2) {
    fault_in(host, span(0), threads);
    for (size_t i = 0; i < chunks; ++i) {
      std::thread ahead([&, i] { if (i + 1 < chunks) fault_in(host + (i + 1) * chunk, span(i + 1), threads); });
      reg(i);
      copy(i);
      ahead.join();
    }
  } else {
    std::vector<std::atomic<int>> ready(chunks);
    std::vector<std::thread> workers;
    for (int w = 0; w < threads; ++w) {
      workers.emplace_back([&, w] {
        for (size_t i = w; i < chunks; i += threads) {
          fault_in(host + i * chunk, span(i), 1);
          reg(i);
          ready[i] = 1;
        }
      });
    }
    for (size_t i = 0; i < chunks; ++i) {
      while (!ready[i]) std::this_thread::yield();
      copy(i);
    }
    for (auto& w : workers) w.join();
  }
  check(cudaStreamSynchronize(stream), "sync");
  const double seconds = now() - t;
  for (size_t i = 0; i < chunks; ++i) check(cudaHostUnregister(host + i * chunk), "unregister");
  munmap(host, bytes);
  return seconds;
}

// A first offload as a pipeline: `threads` threads fault chunks in, one chunk at a time in order;
// `registrars` threads register them as they are faulted; the copies are issued in order as chunks
// are registered. Seconds until the last copy ends.
double pipelined_offload(size_t bytes, size_t chunk, int threads, int registrars, void* device, cudaStream_t stream) {
  char* host = map_huge(bytes);
  const size_t chunks = (bytes + chunk - 1) / chunk;
  auto span = [&](size_t i) { return std::min(chunk, bytes - i * chunk); };
  std::vector<std::atomic<int>> faulted(chunks), registered(chunks);
  const double t = now();
  std::thread faulting([&] {
    for (size_t i = 0; i < chunks; ++i) {
      fault_in(host + i * chunk, span(i), threads);
      faulted[i].store(1, std::memory_order_release);
    }
  });
  std::vector<std::thread> registering;
  for (int r = 0; r < registrars; ++r) {
    registering.emplace_back([&, r] {
      for (size_t i = r; i < chunks; i += registrars) {
        while (!faulted[i].load(std::memory_order_acquire)) std::this_thread::yield();
        check(cudaHostRegister(host + i * chunk, span(i), cudaHostRegisterPortable), "register");
        registered[i].store(1, std::memory_order_release);
      }
    });
  }
  for (size_t i = 0; i < chunks; ++i) {
    while (!registered[i].load(std::memory_order_acquire)) std::this_thread::yield();
    check(cudaMemcpyAsync(host + i * chunk, static_cast<char*>(device) + i * chunk, span(i), cudaMemcpyDeviceToHost,
                          stream), "copy");
  }
  check(cudaStreamSynchronize(stream), "sync");
  const double seconds = now() - t;
  faulting.join();
  for (auto& r : registering) r.join();
  for (size_t i = 0; i < chunks; ++i) check(cudaHostUnregister(host + i * chunk), "unregister");
  munmap(host, bytes);
  return seconds;
}

int first_offload_table(size_t gib, int threads, void* device, cudaStream_t stream) {
  const size_t bytes = gib << 30;
  // The split of pinning: faulting huge pages in on the threads, then registering them.
  for (int round = 0; round < 2; ++round) {
    char* host = map_huge(bytes);
    double t = now();
    fault_in(host, bytes, threads);
    const double fault_s = now() - t;
    t = now();
    check(cudaHostRegister(host, bytes, cudaHostRegisterPortable), "register");
    const double register_s = now() - t;
    check(cudaHostUnregister(host), "unregister");
    munmap(host, bytes);
    std::printf("split, round %d: fault-in on %d threads %.3f s (%.1f GB/s), register %.3f s (%.1f GB/s)\n", round + 1,
                threads, fault_s, bytes / fault_s / 1e9, register_s, bytes / register_s / 1e9);
  }
  const char* names[] = {"pin all, then copy (uvm today)", "per chunk: pin, copy", "per chunk, next chunk faulted in ahead",
                         "threads pin chunks at once, copies as they are ready"};
  std::printf("| how | chunk MiB | threads | seconds | GB/s end to end |\n|---|---|---|---|---|\n");
  for (int round = 0; round < 2; ++round) {
    for (int how = 0; how < 4; ++how) {
      for (size_t chunk_mib : {64, 256, 1024}) {
        if (how == 0 && chunk_mib != 1024) continue;
        const double s = first_offload(how, bytes, chunk_mib << 20, threads, device, stream);
        std::printf("| %s | %zu | %d | %.3f | %.1f |\n", names[how], chunk_mib, threads, s, bytes / s / 1e9);
      }
    }
    for (int registrars : {1, 2, 4}) {
      for (size_t chunk_mib : {64, 256}) {
        const double s = pipelined_offload(bytes, chunk_mib << 20, threads, registrars, device, stream);
        std::printf("| pipeline: fault in on %d threads, register on %d, copy as registered | %zu | %d | %.3f | %.1f |\n",
                    threads, registrars, chunk_mib, threads, s, bytes / s / 1e9);
      }
    }
  }
  return 0;
}

// This process's resident set, MiB (/proc/self/status VmRSS).
double rss_mib() {
  FILE* f = std::fopen("/proc/self/status", "r");
  char line[256];
  double kib = 0;
  while (f && std::fgets(line, sizeof line, f)) {
    if (std::strncmp(line, "VmRSS:", 6) == 0) kib = std::atof(line + 6);
  }
  if (f) std::fclose(f);
  return kib / 1024;
}

// Writes every byte of [p, p + bytes) on `threads` threads.
void fill(char* p, size_t bytes, int threads) {
  std::vector<std::thread> workers;
  const size_t share = (bytes / threads + 4095) / 4096 * 4096;
  for (int t = 0; t < threads; ++t) {
    workers.emplace_back([=] {
      const size_t begin = std::min(bytes, t * share), end = std::min(bytes, begin + share);
      std::memset(p + begin, 1, end - begin);
    });
  }
  for (auto& w : workers) w.join();
}

// How fast can a pause without retained memory hold `gib` GiB on this host: every stage of getting
// fresh host memory the GPU copies into, apart, at 1 to `threads` threads, and what keeping the
// memory between cycles would save (registering pages already there), with the RSS each way.
int wall_table(size_t gib, int threads, void* device, cudaStream_t stream) {
  const size_t bytes = gib << 30;
  auto gbps = [&](double s) { return bytes / s / 1e9; };
  std::printf("| stage | threads | seconds | GB/s |\n|---|---|---|---|\n");
  for (int round = 0; round < 2; ++round) {
    for (int t : {1, 4, 8, threads}) {  // the kernel faulting in and zeroing fresh huge pages
      char* host = map_huge(bytes);
      const double start = now();
      fault_in(host, bytes, t);
      std::printf("| fault in fresh memory (THP) | %d | %.3f | %.1f |\n", t, now() - start, gbps(now() - start));
      munmap(host, bytes);
    }
    char* host = map_huge(bytes);
    double start = now();
    fill(host, bytes, threads);
    std::printf("| memset fresh memory (fault, zero, write) | %d | %.3f | %.1f |\n", threads, now() - start,
                gbps(now() - start));
    start = now();
    fill(host, bytes, threads);
    std::printf("| memset memory already there (the host's write bandwidth) | %d | %.3f | %.1f |\n", threads,
                now() - start, gbps(now() - start));
    const double rss_faulted = rss_mib();
    for (int at_once : {2, 4, 8}) {  // registrations of 64 MiB chunks on several threads: do they scale?
      const size_t chunk = size_t{64} << 20, chunks = bytes / chunk;
      start = now();
      std::vector<std::thread> workers;
      for (int w = 0; w < at_once; ++w) {
        workers.emplace_back([=] {
          for (size_t i = w; i < chunks; i += at_once) check(cudaHostRegister(host + i * chunk, chunk, cudaHostRegisterPortable), "register");
        });
      }
      for (auto& w : workers) w.join();
      const double s = now() - start;
      for (size_t i = 0; i < chunks; ++i) check(cudaHostUnregister(host + i * chunk), "unregister");
      std::printf("| register memory already there, 64 MiB chunks | %d | %.3f | %.1f |\n", at_once, s, gbps(s));
    }
    start = now();
    check(cudaHostRegister(host, bytes, cudaHostRegisterPortable), "register");
    std::printf("| register memory already there | 1 | %.3f | %.1f |\n", now() - start, gbps(now() - start));
    start = now();
    check(cudaMemcpyAsync(host, device, bytes, cudaMemcpyDeviceToHost, stream), "copy");
    check(cudaStreamSynchronize(stream), "sync");
    std::printf("| device to host copy into it (the link) | - | %.3f | %.1f |\n", now() - start, gbps(now() - start));
    check(cudaHostUnregister(host), "unregister");
    munmap(host, bytes);
    std::printf("| (RSS while held: %.0f MiB; after munmap: %.0f MiB) | | | |\n", rss_faulted, rss_mib());
  }
  void* huge = mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_HUGETLB, -1, 0);
  if (huge == MAP_FAILED) {
    std::printf("MAP_HUGETLB of %zu GiB: not available (%s): the host reserves no huge pages for it\n", gib,
                std::strerror(errno));
  } else {
    const double start = now();
    fault_in(static_cast<char*>(huge), bytes, threads);
    std::printf("MAP_HUGETLB: fault in on %d threads %.3f s (%.1f GB/s)\n", threads, now() - start, gbps(now() - start));
    munmap(huge, bytes);
  }
  return 0;
}


#ifndef MADV_POPULATE_WRITE
#define MADV_POPULATE_WRITE 23
#endif

// Wall and process CPU seconds (user + system, every thread) of one stage.
struct Timed {
  double wall = 0, cpu = 0;
};

double cpu_now() {
  rusage usage{};
  getrusage(RUSAGE_SELF, &usage);
  auto s = [](const timeval& t) { return t.tv_sec + t.tv_usec / 1e6; };
  return s(usage.ru_utime) + s(usage.ru_stime);
}

template <typename Work>
Timed timed(Work work) {
  const double wall = now(), cpu = cpu_now();
  work();
  return Timed{now() - wall, cpu_now() - cpu};
}

// Faults [p, p + bytes) in on `threads` threads, each with one MADV_POPULATE_WRITE over its share.
void populate(char* p, size_t bytes, int threads) {
  std::vector<std::thread> workers;
  const size_t share = (bytes / threads + (size_t{2} << 20) - 1) / (size_t{2} << 20) * (size_t{2} << 20);
  for (int t = 0; t < threads; ++t) {
    workers.emplace_back([=] {
      const size_t begin = std::min(bytes, t * share), end = std::min(bytes, begin + share);
      if (end > begin && madvise(p + begin, end - begin, MADV_POPULATE_WRITE) != 0) {
        std::perror("madvise(MADV_POPULATE_WRITE)");
        std::exit(1);
      }
    });
  }
  for (auto& w : workers) w.join();
}

constexpr unsigned kUvmFlags = cudaHostRegisterPortable | cudaHostRegisterMapped;  // offload/media/pinned.cpp's

void register_chunks(char* p, size_t bytes, size_t chunk) {
  for (size_t at = 0; at < bytes; at += chunk) check(cudaHostRegister(p + at, std::min(chunk, bytes - at), kUvmFlags), "register");
}

void unregister_chunks(char* p, size_t bytes, size_t chunk) {
  for (size_t at = 0; at < bytes; at += chunk) check(cudaHostUnregister(p + at), "unregister");
}

// Threads that stay: each job is cut into one share per thread; run() returns when all are done.
class Pool {
 public:
  explicit Pool(int threads) {
    for (int t = 0; t < threads; ++t) workers_.emplace_back([this, t, threads] { loop(t, threads); });
  }
  ~Pool() {
    {
      std::lock_guard<std::mutex> lock(mutex_);
      stop_ = true;
      ++generation_;
    }
    changed_.notify_all();
    for (auto& w : workers_) w.join();
  }
  // Runs job(begin, end) over [0, bytes) in page-aligned shares, one per thread.
  void run(size_t bytes, std::function<void(size_t, size_t)> job) {
    std::unique_lock<std::mutex> lock(mutex_);
    job_ = std::move(job);
    bytes_ = bytes;
    left_ = static_cast<int>(workers_.size());
    ++generation_;
    changed_.notify_all();
    done_.wait(lock, [&] { return left_ == 0; });
  }

 private:
  void loop(int t, int threads) {
    size_t seen = 0;
    for (;;) {
      std::unique_lock<std::mutex> lock(mutex_);
      changed_.wait(lock, [&] { return generation_ != seen; });
      seen = generation_;
      if (stop_) return;
      const size_t share = (bytes_ / threads + 4095) / 4096 * 4096;
      const size_t begin = std::min(bytes_, t * share), end = std::min(bytes_, begin + share);
      auto job = job_;
      lock.unlock();
      if (end > begin) job(begin, end);
      lock.lock();
      if (--left_ == 0) done_.notify_all();
    }
  }
  std::vector<std::thread> workers_;
  std::mutex mutex_;
  std::condition_variable changed_, done_;
  std::function<void(size_t, size_t)> job_;
  size_t bytes_ = 0, generation_ = 0;
  int left_ = 0;
  bool stop_ = false;
};

// A whole pause of `bytes` from `device` into fresh memory, in `step` pieces, seconds until the last
// copy ends. how: 0 uvm's steps (offload/media/pinned.cpp: a thread per step faults the next step in on
// new threads while this one registers), its copies issued on the registering thread, 1 the same
// with a pool of fault-in threads that stays,
// 2 the pool and a mapping of its own per step (PROT_NONE gaps keep the kernel from merging them),
// 3 the pool faulting in with MADV_POPULATE_WRITE, 4 a bounce path: copies into a pinned ring of
// `ring` steps, the pool copying each step into fresh pageable memory (nothing registered per pause),
// 5 as uvm pins and copies: the steps registered on a thread of their own, the caller issuing each
// step's copies in 32 MiB pieces once it is registered.
double fresh_pause(int how, size_t bytes, size_t step, int threads, size_t ring, void* device, cudaStream_t stream) {
  const size_t steps = bytes / step;
  const size_t gap = size_t{2} << 20;
  const size_t stride = how == 2 ? step + gap : step;
  char* base = how == 2 ? static_cast<char*>(mmap(nullptr, steps * stride, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0))
                        : map_huge(bytes);
  if (base == MAP_FAILED) {
    std::perror("mmap");
    std::exit(1);
  }
  if (how == 2) {
    for (size_t i = 0; i < steps; ++i) {
      check(mprotect(base + i * stride, step, PROT_READ | PROT_WRITE) == 0 ? cudaSuccess : cudaErrorUnknown, "mprotect");
      madvise(base + i * stride, step, MADV_HUGEPAGE);
    }
  }
  auto at = [&](size_t i) { return base + i * stride; };
  auto from = [&](size_t i) { return static_cast<char*>(device) + i * step; };
  Pool pool(threads);
  auto touch = [&](size_t i) {
    char* p = at(i);
    if (how == 3) {
      pool.run(step, [p](size_t b, size_t e) {
        if (madvise(p + b, e - b, MADV_POPULATE_WRITE) != 0) std::perror("madvise(MADV_POPULATE_WRITE)");
      });
    } else {
      pool.run(step, [p](size_t b, size_t e) { for (size_t k = b; k < e; k += 4096) p[k] = 0; });
    }
  };
  double seconds = 0;
  if (how == 4) {
    char* slots = map_huge(ring * step);
    fault_in(slots, ring * step, threads);
    check(cudaHostRegister(slots, ring * step, kUvmFlags), "register ring");
    std::vector<cudaEvent_t> copied(steps);
    for (auto& e : copied) check(cudaEventCreateWithFlags(&e, cudaEventDisableTiming), "event");
    const double t = now();
    for (size_t i = 0; i < std::min(ring, steps); ++i) {
      check(cudaMemcpyAsync(slots + i * step, from(i), step, cudaMemcpyDeviceToHost, stream), "copy");
      check(cudaEventRecord(copied[i], stream), "record");
    }
    for (size_t i = 0; i < steps; ++i) {
      check(cudaEventSynchronize(copied[i]), "wait");
      const char* slot = slots + (i % ring) * step;
      char* dst = at(i);
      pool.run(step, [=](size_t b, size_t e) { std::memcpy(dst + b, slot + b, e - b); });
      if (i + ring < steps) {
        check(cudaMemcpyAsync(slots + (i % ring) * step, from(i + ring), step, cudaMemcpyDeviceToHost, stream), "copy");
        check(cudaEventRecord(copied[i + ring], stream), "record");
      }
    }
    seconds = now() - t;
    for (auto& e : copied) cudaEventDestroy(e);
    check(cudaHostUnregister(slots), "unregister ring");
    munmap(slots, ring * step);
    munmap(base, bytes);
    return seconds;
  }
  const double t = now();
  if (how == 5) {  // as uvm pins: a thread of its own registers, the caller copies each step as it is done
    std::atomic<size_t> registered{0};
    std::thread pinning([&] {
      fault_in(at(0), step, threads);
      for (size_t i = 0; i < steps; ++i) {
        std::thread ahead([&, i] { if (i + 1 < steps) fault_in(at(i + 1), step, threads - 1); });
        check(cudaHostRegister(at(i), step, kUvmFlags), "register");
        registered.store(i + 1, std::memory_order_release);
        ahead.join();
      }
    });
    const size_t piece = std::min(step, size_t{32} << 20);  // the RL bench's weights are 20-132 MiB tensors
    for (size_t i = 0; i < steps; ++i) {
      while (registered.load(std::memory_order_acquire) <= i) std::this_thread::yield();
      for (size_t p = 0; p < step; p += piece) {
        check(cudaMemcpyAsync(at(i) + p, from(i) + p, piece, cudaMemcpyDeviceToHost, stream), "copy");
      }
    }
    pinning.join();
  } else if (how == 0) {
    fault_in(at(0), step, threads);
    for (size_t i = 0; i < steps; ++i) {
      std::thread ahead([&, i] { if (i + 1 < steps) fault_in(at(i + 1), step, threads); });
      check(cudaHostRegister(at(i), step, kUvmFlags), "register");
      check(cudaMemcpyAsync(at(i), from(i), step, cudaMemcpyDeviceToHost, stream), "copy");
      ahead.join();
    }
  } else {
    touch(0);
    for (size_t i = 0; i < steps; ++i) {
      std::thread ahead([&, i] { if (i + 1 < steps) touch(i + 1); });
      check(cudaHostRegister(at(i), step, kUvmFlags), "register");
      check(cudaMemcpyAsync(at(i), from(i), step, cudaMemcpyDeviceToHost, stream), "copy");
      ahead.join();
    }
  }
  check(cudaStreamSynchronize(stream), "sync");
  seconds = now() - t;
  for (size_t i = 0; i < steps; ++i) check(cudaHostUnregister(at(i)), "unregister");
  munmap(base, how == 2 ? steps * stride : bytes);
  return seconds;
}

void print_host() {
  utsname u{};
  uname(&u);
  auto first_line = [](const char* path) {
    std::string line = "?";
    if (FILE* f = std::fopen(path, "r")) {
      char buf[256];
      if (std::fgets(buf, sizeof buf, f)) line = std::string(buf, std::strcspn(buf, "\n"));
      std::fclose(f);
    }
    return line;
  };
  std::printf("kernel %s; CPUs online %u; THP enabled: %s; defrag: %s; shmem: %s\n", u.release,
              std::thread::hardware_concurrency(), first_line("/sys/kernel/mm/transparent_hugepage/enabled").c_str(),
              first_line("/sys/kernel/mm/transparent_hugepage/defrag").c_str(),
              first_line("/sys/kernel/mm/transparent_hugepage/shmem_enabled").c_str());
}

// A whole pause into fresh memory as uvm pins it, with the two levers left once every step copies at
// the link: `registrars` threads registering steps in turn (does the driver register two ranges at
// once?) and a first step of `first` bytes (the copies start once it is pinned). A pool of
// threads - registrars fault steps in, in order, ahead of the registrations; the caller issues each
// step's copies in 32 MiB pieces once it is registered. Seconds until the last copy ends.
double registrars_pause(size_t bytes, size_t first, size_t step, int registrars, int threads, void* device,
                        cudaStream_t stream) {
  std::vector<size_t> starts{0};
  for (size_t at = std::min(first, bytes); at < bytes; at += step) starts.push_back(at);
  const size_t n = starts.size();
  auto length = [&](size_t i) { return (i + 1 < n ? starts[i + 1] : bytes) - starts[i]; };
  char* base = map_huge(bytes);
  std::atomic<size_t> faulted{0};
  std::vector<std::atomic<bool>> pinned(n);
  for (auto& p : pinned) p.store(false);
  const double t = now();
  std::thread faulter([&] {
    Pool pool(threads - registrars);
    for (size_t i = 0; i < n; ++i) {
      char* p = base + starts[i];
      pool.run(length(i), [p](size_t b, size_t e) { for (size_t k = b; k < e; k += 4096) p[k] = 0; });
      faulted.store(i + 1, std::memory_order_release);
    }
  });
  std::vector<std::thread> registering;
  for (int r = 0; r < registrars; ++r) {
    registering.emplace_back([&, r] {
      for (size_t i = r; i < n; i += registrars) {
        while (faulted.load(std::memory_order_acquire) <= i) std::this_thread::yield();
        check(cudaHostRegister(base + starts[i], length(i), kUvmFlags), "register");
        pinned[i].store(true, std::memory_order_release);
      }
    });
  }
  const size_t piece = size_t{32} << 20;
  for (size_t i = 0; i < n; ++i) {
    while (!pinned[i].load(std::memory_order_acquire)) std::this_thread::yield();
    for (size_t p = 0; p < length(i); p += piece) {
      const size_t at = starts[i] + p, len = std::min(piece, length(i) - p);
      check(cudaMemcpyAsync(base + at, static_cast<char*>(device) + at, len, cudaMemcpyDeviceToHost, stream), "copy");
    }
  }
  check(cudaStreamSynchronize(stream), "sync");
  const double seconds = now() - t;
  faulter.join();
  for (auto& r : registering) r.join();
  for (size_t i = 0; i < n; ++i) check(cudaHostUnregister(base + starts[i]), "unregister");
  munmap(base, bytes);
  return seconds;
}

// `./pinned_probe 4 16 registrars`: registering alone on 1 to 4 threads (memory already faulted in,
// one mapping, 256 MiB steps), then whole pauses with 1 or 2 registrars and a first step of 256 or
// 64 MiB, alternating, three rounds.
int registrars_table(size_t gib, int threads, void* device, cudaStream_t stream) {
  const size_t bytes = gib << 30, step = kStepBytes;
  auto gbps = [&](double s) { return bytes / s / 1e9; };
  print_host();
  std::printf("| registering 256 MiB steps of faulted-in memory | threads | seconds | GB/s |\n|---|---|---|---|\n");
  for (int round = 0; round < 2; ++round) {
    for (int registrars : {1, 2, 3, 4}) {
      char* b = map_huge(bytes);
      fault_in(b, bytes, threads);
      const size_t n = bytes / step;
      const double t = now();
      std::vector<std::thread> regs;
      for (int r = 0; r < registrars; ++r) {
        regs.emplace_back([&, r] {
          for (size_t i = r; i < n; i += registrars) check(cudaHostRegister(b + i * step, step, kUvmFlags), "register");
        });
      }
      for (auto& r : regs) r.join();
      const double s = now() - t;
      std::printf("| one mapping | %d | %.3f | %.1f |\n", registrars, s, gbps(s));
      unregister_chunks(b, bytes, step);
      munmap(b, bytes);
    }
    char* b = map_huge(bytes);  // uvm registers Portable | Mapped: does the plain flag cost less?
    fault_in(b, bytes, threads);
    const double t = now();
    for (size_t at = 0; at < bytes; at += step) check(cudaHostRegister(b + at, step, cudaHostRegisterDefault), "register");
    const double s = now() - t;
    std::printf("| one mapping, cudaHostRegisterDefault | 1 | %.3f | %.1f |\n", s, gbps(s));
    unregister_chunks(b, bytes, step);
    munmap(b, bytes);
  }
  std::printf("\n| whole pause into fresh memory | registrars | first step MiB | seconds | GB/s |\n|---|---|---|---|---|\n");
  for (int round = 0; round < 3; ++round) {
    for (int registrars : {1, 2}) {
      for (size_t first_mib : {256, 64}) {
        const double s = registrars_pause(bytes, first_mib << 20, step, registrars, threads, device, stream);
        std::printf("| as uvm, %d fault-in threads | %d | %zu | %.3f | %.1f |\n", threads - registrars, registrars,
                    first_mib, s, gbps(s));
      }
    }
  }
  return 0;
}

int overlap_table(size_t gib, int threads, void* device, cudaStream_t stream) {
  const size_t bytes = gib << 30, step = kStepBytes;
  auto gbps = [&](double s) { return bytes / s / 1e9; };
  print_host();
  std::printf("| stage | wall s | GB/s | CPU s (all threads) |\n|---|---|---|---|\n");
  auto row = [&](const std::string& name, Timed t) {
    std::printf("| %s | %.3f | %.1f | %.2f |\n", name.c_str(), t.wall, gbps(t.wall), t.cpu);
  };
  const std::string n = std::to_string(threads);
  for (int round = 0; round < 2; ++round) {
    char* a = map_huge(bytes);
    row("fault in A alone, touching (" + n + " threads)", timed([&] { fault_in(a, bytes, threads); }));
    munmap(a, bytes);
    a = map_huge(bytes);
    row("fault in A alone, MADV_POPULATE_WRITE (" + n + " threads)", timed([&] { populate(a, bytes, threads); }));
    munmap(a, bytes);
    char* b = map_huge(bytes);
    fault_in(b, bytes, threads);
    row("register B alone, faulted in, 256 MiB steps (1 thread)", timed([&] { register_chunks(b, bytes, step); }));
    unregister_chunks(b, bytes, step);
    for (int faulters : {threads, threads - 1}) {
      a = map_huge(bytes);
      Timed fault{}, reg{};
      const Timed both = timed([&] {
        std::thread f([&] { fault = timed([&] { fault_in(a, bytes, faulters); }); });
        reg = timed([&] { register_chunks(b, bytes, step); });
        f.join();
      });
      const std::string how = "A on " + std::to_string(faulters) + " threads while B registers (separate mappings)";
      row("both: " + how, both);
      row("  of which fault in A", fault);
      row("  of which register B", reg);
      unregister_chunks(b, bytes, step);
      munmap(a, bytes);
    }
    // One mapping: its first half registers while its second half faults in; then the same with
    // each step a kernel mapping (VMA) of its own (MADV_WIPEONFORK on every other step, so that
    // the kernel does not merge them; a change tried in uvm's pinning and not kept).
    for (const bool split : {false, true}) {
      char* c = map_huge(2 * bytes);
      for (size_t at = step; split && at < 2 * bytes; at += 2 * step) {
        madvise(c + at, std::min(step, 2 * bytes - at), MADV_WIPEONFORK);
      }
      fault_in(c, bytes, threads);
      Timed fault{}, reg{};
      const Timed both = timed([&] {
        std::thread f([&] { fault = timed([&] { fault_in(c + bytes, bytes, threads); }); });
        reg = timed([&] { register_chunks(c, bytes, step); });
        f.join();
      });
      row(split ? "both: one mapping, a VMA per step (MADV_WIPEONFORK on every other), first half registers while the second faults in"
                : "both: one mapping, first half registers while the second faults in",
          both);
      row("  of which fault in", fault);
      row("  of which register", reg);
      unregister_chunks(c, bytes, step);
      munmap(c, 2 * bytes);
    }
    {  // does the link slow the kernel's zeroing down, or the zeroing the link?
      register_chunks(b, bytes, step);
      a = map_huge(bytes);
      Timed fault{}, copy{};
      const Timed both = timed([&] {
        std::thread f([&] { fault = timed([&] { fault_in(a, bytes, threads); }); });
        copy = timed([&] {
          for (size_t at = 0; at < bytes; at += step)
            check(cudaMemcpyAsync(b + at, static_cast<char*>(device) + at, step, cudaMemcpyDeviceToHost, stream), "copy");
          check(cudaStreamSynchronize(stream), "sync");
        });
        f.join();
      });
      row("both: A faults in while the link copies into registered B", both);
      row("  of which fault in A", fault);
      row("  of which the copy", copy);
      unregister_chunks(b, bytes, step);
      munmap(a, bytes);
    }
    munmap(b, bytes);
  }
  const char* names[] = {"uvm's steps, copies issued on the registering thread", "a fault-in pool that stays",
                         "the pool, a mapping per step", "the pool, MADV_POPULATE_WRITE",
                         "bounce: pinned ring of 4 steps, the pool copies into fresh pageable memory",
                         "as uvm: a pinning thread registers, the caller copies 32 MiB pieces of each step done"};
  std::printf("\n| whole pause into fresh memory, 256 MiB steps | threads | seconds | GB/s |\n|---|---|---|---|\n");
  for (int round = 0; round < 2; ++round) {
    for (int how = 0; how < 5; ++how) {
      const double s = fresh_pause(how, bytes, step, threads, 4, device, stream);
      std::printf("| %s | %d | %.3f | %.1f |\n", names[how], threads, s, gbps(s));
    }
    const double s = fresh_pause(4, bytes, size_t{64} << 20, threads, 8, device, stream);
    std::printf("| bounce, 64 MiB steps, ring of 8 | %d | %.3f | %.1f |\n", threads, s, gbps(s));
    for (size_t step_mib : {256, 128, 64}) {
      const double as_uvm = fresh_pause(5, bytes, step_mib << 20, threads, 0, device, stream);
      std::printf("| %s, %zu MiB steps | %d | %.3f | %.1f |\n", names[5], step_mib, threads, as_uvm, gbps(as_uvm));
    }
  }
  return 0;
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
  if (argc > 3 && std::string(argv[3]) == "first") return first_offload_table(gib, threads, device, stream);
  if (argc > 3 && std::string(argv[3]) == "wall") return wall_table(gib, threads, device, stream);
  if (argc > 3 && std::string(argv[3]) == "overlap") return overlap_table(gib, threads, device, stream);
  if (argc > 3 && std::string(argv[3]) == "registrars") return registrars_table(gib, threads, device, stream);
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
  // Host memory the driver allocates and pins itself: a pool located on the device's host NUMA node,
  // accessible by the device, that gives everything back when trimmed.
  int numa = 0;
  if (cudaDeviceGetAttribute(&numa, cudaDevAttrHostNumaId, 0) != cudaSuccess || numa < 0) {
    cudaGetLastError();
    numa = 0;
  }
  cudaMemPool_t host_pool = nullptr;
  cudaMemPoolProps props{};
  props.allocType = cudaMemAllocationTypePinned;
  props.location.type = cudaMemLocationTypeHostNuma;
  props.location.id = numa;
  if (cudaMemPoolCreate(&host_pool, &props) == cudaSuccess) {
    cudaMemAccessDesc access{};
    access.location.type = cudaMemLocationTypeDevice;
    access.location.id = 0;
    access.flags = cudaMemAccessFlagsProtReadWrite;
    check(cudaMemPoolSetAccess(host_pool, &access, 1), "cudaMemPoolSetAccess");
  } else {
    std::fprintf(stderr, "cudaMemPoolCreate(host NUMA %d): %s\n", numa, cudaGetErrorName(cudaGetLastError()));
    host_pool = nullptr;
  }
  auto from_host_pool = [&]() -> void* {
    void* p = nullptr;
    if (host_pool == nullptr || cudaMallocFromPoolAsync(&p, bytes, host_pool, stream) != cudaSuccess ||
        cudaStreamSynchronize(stream) != cudaSuccess) {
      cudaGetLastError();
      return nullptr;
    }
    return p;
  };
  auto to_host_pool = [&](void* p) {
    check(cudaFreeAsync(p, stream), "cudaFreeAsync");
    check(cudaMemPoolTrimTo(host_pool, 0), "cudaMemPoolTrimTo");
    check(cudaStreamSynchronize(stream), "sync");
  };
  std::vector<Result> results;
  constexpr size_t kRounds = 2;
  for (size_t round = 0; round < kRounds; ++round) {  // the first round also pays first-touch costs of the driver
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
    results.push_back(measure("pool on host NUMA node " + std::to_string(numa) + " (driver allocates)", bytes, device,
                              stream, from_host_pool, to_host_pool));
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
  const size_t per_round = results.size() / kRounds;
  for (size_t i = 0; i < results.size(); ++i) {
    const Result& r = results[i];
    if (!r.ok) {
      std::printf("| %zu | %s | failed | | | | |\n", i / per_round + 1, r.name.c_str());
      continue;
    }
    std::printf("| %zu | %s | %.3f | %.1f | %.3f | %.1f | %.1f |\n", i / per_round + 1, r.name.c_str(), r.get_s,
                gib / r.get_s, r.free_s, r.d2h_gbps, r.h2d_gbps);
  }
  return 0;
}
