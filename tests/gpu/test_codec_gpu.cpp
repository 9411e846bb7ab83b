// The compressed backups' GPU kernels (offload/coder/codec_kernels.cu, as PTX) against the reference coder
// (offload/coder/codec.hpp): the same flags and the same stored bytes, byte for byte, and every bit back
// after the round trip, on weights and on data that does not pay (kept raw chunk by chunk). Plain
// device memory only (cudaMalloc): no managed memory.
#include <cuda_runtime_api.h>

#include <algorithm>
#include <cstring>
#include <string>
#include <vector>

#include "../../offload/coder/codec.hpp"
#include "../../offload/coder/compress.hpp"
#include "codec_data.hpp"
#include "gpu_support.hpp"

namespace {

namespace codec = uvm::codec;
using codec_data::Bytes;

// Weights of several scales back to back, each kind of hard data, a chunk that does not pay in
// each batch, and a tail.
std::vector<std::pair<std::string, Bytes>> cases(size_t bytes) {
  std::vector<std::pair<std::string, Bytes>> all;
  Bytes mixed = codec_data::gaussian_bf16(bytes, 1);
  const Bytes scaled = codec_data::gaussian_bf16(bytes / 4, 2, 1.0f);
  std::copy(scaled.begin(), scaled.end(), mixed.begin() + bytes / 2);
  const Bytes noise = codec_data::random_bytes(codec::kChunkBytes, 3);
  std::copy(noise.begin(), noise.end(), mixed.begin() + 5 * codec::kChunkBytes);
  std::copy(noise.begin(), noise.end(), mixed.begin() + (uvm::kCodecBatchChunks + 1) * codec::kChunkBytes);
  all.emplace_back("bf16 weights of two scales, two chunks of noise", mixed);
  all.emplace_back("random bytes", codec_data::random_bytes(bytes, 4));
  all.emplace_back("all zero", Bytes(bytes, 0));
  all.emplace_back("NaNs, infinities, zeros and denormals", codec_data::special_values(bytes));
  all.emplace_back("fp32 weights", codec_data::gaussian_fp32(bytes, 5));
  return all;
}

}  // namespace

TEST_CASE("the GPU coder writes the reference's bytes and brings every bit back", "[codec]") {
  const uvm::Call call = uvm::Call::of("test");
  const size_t bytes = (uvm::kCodecBatchChunks + 3) * codec::kChunkBytes + 4098;
  const size_t guard = 1 << 20;
  cudaStream_t stream = nullptr;
  REQUIRE(cudaStreamCreate(&stream) == cudaSuccess);
  uint8_t* device = nullptr;
  REQUIRE(cudaMalloc(reinterpret_cast<void**>(&device), bytes + 2 * guard) == cudaSuccess);
  Bytes host(bytes), flags(codec::chunks_in(bytes)), expected(bytes), expected_flags(flags.size());
  Bytes back(bytes + 2 * guard);
  for (const auto& [name, raw] : cases(bytes)) {
    INFO(name);
    REQUIRE(cudaMemset(device, 0xA5, bytes + 2 * guard) == cudaSuccess);
    REQUIRE(cudaMemcpy(device + guard, raw.data(), bytes, cudaMemcpyHostToDevice) == cudaSuccess);
    size_t stored = 0;
    const uvm_status compressed = uvm::compress_to_host(call, 0, device + guard, bytes, host.data(), flags.data(),
                                                        &stored, stream);
    INFO(uvm_last_error());
    REQUIRE(compressed == UVM_OK);
    const size_t reference = codec::compress(raw.data(), bytes, expected_flags.data(), expected.data());
    CHECK(codec_data::first_difference(flags, expected_flags) == SIZE_MAX);
    REQUIRE(stored == reference);
    CHECK(std::memcmp(host.data(), expected.data(), stored) == 0);
    // The coder alone, into device memory: the same bytes.
    size_t stored_on_device = 0;
    uint8_t* coded = nullptr;
    REQUIRE(cudaMalloc(reinterpret_cast<void**>(&coded), bytes) == cudaSuccess);
    REQUIRE(uvm::compress_on_device(call, 0, device + guard, bytes, coded, flags.data(), &stored_on_device, stream) == UVM_OK);
    CHECK(stored_on_device == stored);
    Bytes on_device(stored);
    REQUIRE(cudaMemcpy(on_device.data(), coded, stored, cudaMemcpyDeviceToHost) == cudaSuccess);
    CHECK(std::memcmp(on_device.data(), expected.data(), stored) == 0);
    REQUIRE(cudaFree(coded) == cudaSuccess);
    // Back into the same bytes, wiped, between neighbours that must not change.
    REQUIRE(cudaMemset(device + guard, 0, bytes) == cudaSuccess);
    const uvm_status decompressed = uvm::decompress_from_host(call, 0, host.data(), flags.data(), bytes,
                                                              device + guard, stream);
    INFO(uvm_last_error());
    REQUIRE(decompressed == UVM_OK);
    REQUIRE(cudaMemcpy(back.data(), device, bytes + 2 * guard, cudaMemcpyDeviceToHost) == cudaSuccess);
    CHECK(std::memcmp(back.data() + guard, raw.data(), bytes) == 0);
    CHECK(std::all_of(back.begin(), back.begin() + guard, [](uint8_t b) { return b == 0xA5; }));
    CHECK(std::all_of(back.end() - guard, back.end(), [](uint8_t b) { return b == 0xA5; }));
    CHECK(cudaPeekAtLastError() == cudaSuccess);
  }
  REQUIRE(cudaFree(device) == cudaSuccess);
  REQUIRE(cudaStreamDestroy(stream) == cudaSuccess);
}

TEST_CASE("a model's worth of bf16 weights comes back bit for bit at 0.72 of its bytes", "[codec]") {
  const uvm::Call call = uvm::Call::of("test");
  const size_t bytes = size_t{256} << 20;
  Bytes raw(bytes);
  // Tensors of 8 MiB at the scales of a Llama-style model's (projections, norms, embeddings, head).
  const float scales[] = {0.02f, 0.02f, 0.02f, 1.0f, 0.02f, 0.05f, 0.002f, 0.02f};
  for (size_t at = 0, i = 0; at < bytes; at += 8 << 20, ++i) {
    const Bytes part = codec_data::gaussian_bf16(8 << 20, static_cast<unsigned>(100 + i), scales[i % 8]);
    std::copy(part.begin(), part.end(), raw.begin() + at);
  }
  uint8_t* device = nullptr;
  REQUIRE(cudaMalloc(reinterpret_cast<void**>(&device), bytes) == cudaSuccess);
  REQUIRE(cudaMemcpy(device, raw.data(), bytes, cudaMemcpyHostToDevice) == cudaSuccess);
  Bytes host(bytes), flags(codec::chunks_in(bytes));
  size_t stored = 0;
  REQUIRE(uvm::compress_to_host(call, 0, device, bytes, host.data(), flags.data(), &stored, nullptr) == UVM_OK);
  CHECK(stored == codec::chunks_in(bytes) * codec::kCodedBytes);
  REQUIRE(cudaMemset(device, 0, bytes) == cudaSuccess);
  REQUIRE(uvm::decompress_from_host(call, 0, host.data(), flags.data(), bytes, device, nullptr) == UVM_OK);
  Bytes back(bytes);
  REQUIRE(cudaMemcpy(back.data(), device, bytes, cudaMemcpyDeviceToHost) == cudaSuccess);
  CHECK(codec_data::first_difference(back, raw) == SIZE_MAX);
  REQUIRE(cudaFree(device) == cudaSuccess);
}
