// Compressed backups against plain copies, on every GPU at once and on GPU 0 alone: how fast a
// backup of bf16 weights leaves the device and comes back (GB/s of the weights' bytes, so a smaller
// stored size counts as speed) and how much host memory it takes.
//
//   codec_bench [--gib 4] [--reps 3] [--data bf16] [--out results.json]
//
// Each GPU holds --gib GiB of weights in plain device memory (cudaMalloc: no managed memory), drawn
// once on the host (64 MiB) and laid out over and over. --data says which: bf16 (the default) and
// fp16, tensors of a Llama-style model's scales (projections 0.02, norms and embeddings 1, a head
// 0.002); and data the coder cannot shrink, where what it costs shows: fp32 (normal, std 0.02), int8
// (normal values quantized at 32 steps per standard deviation), fp8 (e4m3, normal, std 1) and random
// bytes. Per GPU, one thread: pinned host
// memory for a plain backup and for a compressed one; at every step all threads start together
// (a barrier) and the step's time is the slowest thread's. Steps: plain copy out
// (cudaMemcpyAsync), plain copy in, compress_to_host, decompress_from_host, and the coder alone
// into device memory (compress_on_device: what bench/nvcomp_compare.py sets nvCOMP's coders
// beside); after the last, the bytes are checked against the weights.
#include <cuda_runtime_api.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <condition_variable>
#include <cstdio>
#include <cstring>
#include <mutex>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "../offload/coder/codec.hpp"
#include "../offload/coder/compress.hpp"
#include "codec_data.hpp"

namespace {

namespace codec = uvm::codec;

// IEEE half of a float, rounded to nearest even (normal range; smaller values flush to zero).
uint16_t half_of(float value) {
  uint32_t bits;
  std::memcpy(&bits, &value, 4);
  const uint32_t sign = (bits >> 16) & 0x8000u;
  const int exponent = static_cast<int>((bits >> 23) & 0xFF) - 127 + 15;
  if (exponent <= 0) return static_cast<uint16_t>(sign);
  if (exponent >= 31) return static_cast<uint16_t>(sign | 0x7C00u);
  uint32_t mantissa = bits & 0x7FFFFFu;
  uint32_t half = sign | (static_cast<uint32_t>(exponent) << 10) | (mantissa >> 13);
  const uint32_t rest = mantissa & 0x1FFFu;
  if (rest > 0x1000u || (rest == 0x1000u && (half & 1u))) ++half;
  return static_cast<uint16_t>(half);
}

// fp8 e4m3 of a float (bias 7, no infinities, saturating at 448), rounded to nearest.
uint8_t e4m3_of(float value) {
  const uint8_t sign = value < 0 ? 0x80 : 0;
  float magnitude = std::min(std::fabs(value), 448.0f);
  if (magnitude < 1.0f / 512) return sign;
  int exponent = 0;
  const float fraction = std::frexp(magnitude, &exponent);  // magnitude = fraction * 2^exponent, fraction in [0.5, 1)
  int biased = exponent - 1 + 7;
  if (biased < 1) return static_cast<uint8_t>(sign | std::lround(magnitude * 512));  // subnormal: steps of 2^-9
  int mantissa = static_cast<int>(std::lround((fraction * 2 - 1) * 8));
  if (mantissa == 8) mantissa = 0, ++biased;
  if (biased > 15 || (biased == 15 && mantissa > 6)) biased = 15, mantissa = 6;
  return static_cast<uint8_t>(sign | (biased << 3) | mantissa);
}

// 64 MiB of --data's kind (see the top of this file); empty for an unknown kind.
codec_data::Bytes pattern_of(const std::string& kind) {
  const size_t bytes = size_t{64} << 20;
  codec_data::Bytes pattern(bytes);
  const float scales[] = {0.02f, 0.02f, 0.02f, 1.0f, 0.02f, 0.05f, 0.002f, 0.02f};
  std::mt19937 rng(7);
  if (kind == "bf16") {
    for (size_t i = 0; i < 8; ++i) {  // 8 tensors of 8 MiB at a Llama-style model's scales
      const codec_data::Bytes part = codec_data::gaussian_bf16(bytes / 8, static_cast<unsigned>(i + 1), scales[i]);
      std::copy(part.begin(), part.end(), pattern.begin() + i * (bytes / 8));
    }
  } else if (kind == "fp16") {
    for (size_t i = 0; i < bytes / 2; ++i) {
      std::normal_distribution<float> normal(0.0f, scales[i / (bytes / 16)]);
      codec_data::put_word(pattern, i, half_of(normal(rng)));
    }
  } else if (kind == "fp32") {
    pattern = codec_data::gaussian_fp32(bytes, 7);
  } else if (kind == "int8") {
    std::normal_distribution<float> normal(0.0f, 32.0f);
    for (auto& b : pattern) b = static_cast<uint8_t>(static_cast<int8_t>(std::clamp(std::lround(normal(rng)), -127L, 127L)));
  } else if (kind == "fp8") {
    std::normal_distribution<float> normal(0.0f, 1.0f);
    for (auto& b : pattern) b = e4m3_of(normal(rng));
  } else if (kind == "random") {
    pattern = codec_data::random_bytes(bytes, 7);
  } else {
    pattern.clear();
  }
  return pattern;
}

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
  std::string data = "bf16";
  for (int i = 1; i + 1 < argc; i += 2) {
    const std::string flag = argv[i];
    if (flag == "--gib") gib = std::stod(argv[i + 1]);
    else if (flag == "--reps") reps = std::stoi(argv[i + 1]);
    else if (flag == "--out") out_path = argv[i + 1];
    else if (flag == "--data") data = argv[i + 1];
    else return std::fprintf(stderr, "unknown argument %s\n", argv[i]), 2;
  }
  int devices = 0;
  if (cudaGetDeviceCount(&devices) != cudaSuccess || devices == 0) {
    std::printf("codec_bench: no CUDA device is present\n");
    return 1;
  }
  const size_t bytes = static_cast<size_t>(gib * (1 << 30)) / codec::kChunkBytes * codec::kChunkBytes;
  const codec_data::Bytes pattern = pattern_of(data);
  if (pattern.empty()) return std::fprintf(stderr, "--data %s: use bf16, fp16, fp32, int8, fp8 or random\n", data.c_str()), 2;
  cudaDeviceProp properties{};
  cudaGetDeviceProperties(&properties, 0);
  int driver = 0, runtime = 0;
  cudaDriverGetVersion(&driver);
  cudaRuntimeGetVersion(&runtime);
  FILE* json = std::fopen(out_path.c_str(), "w");
  if (json == nullptr) return std::fprintf(stderr, "cannot write %s\n", out_path.c_str()), 1;
  std::fprintf(json, "{\"data\": \"%s\", \"device\": \"%s\", \"devices\": %d, \"driver\": %d, \"runtime\": %d, \"gib_per_gpu\": %g, "
               "\"reps\": %d, \"runs\": [", data.c_str(), properties.name, devices, driver, runtime, gib, reps);
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
    std::printf("%s, %d GPUs (%g GiB each): stored %.4f of the bytes, identical %s\n", data.c_str(), count, gib,
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
