// transfer_probe: measures the raw driver paths uvm's offload/onload can take, on one GPU, so the
// library's choices rest on numbers (issue 4: "onload into discarded pages was erratic: find out
// why"). Not part of the library; built with nvcc by scripts/device_run.sh.
//
//   transfer_probe [total_MiB=4096] [cycles=3] [all|onload|hazard|numa|pipeline]
//                  [hazard: variant indices, e.g. 5,1 | pipeline: pause in seconds after the claim]
//
// Managed total stays at `total_MiB` (the device script passes at most 25 % of the card). For two
// layouts (one allocation; ~190 mixed-size allocations like a torch pool's segments) it prints, per
// cycle, GB/s of each offload and onload path, the time a kernel then takes to read the data (slow
// means it was not on the GPU), and whether the data survived. A "pressure" step between offload and
// onload has a plain cudaMalloc claim the freed memory, as the benchmark does.
#include <cuda_runtime.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <sys/mman.h>
#include <sys/syscall.h>
#include <unistd.h>
#include <string>
#include <thread>
#include <vector>

#define CHECK(call)                                                                      \
  do {                                                                                   \
    cudaError_t e_ = (call);                                                             \
    if (e_ != cudaSuccess) {                                                             \
      std::printf("FAIL %s:%d %s -> %s\n", __FILE__, __LINE__, #call, cudaGetErrorName(e_)); \
      std::exit(1);                                                                      \
    }                                                                                    \
  } while (0)

namespace {

constexpr size_t kMiB = size_t(1) << 20;

__global__ void fill(uint32_t* data, size_t words, uint32_t seed) {
  for (size_t i = blockIdx.x * size_t(blockDim.x) + threadIdx.x; i < words; i += size_t(gridDim.x) * blockDim.x)
    data[i] = uint32_t(i * 2654435761u) ^ seed;
}

__global__ void verify(const uint32_t* data, size_t words, uint32_t seed, unsigned long long* bad) {
  unsigned long long mine = 0;
  for (size_t i = blockIdx.x * size_t(blockDim.x) + threadIdx.x; i < words; i += size_t(gridDim.x) * blockDim.x)
    mine += data[i] != (uint32_t(i * 2654435761u) ^ seed);
  if (mine) atomicAdd(bad, mine);
}

struct Layout {
  std::string name;
  std::vector<char*> bases;
  std::vector<size_t> sizes;
  size_t total = 0;
};

double now_s() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

cudaMemLocation gpu_loc(int device) { return {cudaMemLocationTypeDevice, device}; }
cudaMemLocation cpu_loc() { return {cudaMemLocationTypeHost, 0}; }

Layout make_layout(const std::string& name, const std::vector<size_t>& pattern_mib, size_t total, int device) {
  Layout layout;
  layout.name = name;
  for (size_t i = 0; layout.total < total; ++i) {
    size_t size = std::min(pattern_mib[i % pattern_mib.size()] * kMiB, total - layout.total);
    char* p = nullptr;
    CHECK(cudaMallocManaged(&p, size));
    CHECK(cudaMemAdvise(p, size, cudaMemAdviseSetPreferredLocation, gpu_loc(device)));
    CHECK(cudaMemAdvise(p, size, cudaMemAdviseSetAccessedBy, gpu_loc(device)));
    layout.bases.push_back(p);
    layout.sizes.push_back(size);
    layout.total += size;
  }
  size_t adjacent = 0;
  for (size_t i = 1; i < layout.bases.size(); ++i) {
    const size_t rounded = (layout.sizes[i - 1] + 2 * kMiB - 1) / (2 * kMiB) * (2 * kMiB);
    adjacent += layout.bases[i] == layout.bases[i - 1] + rounded;
    adjacent += layout.bases[i] == layout.bases[i - 1] - ((layout.sizes[i] + 2 * kMiB - 1) / (2 * kMiB) * (2 * kMiB));
  }
  std::printf("layout %s: %zu allocations, %zu MiB, %zu of %zu neighbours adjacent in VA\n", name.c_str(),
              layout.bases.size(), layout.total / kMiB, adjacent, layout.bases.size() - 1);
  return layout;
}

void fill_all(const Layout& l, uint32_t seed) {
  for (size_t i = 0; i < l.bases.size(); ++i)
    fill<<<1024, 256>>>(reinterpret_cast<uint32_t*>(l.bases[i]), l.sizes[i] / 4, seed + uint32_t(i));
  CHECK(cudaDeviceSynchronize());
}

// Returns (mismatched words, seconds the verify kernels took).
std::pair<unsigned long long, double> verify_all(const Layout& l, uint32_t seed, unsigned long long* bad) {
  *bad = 0;
  const double start = now_s();
  for (size_t i = 0; i < l.bases.size(); ++i)
    verify<<<1024, 256>>>(reinterpret_cast<const uint32_t*>(l.bases[i]), l.sizes[i] / 4, seed + uint32_t(i), bad);
  CHECK(cudaDeviceSynchronize());
  return {*bad, now_s() - start};
}

// A plain allocation claims (reported free + 95 % of the offloaded bytes), proving reclaim; freed at once.
bool pressure(size_t offloaded) {
  size_t free_bytes = 0, total = 0;
  CHECK(cudaMemGetInfo(&free_bytes, &total));
  void* p = nullptr;
  cudaError_t e = cudaMalloc(&p, free_bytes + offloaded / 100 * 95);
  if (e != cudaSuccess) {
    cudaGetLastError();
    return false;
  }
  CHECK(cudaMemset(p, 1, 1 << 20));
  CHECK(cudaFree(p));
  return true;
}

struct Path {
  const char* offload_name;
  const char* onload_name;
  std::function<void(const Layout&, char*, cudaStream_t*)> offload;
  std::function<void(const Layout&, char*, cudaStream_t*)> onload;
};

void batch_arrays(const Layout& l, std::vector<void*>* ptrs, std::vector<size_t>* sizes) {
  ptrs->assign(l.bases.begin(), l.bases.end());
  sizes->assign(l.sizes.begin(), l.sizes.end());
}

// A staged offload of the whole layout on `stream`: each allocation copied to its place in
// `staging` (allocations back to back), then one discard of them all. Not synchronized.
void stage_out(const Layout& l, char* staging, cudaStream_t stream) {
  size_t at = 0;
  for (size_t i = 0; i < l.bases.size(); at += l.sizes[i], ++i)
    CHECK(cudaMemcpyAsync(staging + at, l.bases[i], l.sizes[i], cudaMemcpyDefault, stream));
  std::vector<void*> p;
  std::vector<size_t> n;
  batch_arrays(l, &p, &n);
  CHECK(cudaMemDiscardBatchAsync(p.data(), n.data(), p.size(), 0, stream));
}

void run_path(const Layout& l, const Path& path, char* staging, cudaStream_t* streams, int cycles, bool with_pressure,
              int device) {
  unsigned long long* bad = nullptr;
  CHECK(cudaMallocHost(&bad, sizeof(*bad)));
  for (int cycle = 0; cycle < cycles; ++cycle) {
    const uint32_t seed = 1000u * cycle + 7u;
    fill_all(l, seed);
    double t0 = now_s();
    path.offload(l, staging, streams);
    CHECK(cudaDeviceSynchronize());
    const double off_s = now_s() - t0;
    const bool reclaimed = with_pressure ? pressure(l.total) : true;
    t0 = now_s();
    path.onload(l, staging, streams);
    CHECK(cudaDeviceSynchronize());
    const double on_s = now_s() - t0;
    auto [mismatch, read_s] = verify_all(l, seed, bad);
    std::printf("  %-8s %-22s %-30s cycle %d: offload %6.1f GB/s  onload %6.1f GB/s  read-after %7.2f ms  %s%s\n",
                l.name.c_str(), path.offload_name, path.onload_name, cycle, l.total / off_s / 1e9,
                l.total / on_s / 1e9, read_s * 1e3, mismatch ? "DATA MISMATCH" : "ok",
                with_pressure ? (reclaimed ? " reclaimed" : " NOT-reclaimed") : "");
  }
  CHECK(cudaFreeHost(bad));
  (void)device;
}

void probe_cross_allocation(const Layout& l, int device, cudaStream_t stream, char* staging) {
  for (size_t i = 1; i < l.bases.size(); ++i) {
    if (l.bases[i] != l.bases[i - 1] + l.sizes[i - 1]) continue;
    char* p = l.bases[i - 1];
    size_t n = l.sizes[i - 1] + l.sizes[i];
    std::printf("cross-allocation (allocations %zu and %zu adjacent):\n", i - 1, i);
    cudaError_t e = cudaMemPrefetchAsync(p, n, cpu_loc(), 0, stream);
    std::printf("  prefetch to CPU over both: %s\n", cudaGetErrorName(e));
    cudaGetLastError();
    e = cudaMemPrefetchAsync(p, n, gpu_loc(device), 0, stream);
    std::printf("  prefetch to GPU over both: %s\n", cudaGetErrorName(e));
    cudaGetLastError();
    e = cudaMemcpyAsync(staging, p, n, cudaMemcpyDefault, stream);
    std::printf("  memcpy D2H over both: %s\n", cudaGetErrorName(e));
    cudaGetLastError();
    CHECK(cudaStreamSynchronize(stream));
    void* ptrs[1] = {p};
    size_t sizes[1] = {n};
    e = cudaMemDiscardBatchAsync(ptrs, sizes, 1, 0, stream);
    std::printf("  discard over both: %s\n", cudaGetErrorName(e));
    cudaGetLastError();
    e = cudaMemcpyAsync(p, staging, n, cudaMemcpyDefault, stream);
    std::printf("  memcpy H2D over both: %s\n", cudaGetErrorName(e));
    cudaGetLastError();
    CHECK(cudaStreamSynchronize(stream));
    return;
  }
  std::printf("cross-allocation: no adjacent pair in layout %s\n", l.name.c_str());
}


// Host-side count of mismatched 4 KiB pages (one word checked per page; the data must be readable
// from the CPU), and which 64 MiB chunks of the layout hold them.
size_t host_mismatches(const Layout& l, uint32_t seed, std::string* bad_chunks) {
  size_t bad = 0, offset = 0;
  long last_chunk = -1;
  for (size_t i = 0; i < l.bases.size(); ++i) {
    const uint32_t* w = reinterpret_cast<const uint32_t*>(l.bases[i]);
    for (size_t k = 0; k < l.sizes[i] / 4; k += 1024) {
      const uint32_t want = uint32_t(k * 2654435761u) ^ (seed + uint32_t(i));
      if (w[k] == want) continue;
      ++bad;
      const long chunk = long((offset + 4 * k) / (64 * kMiB));
      if (chunk != last_chunk && bad_chunks->size() < 120) *bad_chunks += " " + std::to_string(chunk);
      last_chunk = chunk;
    }
    offset += l.sizes[i];
  }
  return bad;
}

// How staged bytes are copied back in a "hazard" run: per 64 MiB chunk, an optional prefetch to the
// GPU before the copy, the copy, an optional prefetch after it; chunks round-robin over `streams`;
// optionally one prefetch of everything once all copies are done. With threads > 1, that many CPU
// threads issue the chunks (chunk k by thread k % threads, on stream k % streams).
struct CopyBack {
  const char* name;
  bool prefetch_before;
  bool prefetch_after;
  int streams;
  bool prefetch_all_after;
  int threads = 1;
};

// "hazard": a staged cycle, then a migrate cycle of the same bytes. Does the staged onload leave
// the pages in a state where a later prefetch to the CPU loses them? Each copy-back variant runs
// with and without a plain allocation claiming the memory between offload and onload.
void hazard_probe(const Layout& l, int device, char* staging, cudaStream_t* s, int cycles, const std::string& only) {
  const cudaMemLocation gpu = gpu_loc(device), host = cpu_loc();
  std::vector<size_t> at(l.bases.size());
  for (size_t i = 0, o = 0; i < at.size(); ++i) at[i] = o, o += l.sizes[i];
  const size_t chunk = 64 * kMiB;
  auto staged_off = [&] {
    stage_out(l, staging, s[0]);
    CHECK(cudaDeviceSynchronize());
  };
  auto copy_back = [&](const CopyBack& v) {
    auto issue = [&](int thread) {
      size_t k = 0;
      for (size_t i = 0; i < l.bases.size(); ++i)
        for (size_t o = 0; o < l.sizes[i]; o += chunk, ++k) {
          if (int(k % v.threads) != thread) continue;
          char* p = l.bases[i] + o;
          const size_t n = std::min(chunk, l.sizes[i] - o);
          cudaStream_t st = s[k % v.streams];
          if (v.prefetch_before) CHECK(cudaMemPrefetchAsync(p, n, gpu, 0, st));
          CHECK(cudaMemcpyAsync(p, staging + at[i] + o, n, cudaMemcpyDefault, st));
          if (v.prefetch_after) CHECK(cudaMemPrefetchAsync(p, n, gpu, 0, st));
        }
    };
    std::vector<std::thread> threads;
    for (int t = 1; t < v.threads; ++t) threads.emplace_back([&, t] {
      CHECK(cudaSetDevice(device));
      issue(t);
    });
    issue(0);
    for (std::thread& t : threads) t.join();
    CHECK(cudaDeviceSynchronize());
    if (v.prefetch_all_after) {
      for (size_t i = 0; i < l.bases.size(); ++i) CHECK(cudaMemPrefetchAsync(l.bases[i], l.sizes[i], gpu, 0, s[0]));
      CHECK(cudaDeviceSynchronize());
    }
  };
  auto migrate = [&](cudaMemLocation where) {
    for (size_t i = 0; i < l.bases.size(); ++i) CHECK(cudaMemPrefetchAsync(l.bases[i], l.sizes[i], where, 0, s[0]));
    CHECK(cudaDeviceSynchronize());
  };
  const CopyBack variants[] = {
      {"copy", false, false, 4, false},
      {"copy|prefetch-all", false, false, 4, true},
      {"copy,prefetch", false, true, 4, false},
      {"prefetch,copy 1str", true, false, 1, false},
      {"prefetch,copy 4str", true, false, 4, false},
      {"prefetch,copy,prefetch 4str", true, true, 4, false},
      {"prefetch,copy 4str|prefetch-all", true, false, 4, true},
      {"prefetch,copy,prefetch 4str 2thr", true, true, 4, false, 2},
      {"prefetch,copy,prefetch 4str 4thr", true, true, 4, false, 4},
  };
  unsigned long long* bad = nullptr;
  CHECK(cudaMallocHost(&bad, sizeof(*bad)));
  for (bool with_pressure : {false, true})
    for (const CopyBack& v : variants)
      for (int cycle = 0; cycle < cycles; ++cycle) {
        const std::string index = std::to_string(&v - variants);
        if (!only.empty() && ("," + only + ",").find("," + index + ",") == std::string::npos) continue;
        const uint32_t seed = 77u + 1000u * cycle + uint32_t(&v - variants) * 10u;
        fill_all(l, seed);
        staged_off();
        const bool reclaimed = with_pressure ? pressure(l.total) : true;
        if (with_pressure && !v.prefetch_before && !v.prefetch_after) continue;  // faults at 0.6 GB/s
        const double t0 = now_s();
        copy_back(v);
        const double on_gbs = l.total / (now_s() - t0) / 1e9;
        const auto after_staged = verify_all(l, seed, bad).first;
        migrate(host);
        std::string chunks;
        const size_t on_host = host_mismatches(l, seed, &chunks);
        migrate(gpu);
        const auto after_migrate = verify_all(l, seed, bad).first;
        std::printf("  hazard %-5s %-32s %-13s cycle %d: onload %5.1f GB/s; bad words after staged %llu, "
                    "bad pages on host after migrate-off %zu, bad words after migrate-on %llu%s%s\n",
                    l.name.c_str(), v.name, with_pressure ? (reclaimed ? "pressure" : "NOT-reclaimed") : "no-pressure",
                    cycle, on_gbs, after_staged, on_host, after_migrate,
                    (after_staged || on_host || after_migrate) ? "  HAZARD in chunks" : "", chunks.c_str());
      }
  CHECK(cudaFreeHost(bad));
}


// A copy by the SMs instead of a copy engine: each thread reads 16-byte words of pinned host memory
// (mapped through UVA) and writes them to the device.
__global__ void copy_words(uint4* dst, const uint4* src, size_t words) {
  for (size_t i = blockIdx.x * size_t(blockDim.x) + threadIdx.x; i < words; i += size_t(gridDim.x) * blockDim.x)
    dst[i] = src[i];
}

// The same with four loads in flight per thread before any store.
__global__ void copy_words4(uint4* dst, const uint4* src, size_t words) {
  const size_t stride = size_t(gridDim.x) * blockDim.x;
  size_t i = blockIdx.x * size_t(blockDim.x) + threadIdx.x;
  for (; i + 3 * stride < words; i += 4 * stride) {
    const uint4 a = src[i], b = src[i + stride], c = src[i + 2 * stride], d = src[i + 3 * stride];
    dst[i] = a, dst[i + stride] = b, dst[i + 2 * stride] = c, dst[i + 3 * stride] = d;
  }
  for (; i < words; i += stride) dst[i] = src[i];
}

// How a chunk is copied host→device: 0 copy engine, 1 SMs, 2 SMs with 4 loads in flight, 3 copy
// engine for even chunks and SMs (4 loads) for odd ones.
enum CopyKind { kCe, kSm, kSm4, kMix };
const char* copy_name(int how) { return how == kCe ? "ce" : how == kSm ? "sm" : how == kSm4 ? "sm4" : "mix"; }

void sm_copy(void* dst, const void* src, size_t bytes, cudaStream_t stream, bool four) {
  if (four) copy_words4<<<264, 1024, 0, stream>>>(static_cast<uint4*>(dst), static_cast<const uint4*>(src), bytes / 16);
  else copy_words<<<264, 1024, 0, stream>>>(static_cast<uint4*>(dst), static_cast<const uint4*>(src), bytes / 16);
  CHECK(cudaGetLastError());
}

// "pipeline": onload of a staged offload right after a plain allocation claimed and freed the memory
// (the benchmark's cycle), by pipeline shape, against the host→device copy alone in the same window
// (copy engine, SMs), into a plain buffer. `pause_s` sleeps between the free and the onload.
void pipeline_probe(const Layout& l, int device, char* staging, cudaStream_t* s, int cycles, double pause_s) {
  const cudaMemLocation gpu = gpu_loc(device), host = cpu_loc();
  struct Chunk { char* ptr; const char* host; size_t n; };
  std::vector<Chunk> chunks;
  const size_t chunk = 64 * kMiB;
  for (size_t i = 0, at = 0; i < l.bases.size(); at += l.sizes[i], ++i)
    for (size_t o = 0; o < l.sizes[i]; o += chunk) chunks.push_back({l.bases[i] + o, staging + at + o, std::min(chunk, l.sizes[i] - o)});
  auto staged_off = [&] {
    stage_out(l, staging, s[0]);
    CHECK(cudaDeviceSynchronize());
  };
  std::vector<cudaEvent_t> ev(chunks.size() + 8);
  for (auto& e : ev) CHECK(cudaEventCreateWithFlags(&e, cudaEventDisableTiming));
  auto copy = [&](int how, const Chunk& c, cudaStream_t st, size_t k = 0) {
    if (how == kCe || (how == kMix && k % 2 == 0)) CHECK(cudaMemcpyAsync(c.ptr, c.host, c.n, cudaMemcpyDefault, st));
    else sm_copy(c.ptr, c.host, c.n, st, how != kSm);
  };
  // shape: 0 prefetch,copy,prefetch round-robin on 4 streams (uvm today); 1 populate ahead on one
  // stream, copy + prefetch on 3; 2 populate ahead, copies on 3, one prefetch of each chunk at the end;
  // 3 populate everything on 4 streams, wait, then copy + prefetch (the serial bound); 4 no populate:
  // copy (faulting), then prefetch; 5 as 0, populating with cudaMemDiscardAndPrefetchBatchAsync;
  // 6 bounce (below).
  std::vector<double> populate_ms, bounce_alloc_ms;
  const size_t bounce_bytes = std::getenv("PROBE_BOUNCE_MIB") ? std::strtoull(std::getenv("PROBE_BOUNCE_MIB"), nullptr, 10) * kMiB
                                                              : 1024 * kMiB;
  auto onload = [&](int shape, int how) {
    if (shape == 3) {
      const double t = now_s();
      for (size_t k = 0; k < chunks.size(); ++k) CHECK(cudaMemPrefetchAsync(chunks[k].ptr, chunks[k].n, gpu, 0, s[k % 4]));
      CHECK(cudaDeviceSynchronize());
      populate_ms.push_back((now_s() - t) * 1e3);
    }
    if (shape == 3 || shape == 4) {
      for (size_t k = 0; k < chunks.size(); ++k) {
        copy(how, chunks[k], s[k % 4], k);
        CHECK(cudaMemPrefetchAsync(chunks[k].ptr, chunks[k].n, gpu, 0, s[k % 4]));
      }
      return;
    }
    if (shape == 6) {
      // Bounce: the first `bounce_bytes` go host→device into a plain buffer at once (no populate
      // needed), while s[1] populates their pages; each is then copied device→device into place.
      // The rest runs as shape 0 on s[2], s[3].
      const double t = now_s();
      char* bounce = nullptr;
      CHECK(cudaMallocAsync(reinterpret_cast<void**>(&bounce), bounce_bytes, s[0]));
      size_t k = 0, at = 0;
      for (; k < chunks.size() && at + chunks[k].n <= bounce_bytes; at += chunks[k].n, ++k) {
        CHECK(cudaMemcpyAsync(bounce + at, chunks[k].host, chunks[k].n, cudaMemcpyHostToDevice, s[0]));
        CHECK(cudaEventRecord(ev[k], s[0]));
        CHECK(cudaMemPrefetchAsync(chunks[k].ptr, chunks[k].n, gpu, 0, s[1]));
        CHECK(cudaStreamWaitEvent(s[1], ev[k], 0));
        CHECK(cudaMemcpyAsync(chunks[k].ptr, bounce + at, chunks[k].n, cudaMemcpyDeviceToDevice, s[1]));
        CHECK(cudaMemPrefetchAsync(chunks[k].ptr, chunks[k].n, gpu, 0, s[1]));
      }
      bounce_alloc_ms.push_back((now_s() - t) * 1e3);
      for (size_t j = k; j < chunks.size(); ++j) {
        cudaStream_t st = s[2 + j % 2];
        CHECK(cudaMemPrefetchAsync(chunks[j].ptr, chunks[j].n, gpu, 0, st));
        copy(how, chunks[j], st, j);
        CHECK(cudaMemPrefetchAsync(chunks[j].ptr, chunks[j].n, gpu, 0, st));
      }
      CHECK(cudaEventRecord(ev[chunks.size()], s[1]));
      CHECK(cudaStreamWaitEvent(s[0], ev[chunks.size()], 0));
      CHECK(cudaFreeAsync(bounce, s[0]));
      return;
    }
    if (shape == 0 || shape == 5) {
      for (size_t k = 0; k < chunks.size(); ++k) {
        cudaStream_t st = s[k % 4];
        if (shape == 5) {
          void* ptr = chunks[k].ptr;
          size_t n = chunks[k].n, index = 0;
          cudaMemLocation where = gpu;
          CHECK(cudaMemDiscardAndPrefetchBatchAsync(&ptr, &n, 1, &where, &index, 1, 0, st));
        } else {
          CHECK(cudaMemPrefetchAsync(chunks[k].ptr, chunks[k].n, gpu, 0, st));
        }
        copy(how, chunks[k], st, k);
        CHECK(cudaMemPrefetchAsync(chunks[k].ptr, chunks[k].n, gpu, 0, st));
      }
      return;
    }
    for (size_t k = 0; k < chunks.size(); ++k) {
      CHECK(cudaMemPrefetchAsync(chunks[k].ptr, chunks[k].n, gpu, 0, s[0]));
      CHECK(cudaEventRecord(ev[k], s[0]));
    }
    for (size_t k = 0; k < chunks.size(); ++k) {
      cudaStream_t st = s[1 + k % 3];
      CHECK(cudaStreamWaitEvent(st, ev[k], 0));
      copy(how, chunks[k], st, k);
      if (shape == 1) CHECK(cudaMemPrefetchAsync(chunks[k].ptr, chunks[k].n, gpu, 0, st));
    }
    if (shape == 2) {
      for (int i = 1; i < 4; ++i) {
        CHECK(cudaEventRecord(ev[chunks.size() + i], s[i]));
        CHECK(cudaStreamWaitEvent(s[0], ev[chunks.size() + i], 0));
      }
      for (const Chunk& c : chunks) CHECK(cudaMemPrefetchAsync(c.ptr, c.n, gpu, 0, s[0]));
    }
  };
  char* plain = nullptr;
  CHECK(cudaMalloc(&plain, l.total));
  auto pause = [&] { if (pause_s > 0) std::this_thread::sleep_for(std::chrono::duration<double>(pause_s)); };
  // The copy alone, into plain memory, steady and right after a claim.
  for (int how : {kCe, kSm, kSm4})
    for (bool claim : {false, true})
      for (int cycle = 0; cycle < cycles; ++cycle) {
        if (claim) pressure(l.total), pause();
        const double t0 = now_s();
        for (const Chunk& c : chunks) copy(how, Chunk{plain + (c.host - staging), c.host, c.n}, s[0]);
        CHECK(cudaDeviceSynchronize());
        std::printf("  pipeline copy-alone %-4s %-12s cycle %d: %5.1f GB/s\n", copy_name(how),
                    claim ? "after-claim" : "steady", cycle, l.total / (now_s() - t0) / 1e9);
      }
  unsigned long long* bad = nullptr;
  CHECK(cudaMallocHost(&bad, sizeof(*bad)));
  const char* names[] = {"prefetch,copy,prefetch rr4", "populate-ahead, copy+prefetch x3", "populate-ahead, copies x3, prefetch-all",
                         "populate-all|sync|copy,prefetch", "copy (faulting),prefetch", "dap,copy,prefetch rr4",
                         "bounce first GiB, rest rr2"};
  const char* only = std::getenv("PROBE_SHAPES");  // e.g. "0,5": the shapes to run (default all)
  for (int shape : {0, 6, 5, 3, 1, 2, 4})
    for (int how : {kCe, kSm, kSm4, kMix})
      for (int cycle = 0; cycle < cycles; ++cycle) {
        if (only && !std::strchr(only, '0' + shape)) continue;
        if (how == kMix && shape != 0) continue;
        if (shape == 6 && how != kCe) continue;
        if (shape == 4 && cycle > 0) continue;  // faults page by page: one cycle says it
        const uint32_t seed = 500u + 1000u * cycle + 10u * shape + how;
        fill_all(l, seed);
        staged_off();
        const bool reclaimed = pressure(l.total);
        pause();
        const double t0 = now_s();
        onload(shape, how);
        CHECK(cudaDeviceSynchronize());
        const double gbs = l.total / (now_s() - t0) / 1e9;
        const auto after = verify_all(l, seed, bad).first;
        for (size_t i = 0; i < l.bases.size(); ++i) CHECK(cudaMemPrefetchAsync(l.bases[i], l.sizes[i], host, 0, s[0]));
        CHECK(cudaDeviceSynchronize());
        std::string where;
        const size_t lost = host_mismatches(l, seed, &where);
        for (size_t i = 0; i < l.bases.size(); ++i) CHECK(cudaMemPrefetchAsync(l.bases[i], l.sizes[i], gpu, 0, s[0]));
        CHECK(cudaDeviceSynchronize());
        std::printf("  pipeline %-5s %-40s %s cycle %d: onload %5.1f GB/s; bad words %llu, pages lost after migrate %zu%s",
                    l.name.c_str(), names[shape], copy_name(how), cycle, gbs, after, lost,
                    reclaimed ? "" : " NOT-reclaimed");
        if (shape == 6) std::printf(" (bounce part issued in %.2f ms)", bounce_alloc_ms.back());
        if (shape == 3) std::printf(" (populate alone %.1f ms = %.1f GB/s)", populate_ms.back(), l.total / populate_ms.back() / 1e6);
        std::printf("\n");
      }
  // One timed cycle of shape 0 per copy kind, each op bracketed by timing events, written as CSV
  // (chunk, stream, bytes, ms at: populate start, populate end, copy end, prefetch-after end) to the
  // file named by PROBE_TIMELINE.
  if (const char* path = std::getenv("PROBE_TIMELINE")) {
    FILE* csv = std::fopen(path, "a");
    std::vector<cudaEvent_t> marks(4 * chunks.size() + 1);
    for (auto& e : marks) CHECK(cudaEventCreate(&e));
    for (int how : {kCe, kSm4}) {
      fill_all(l, 9);
      staged_off();
      pressure(l.total);
      pause();
      CHECK(cudaEventRecord(marks.back(), s[0]));
      for (int i = 1; i < 4; ++i) CHECK(cudaStreamWaitEvent(s[i], marks.back(), 0));
      for (size_t k = 0; k < chunks.size(); ++k) {
        cudaStream_t st = s[k % 4];
        CHECK(cudaEventRecord(marks[4 * k], st));
        CHECK(cudaMemPrefetchAsync(chunks[k].ptr, chunks[k].n, gpu, 0, st));
        CHECK(cudaEventRecord(marks[4 * k + 1], st));
        copy(how, chunks[k], st, k);
        CHECK(cudaEventRecord(marks[4 * k + 2], st));
        CHECK(cudaMemPrefetchAsync(chunks[k].ptr, chunks[k].n, gpu, 0, st));
        CHECK(cudaEventRecord(marks[4 * k + 3], st));
      }
      CHECK(cudaDeviceSynchronize());
      for (size_t k = 0; k < chunks.size(); ++k) {
        float t[4];
        for (int j = 0; j < 4; ++j) CHECK(cudaEventElapsedTime(&t[j], marks.back(), marks[4 * k + j]));
        std::fprintf(csv, "%s,%.1f,%s,%zu,%zu,%zu,%.3f,%.3f,%.3f,%.3f\n", l.name.c_str(), pause_s, copy_name(how), k,
                     k % 4, chunks[k].n, t[0], t[1], t[2], t[3]);
      }
    }
    for (auto& e : marks) CHECK(cudaEventDestroy(e));
    std::fclose(csv);
  }
  CHECK(cudaFreeHost(bad));
  CHECK(cudaFree(plain));
  for (auto& e : ev) CHECK(cudaEventDestroy(e));
}

// "numa": pinned memcpy speed with the host buffer on each NUMA node (mmap + mbind +
// cudaHostRegister), against the GPU's nearest node. Only plain device memory is used.
void numa_probe(size_t total, int device, cudaStream_t stream, int cycles) {
  int gpu_node = -1;
  if (cudaDeviceGetAttribute(&gpu_node, cudaDevAttrHostNumaId, device) != cudaSuccess) cudaGetLastError();
  std::printf("GPU %d: nearest NUMA node (cudaDevAttrHostNumaId) %d\n", device, gpu_node);
  char* plain = nullptr;
  CHECK(cudaMalloc(&plain, total));
  for (int node = 0; node < 8; ++node) {
    void* host = mmap(nullptr, total, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (host == MAP_FAILED) break;
    unsigned long mask = 1ul << node;
    constexpr int kMpolBind = 2;
    if (syscall(SYS_mbind, host, total, kMpolBind, &mask, sizeof(mask) * 8, 0) != 0) {
      munmap(host, total);
      std::printf("node %d: mbind refused (no such node)\n", node);
      break;
    }
    std::memset(host, 1, total);
    CHECK(cudaHostRegister(host, total, cudaHostRegisterPortable));
    for (int cycle = 0; cycle < cycles; ++cycle) {
      double t0 = now_s();
      CHECK(cudaMemcpyAsync(host, plain, total, cudaMemcpyDeviceToHost, stream));
      CHECK(cudaStreamSynchronize(stream));
      const double out_s = now_s() - t0;
      t0 = now_s();
      CHECK(cudaMemcpyAsync(plain, host, total, cudaMemcpyHostToDevice, stream));
      CHECK(cudaStreamSynchronize(stream));
      std::printf("  pinned on node %d%s cycle %d: out %6.1f GB/s  in %6.1f GB/s\n", node,
                  node == gpu_node ? " (GPU's node)" : "", cycle, total / out_s / 1e9, total / (now_s() - t0) / 1e9);
    }
    CHECK(cudaHostUnregister(host));
    munmap(host, total);
  }
  CHECK(cudaFree(plain));
}

}  // namespace

int main(int argc, char** argv) {
  const size_t total = (argc > 1 ? std::strtoull(argv[1], nullptr, 10) : 4096) * kMiB;
  const int cycles = argc > 2 ? std::atoi(argv[2]) : 3;
  const int device = 0;
  CHECK(cudaSetDevice(device));
  cudaDeviceProp prop{};
  CHECK(cudaGetDeviceProperties(&prop, device));
  int driver = 0, runtime = 0;
  CHECK(cudaDriverGetVersion(&driver));
  CHECK(cudaRuntimeGetVersion(&runtime));
  std::printf("device %s, %zu MiB; driver API %d, runtime %d; managed total %zu MiB\n", prop.name,
              prop.totalGlobalMem / kMiB, driver, runtime, total / kMiB);
  if (total > prop.totalGlobalMem / 4) {
    std::printf("refusing: %zu MiB is above 25%% of the card\n", total / kMiB);
    return 2;
  }
  cudaStream_t streams[4];
  for (auto& s : streams) CHECK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
  if (argc > 3 && std::string(argv[3]) == "numa") {
    numa_probe(total, device, streams[0], cycles);
    return 0;
  }
  char* staging = nullptr;
  double t0 = now_s();
  CHECK(cudaMallocHost(&staging, total));
  std::printf("pinned staging of %zu MiB: %.0f ms to allocate\n", total / kMiB, (now_s() - t0) * 1e3);

  auto offsets = [](const Layout& l) {
    std::vector<size_t> at(l.bases.size());
    size_t o = 0;
    for (size_t i = 0; i < at.size(); ++i) at[i] = o, o += l.sizes[i];
    return at;
  };
  const cudaMemLocation host = cpu_loc(), gpu = gpu_loc(device);

  auto migrate_off = [&](const Layout& l, char*, cudaStream_t* s) {
    for (size_t i = 0; i < l.bases.size(); ++i) CHECK(cudaMemPrefetchAsync(l.bases[i], l.sizes[i], host, 0, s[0]));
  };
  auto migrate_off_advise = [&](const Layout& l, char*, cudaStream_t* s) {
    for (size_t i = 0; i < l.bases.size(); ++i) {
      CHECK(cudaMemAdvise(l.bases[i], l.sizes[i], cudaMemAdviseSetPreferredLocation, host));
      CHECK(cudaMemPrefetchAsync(l.bases[i], l.sizes[i], host, 0, s[0]));
    }
  };
  auto migrate_off_4streams = [&](const Layout& l, char*, cudaStream_t* s) {
    for (size_t i = 0; i < l.bases.size(); ++i) CHECK(cudaMemPrefetchAsync(l.bases[i], l.sizes[i], host, 0, s[i % 4]));
  };
  auto migrate_on = [&](const Layout& l, char*, cudaStream_t* s) {
    for (size_t i = 0; i < l.bases.size(); ++i) {
      CHECK(cudaMemAdvise(l.bases[i], l.sizes[i], cudaMemAdviseSetPreferredLocation, gpu));
      CHECK(cudaMemPrefetchAsync(l.bases[i], l.sizes[i], gpu, 0, s[0]));
    }
  };
  auto staged_off = [&](const Layout& l, char* staging, cudaStream_t* s) { stage_out(l, staging, s[0]); };
  auto staged_off_2streams = [&](const Layout& l, char* staging, cudaStream_t* s) {
    auto at = offsets(l);
    for (size_t i = 0; i < l.bases.size(); ++i)
      CHECK(cudaMemcpyAsync(staging + at[i], l.bases[i], l.sizes[i], cudaMemcpyDefault, s[i % 2]));
    CHECK(cudaStreamSynchronize(s[1]));
    std::vector<void*> p;
    std::vector<size_t> n;
    batch_arrays(l, &p, &n);
    CHECK(cudaMemDiscardBatchAsync(p.data(), n.data(), p.size(), 0, s[0]));
  };
  auto copy_in = [&](const Layout& l, char* staging, cudaStream_t* s) {
    auto at = offsets(l);
    for (size_t i = 0; i < l.bases.size(); ++i)
      CHECK(cudaMemcpyAsync(l.bases[i], staging + at[i], l.sizes[i], cudaMemcpyDefault, s[0]));
  };
  auto populate_then_copy = [&](const Layout& l, char* staging, cudaStream_t* s) {
    std::vector<void*> p;
    std::vector<size_t> n;
    batch_arrays(l, &p, &n);
    cudaMemLocation loc = gpu;
    size_t idx = 0;
    CHECK(cudaMemPrefetchBatchAsync(p.data(), n.data(), p.size(), &loc, &idx, 1, 0, s[0]));
    copy_in(l, staging, s);
  };
  auto discard_prefetch_then_copy = [&](const Layout& l, char* staging, cudaStream_t* s) {
    std::vector<void*> p;
    std::vector<size_t> n;
    batch_arrays(l, &p, &n);
    cudaMemLocation loc = gpu;
    size_t idx = 0;
    CHECK(cudaMemDiscardAndPrefetchBatchAsync(p.data(), n.data(), p.size(), &loc, &idx, 1, 0, s[0]));
    copy_in(l, staging, s);
  };
  auto pipelined = [&](const Layout& l, char* staging, cudaStream_t* s) {
    auto at = offsets(l);
    for (size_t i = 0; i < l.bases.size(); ++i) {
      // 64 MiB pieces: populate a piece, then copy it, alternating two streams.
      for (size_t o = 0; o < l.sizes[i]; o += 64 * kMiB) {
        const size_t n = std::min(64 * kMiB, l.sizes[i] - o);
        cudaStream_t st = s[(o / (64 * kMiB) + i) % 2];
        CHECK(cudaMemPrefetchAsync(l.bases[i] + o, n, gpu, 0, st));
        CHECK(cudaMemcpyAsync(l.bases[i] + o, staging + at[i] + o, n, cudaMemcpyDefault, st));
      }
    }
  };

  // Onload variants that isolate why onload into discarded pages is erratic: which populate call,
  // what granularity, and whether the populate is finished before the copies start.
  double populate_s = 0;
  auto populate_variant = [&](const char* api, size_t chunk, bool sync_between, int nstreams) {
    return [&, api, chunk, sync_between, nstreams](const Layout& l, char* staging, cudaStream_t* s) {
      auto at = offsets(l);
      const std::string which = api;
      std::vector<void*> p;
      std::vector<size_t> n;
      for (size_t i = 0; i < l.bases.size(); ++i)
        for (size_t o = 0; o < l.sizes[i]; o += chunk) p.push_back(l.bases[i] + o), n.push_back(std::min(chunk, l.sizes[i] - o));
      const double t = now_s();
      cudaMemLocation loc = gpu;
      size_t idx = 0;
      if (which == "prefetch") {
        for (size_t k = 0; k < p.size(); ++k) CHECK(cudaMemPrefetchAsync(p[k], n[k], gpu, 0, s[k % nstreams]));
      } else if (which == "batch") {
        CHECK(cudaMemPrefetchBatchAsync(p.data(), n.data(), p.size(), &loc, &idx, 1, 0, s[0]));
      } else if (which == "dap") {
        CHECK(cudaMemDiscardAndPrefetchBatchAsync(p.data(), n.data(), p.size(), &loc, &idx, 1, 0, s[0]));
      }
      if (sync_between) {
        CHECK(cudaDeviceSynchronize());
        populate_s = now_s() - t;
      }
      if (which == "interleaved") {
        size_t k = 0;
        for (size_t i = 0; i < l.bases.size(); ++i)
          for (size_t o = 0; o < l.sizes[i]; o += chunk, ++k) {
            CHECK(cudaMemPrefetchAsync(p[k], n[k], gpu, 0, s[k % nstreams]));
            CHECK(cudaMemcpyAsync(p[k], staging + at[i] + o, n[k], cudaMemcpyDefault, s[k % nstreams]));
          }
        return;
      }
      if (!sync_between && nstreams > 1)
        for (int k = 1; k < nstreams; ++k) {
          cudaEvent_t ev;
          CHECK(cudaEventCreateWithFlags(&ev, cudaEventDisableTiming));
          CHECK(cudaEventRecord(ev, s[k]));
          CHECK(cudaStreamWaitEvent(s[0], ev));
          CHECK(cudaEventDestroy(ev));
        }
      size_t k = 0;
      for (size_t i = 0; i < l.bases.size(); ++i)
        for (size_t o = 0; o < l.sizes[i]; o += chunk, ++k)
          CHECK(cudaMemcpyAsync(p[k], staging + at[i] + o, n[k], cudaMemcpyDefault, s[0]));
    };
  };
  const size_t whole = size_t(1) << 40;
  const std::vector<Path> onload_paths = {
      {"staged", "prefetch,copy", staged_off, populate_variant("prefetch", whole, false, 1)},
      {"staged", "prefetch|sync|copy", staged_off, populate_variant("prefetch", whole, true, 1)},
      {"staged", "batch|sync|copy", staged_off, populate_variant("batch", whole, true, 1)},
      {"staged", "dap|sync|copy", staged_off, populate_variant("dap", whole, true, 1)},
      {"staged", "prefetch64M,copy", staged_off, populate_variant("prefetch", 64 * kMiB, false, 1)},
      {"staged", "prefetch64M|sync|copy", staged_off, populate_variant("prefetch", 64 * kMiB, true, 1)},
      {"staged", "batch64M|sync|copy", staged_off, populate_variant("batch", 64 * kMiB, true, 1)},
      {"staged", "prefetch64M-4str|sync|copy", staged_off, populate_variant("prefetch", 64 * kMiB, true, 4)},
      {"staged", "interleaved64M-1str", staged_off, populate_variant("interleaved", 64 * kMiB, false, 1)},
      {"staged", "interleaved64M-2str", staged_off, populate_variant("interleaved", 64 * kMiB, false, 2)},
      {"staged", "interleaved16M-2str", staged_off, populate_variant("interleaved", 16 * kMiB, false, 2)},
  };
  const bool onload_only = argc > 3 && std::string(argv[3]) == "onload";
  const bool hazard_only = argc > 3 && std::string(argv[3]) == "hazard";
  const bool pipeline_only = argc > 3 && std::string(argv[3]) == "pipeline";

  const std::vector<Path> all_paths = {
      {"migrate", "migrate", migrate_off, migrate_on},
      {"migrate+advise-cpu", "migrate", migrate_off_advise, migrate_on},
      {"migrate-4streams", "migrate", migrate_off_4streams, migrate_on},
      {"staged", "copy-into-discarded", staged_off, copy_in},
      {"staged", "populate-batch+copy", staged_off, populate_then_copy},
      {"staged", "discard&prefetch+copy", staged_off, discard_prefetch_then_copy},
      {"staged", "pipelined-64MiB-2str", staged_off, pipelined},
      {"staged-2streams", "populate-batch+copy", staged_off_2streams, populate_then_copy},
  };

  const std::vector<Path>& paths = onload_only ? onload_paths : all_paths;

  // Pinned memcpy of the same bytes: the limit.
  {
    char* plain = nullptr;
    CHECK(cudaMalloc(&plain, total));
    for (int cycle = 0; cycle < cycles; ++cycle) {
      t0 = now_s();
      CHECK(cudaMemcpyAsync(staging, plain, total, cudaMemcpyDeviceToHost, streams[0]));
      CHECK(cudaStreamSynchronize(streams[0]));
      const double out_s = now_s() - t0;
      t0 = now_s();
      CHECK(cudaMemcpyAsync(plain, staging, total, cudaMemcpyHostToDevice, streams[0]));
      CHECK(cudaStreamSynchronize(streams[0]));
      std::printf("  pinned memcpy cycle %d: out %6.1f GB/s  in %6.1f GB/s\n", cycle, total / out_s / 1e9,
                  total / (now_s() - t0) / 1e9);
    }
    CHECK(cudaFree(plain));
  }

  const std::vector<std::pair<std::string, std::vector<size_t>>> layouts = {
      {"one", {total / kMiB}},
      {"mixed", {32, 22, 20, 2, 44, 8}},
  };
  for (const auto& [name, pattern] : layouts) {
    Layout l = make_layout(name, pattern, total, device);
    fill_all(l, 1);
    if (pipeline_only) {
      pipeline_probe(l, device, staging, streams, cycles, argc > 4 ? std::atof(argv[4]) : 0.0);
      for (char* p : l.bases) CHECK(cudaFree(p));
      continue;
    }
    if (hazard_only) {
      hazard_probe(l, device, staging, streams, cycles, argc > 4 ? argv[4] : "");
      for (char* p : l.bases) CHECK(cudaFree(p));
      continue;
    }
    probe_cross_allocation(l, device, streams[0], staging);
    for (bool with_pressure : {false, true}) {
      std::printf("%s pressure step:\n", with_pressure ? "with" : "without");
      for (const Path& path : paths) {
        populate_s = 0;
        run_path(l, path, staging, streams, cycles, with_pressure, device);
        if (populate_s > 0) std::printf("    (last cycle's populate alone: %.1f ms)\n", populate_s * 1e3);
      }
    }
    for (char* p : l.bases) CHECK(cudaFree(p));
  }
  CHECK(cudaFreeHost(staging));
  std::printf("probe done\n");
  return 0;
}
