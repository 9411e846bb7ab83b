// Compressed backups against plain copies, on every GPU at once and on GPU 0 alone: how fast a
// backup of bf16 weights leaves the device and comes back (GB/s of the weights' bytes, so a smaller
// stored size counts as speed) and how much host memory it takes.
//
//   codec_bench [--gib 4] [--reps 3] [--out results.json]
//
// Each GPU holds --gib GiB of bf16 weights in plain device memory (cudaMalloc: no managed memory),
// tensors of a Llama-style model's scales (projections 0.02, norms and embeddings 1, a head 0.002),
// drawn once on the host (64 MiB) and laid out over and over. Per GPU, one thread: pinned host
// memory for a plain backup and for a compressed one; at every step all threads start together
// (a barrier) and the step's time is the slowest thread's. Steps: plain copy out
// (cudaMemcpyAsync), plain copy in, compress_to_host, decompress_from_host, and the coder alone
// into device memory (compress_on_device: what bench/nvcomp_compare.py sets nvCOMP's coders
// beside); after the last, the bytes are checked against the weights.
#include <cuda_runtime_api.h>

#include <algorithm>
#include <chrono>
#include <condition_variable>
#include <cstdio>
#include <cstring>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "../offload/codec.hpp"
#include "../offload/compress.hpp"
#include "codec_data.hpp"

namespace {

namespace codec = uvm::codec;

class Barrier {
 public:
  explicit Barrier(int count) : count_(count) {}
  void wait() {
    std::unique_lock<std::mutex> lock(mutex_);
    const int generation = generation_;
    if (++waiting_ == count_) {
      waiting_ = 0;
      ++generation_;
      changed_.notify_all();
      return;
    }
    changed_.wait(lock, [&] { return generation != generation_; });
  }

 private:
  std::mutex mutex_;
  std::condition_variable changed_;
  int count_, waiting_ = 0, generation_ = 0;
};

const char* const kSteps[] = {"plain out", "plain in", "compressed out", "compressed in", "coder on device"};
constexpr int kStepCount = 5;

bool check(cudaError_t e, const char* what, int device) {
  if (e == cudaSuccess) return true;
  std::fprintf(stderr, "device %d: %s: %s\n", device, what, cudaGetErrorName(e));
  return false;
}

struct Rank {
  std::vector<std::vector<double>> seconds = std::vector<std::vector<double>>(kStepCount);
  size_t stored = 0;
  bool identical = false;
  bool ok = false;
};

void run_rank(int device, size_t bytes, int reps, const codec_data::Bytes& pattern, Barrier& barrier, Rank* out) {
  bool ok = check(cudaSetDevice(device), "cudaSetDevice", device);
  uint8_t *weights = nullptr, *plain = nullptr, *packed = nullptr, *coded = nullptr;
  size_t stored_on_device = 0;
  cudaStream_t stream = nullptr;
  ok = ok && check(cudaMalloc(reinterpret_cast<void**>(&weights), bytes), "cudaMalloc", device) &&
       check(cudaMalloc(reinterpret_cast<void**>(&coded), bytes), "cudaMalloc", device) &&
       check(cudaHostAlloc(reinterpret_cast<void**>(&plain), bytes, cudaHostAllocDefault), "cudaHostAlloc", device) &&
       check(cudaHostAlloc(reinterpret_cast<void**>(&packed), bytes, cudaHostAllocDefault), "cudaHostAlloc", device) &&
       check(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking), "cudaStreamCreate", device);
  for (size_t at = 0; ok && at < bytes; at += pattern.size()) {
    ok = check(cudaMemcpy(weights + at, pattern.data(), std::min(pattern.size(), bytes - at), cudaMemcpyHostToDevice),
               "cudaMemcpy", device);
  }
  std::vector<uint8_t> flags(codec::chunks_in(bytes));
  const uvm::Call call = uvm::Call::of("codec_bench");
  for (int rep = 0; rep < reps; ++rep) {
    for (int step = 0; step < kStepCount; ++step) {
      barrier.wait();  // every thread takes part in every step, failed or not, so none waits for ever
      const auto start = std::chrono::steady_clock::now();
      if (ok) {
        switch (step) {
          case 0:
            ok = check(cudaMemcpyAsync(plain, weights, bytes, cudaMemcpyDeviceToHost, stream), "copy out", device);
            break;
          case 1:
            ok = check(cudaMemcpyAsync(weights, plain, bytes, cudaMemcpyHostToDevice, stream), "copy in", device);
            break;
          case 2:
            ok = uvm::compress_to_host(call, device, weights, bytes, packed, flags.data(), &out->stored, stream) == UVM_OK;
            break;
          case 3:
            ok = uvm::decompress_from_host(call, device, packed, flags.data(), bytes, weights, stream) == UVM_OK;
            break;
          case 4:
            ok = uvm::compress_on_device(call, device, weights, bytes, coded, flags.data(), &stored_on_device, stream) == UVM_OK;
            break;
        }
        ok = ok && check(cudaStreamSynchronize(stream), "cudaStreamSynchronize", device);
        if (!ok && step >= 2) std::fprintf(stderr, "device %d: %s\n", device, uvm_last_error());
      }
      out->seconds[step].push_back(std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count());
    }
  }
  if (ok) {
    ok = check(cudaMemcpy(plain, weights, bytes, cudaMemcpyDeviceToHost), "cudaMemcpy", device);
    out->identical = ok;
    for (size_t at = 0; ok && at < bytes; at += pattern.size()) {
      out->identical = out->identical && std::memcmp(plain + at, pattern.data(), std::min(pattern.size(), bytes - at)) == 0;
    }
  }
  out->ok = ok;
  cudaFree(weights);
  cudaFree(coded);
  cudaFreeHost(plain);
  cudaFreeHost(packed);
  if (stream) cudaStreamDestroy(stream);
}

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

}  // namespace

int main(int argc, char** argv) {
  double gib = 4;
  int reps = 3;
  std::string out_path = "codec_bench.json";
  for (int i = 1; i + 1 < argc; i += 2) {
    const std::string flag = argv[i];
    if (flag == "--gib") gib = std::stod(argv[i + 1]);
    else if (flag == "--reps") reps = std::stoi(argv[i + 1]);
    else if (flag == "--out") out_path = argv[i + 1];
    else return std::fprintf(stderr, "unknown argument %s\n", argv[i]), 2;
  }
  int devices = 0;
  if (cudaGetDeviceCount(&devices) != cudaSuccess || devices == 0) {
    std::printf("codec_bench: no CUDA device is present\n");
    return 1;
  }
  const size_t bytes = static_cast<size_t>(gib * (1 << 30)) / codec::kChunkBytes * codec::kChunkBytes;
  // 64 MiB of weights: 8 tensors of 8 MiB at a Llama-style model's scales.
  codec_data::Bytes pattern(size_t{64} << 20);
  const float scales[] = {0.02f, 0.02f, 0.02f, 1.0f, 0.02f, 0.05f, 0.002f, 0.02f};
  for (size_t i = 0; i < 8; ++i) {
    const codec_data::Bytes part = codec_data::gaussian_bf16(size_t{8} << 20, static_cast<unsigned>(i + 1), scales[i]);
    std::copy(part.begin(), part.end(), pattern.begin() + i * (size_t{8} << 20));
  }
  cudaDeviceProp properties{};
  cudaGetDeviceProperties(&properties, 0);
  int driver = 0, runtime = 0;
  cudaDriverGetVersion(&driver);
  cudaRuntimeGetVersion(&runtime);
  FILE* json = std::fopen(out_path.c_str(), "w");
  if (json == nullptr) return std::fprintf(stderr, "cannot write %s\n", out_path.c_str()), 1;
  std::fprintf(json, "{\"device\": \"%s\", \"devices\": %d, \"driver\": %d, \"runtime\": %d, \"gib_per_gpu\": %g, "
               "\"reps\": %d, \"runs\": [", properties.name, devices, driver, runtime, gib, reps);
  bool all_ok = true;
  std::vector<int> counts = {devices};
  if (devices > 1) counts.push_back(1);
  for (size_t r = 0; r < counts.size(); ++r) {
    const int count = counts[r];
    std::vector<Rank> ranks(count);
    Barrier barrier(count);
    std::vector<std::thread> threads;
    for (int d = 0; d < count; ++d) {
      threads.emplace_back(run_rank, d, bytes, reps, std::cref(pattern), std::ref(barrier), &ranks[d]);
    }
    for (auto& t : threads) t.join();
    bool ok = true, identical = true;
    for (const Rank& rank : ranks) ok = ok && rank.ok, identical = identical && rank.identical;
    all_ok = all_ok && ok && identical;
    std::fprintf(json, "%s{\"gpus\": %d, \"ok\": %s, \"identical\": %s, \"stored_ratio\": %.6f",
                 r ? ", " : "", count, ok ? "true" : "false", identical ? "true" : "false",
                 static_cast<double>(ranks[0].stored) / bytes);
    std::printf("%d GPUs (%g GiB each): stored %.4f of the bytes, identical %s\n", count, gib,
                static_cast<double>(ranks[0].stored) / bytes, identical ? "yes" : "NO");
    for (int step = 0; step < kStepCount; ++step) {
      std::vector<double> node;  // per rep: the slowest thread
      for (int rep = 0; rep < reps; ++rep) {
        double slowest = 0;
        for (const Rank& rank : ranks) slowest = std::max(slowest, rank.seconds[step][rep]);
        node.push_back(slowest);
      }
      const double gbps = count * static_cast<double>(bytes) / median(node) / 1e9;
      std::fprintf(json, ", \"%s_gbps\": %.2f, \"%s_s\": [", kSteps[step], gbps, kSteps[step]);
      for (int rep = 0; rep < reps; ++rep) std::fprintf(json, "%s%.5f", rep ? ", " : "", node[rep]);
      std::fprintf(json, "]");
      std::printf("  %-15s %7.1f GB/s of weights (all %d GPUs)\n", kSteps[step], gbps, count);
    }
    std::fprintf(json, "}");
  }
  std::fprintf(json, "]}\n");
  std::fclose(json);
  return all_ok ? 0 : 1;
}
