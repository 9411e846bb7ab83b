// The compressed backups' format (offload/coder/codec.hpp) and its device path (offload/coder/compress.hpp),
// against the fake driver, whose coder kernels run the reference coder. Lossless on every kind of
// data: whatever does not pay is kept raw, chunk by chunk. The GPU kernels are held to the same bytes
// by tests/gpu/test_codec_gpu.cpp.
#include <algorithm>
#include <cmath>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "../../offload/coder/codec.hpp"
#include "../../offload/coder/compress.hpp"
#include "codec_data.hpp"
#include "fixture.hpp"

namespace {

namespace codec = uvm::codec;
using codec_data::Bytes;
using codec_data::first_difference;
using codec_data::gaussian_bf16;
using codec_data::put_word;
using codec_data::random_bytes;


struct Coded {
  Bytes flags;
  Bytes stored;
};

Coded compress(const Bytes& raw) {
  Coded coded{Bytes(codec::chunks_in(raw.size())), Bytes(raw.size())};
  const size_t stored = codec::compress(raw.data(), raw.size(), coded.flags.data(), coded.stored.data());
  REQUIRE(stored == codec::compressed_bytes(coded.flags.data(), raw.size()));
  REQUIRE(stored <= raw.size());
  coded.stored.resize(stored);
  return coded;
}

Bytes decompress(const Coded& coded, size_t bytes) {
  Bytes out(bytes, 0xEE);
  codec::decompress(coded.stored.data(), coded.flags.data(), bytes, out.data());
  return out;
}

size_t raw_chunks(const Coded& coded) {
  size_t raw = 0;
  for (uint8_t flag : coded.flags) raw += flag == codec::kRaw;
  return raw;
}

// One chunk of words whose exponents are `exponent` but for the words at `outside` (exponent
// `other`); signs and mantissas random.
Bytes chunk_with_exponents(unsigned exponent, const std::vector<size_t>& outside, unsigned other, unsigned seed) {
  Bytes out = random_bytes(codec::kChunkBytes, seed);
  std::vector<bool> is_outside(codec::kChunkWords);
  for (size_t i : outside) is_outside[i] = true;
  for (size_t i = 0; i < codec::kChunkWords; ++i) {
    const uint16_t noise = static_cast<uint16_t>(out[2 * i] | out[2 * i + 1] << 8);
    const unsigned e = is_outside[i] ? other : exponent;
    put_word(out, i, static_cast<uint16_t>((noise & 0x807Fu) | e << 7));
  }
  return out;
}

std::vector<size_t> spread_positions(size_t count, unsigned seed) {
  std::vector<size_t> all(codec::kChunkWords);
  for (size_t i = 0; i < all.size(); ++i) all[i] = i;
  std::shuffle(all.begin(), all.end(), std::mt19937(seed));
  all.resize(count);
  return all;
}

}  // namespace

TEST_CASE("compressed backups keep every bit of any data and code only the chunks that pay", "[offload][codec]") {
  const size_t bytes = 3 * codec::kChunkBytes + 12345;  // three chunks and an odd tail
  struct Case {
    const char* name;
    Bytes raw;
    bool coded;  // whether every whole chunk is expected coded
  };
  std::vector<Case> cases;
  cases.push_back({"bf16 weights, std 0.02", gaussian_bf16(bytes, 1), true});
  cases.push_back({"bf16 weights, std 1", gaussian_bf16(bytes, 2, 1.0f), true});
  cases.push_back({"random bytes", random_bytes(bytes, 3), false});
  cases.push_back({"all zero", Bytes(bytes, 0), true});
  cases.push_back({"NaNs, infinities, zeros and denormals", codec_data::special_values(bytes), false});
  Bytes denormals(bytes);
  for (size_t i = 0; i < bytes / 2; ++i) put_word(denormals, i, static_cast<uint16_t>((i * 37) & 0x807F));
  cases.push_back({"denormals only", denormals, true});
  cases.push_back({"fp32 weights", codec_data::gaussian_fp32(bytes, 4), false});
  for (const Case& c : cases) {
    INFO(c.name);
    const Coded coded = compress(c.raw);
    CHECK(first_difference(decompress(coded, bytes), c.raw) == SIZE_MAX);
    CHECK(raw_chunks(coded) == (c.coded ? 0 : 3));
    if (c.coded) CHECK(coded.stored.size() == 3 * codec::kCodedBytes + 12345);
  }
}

TEST_CASE("bf16 weights with realistic scales take at most 0.72 of their bytes", "[offload][codec]") {
  // Tensors of different scales back to back, as a model's weights lie in its pool: projections
  // (0.02), a norm's weights (near 1), an embedding (1), a small output head (0.002).
  Bytes raw;
  const std::pair<size_t, float> tensors[] = {{40, 0.02f}, {1, 1.0f}, {8, 1.0f}, {16, 0.002f}, {7, 0.05f}};
  unsigned seed = 10;
  for (const auto& [chunks, scale] : tensors) {
    Bytes part = gaussian_bf16(chunks * codec::kChunkBytes, seed++, scale);
    raw.insert(raw.end(), part.begin(), part.end());
  }
  const Coded coded = compress(raw);
  CHECK(raw_chunks(coded) == 0);
  CHECK(static_cast<double>(coded.stored.size()) / raw.size() == Approx(47104.0 / 65536).epsilon(1e-9));
  CHECK(first_difference(decompress(coded, raw.size()), raw) == SIZE_MAX);
}

TEST_CASE("a chunk is coded with up to 2,048 words outside its window and kept raw past that", "[offload][codec]") {
  for (size_t outside : {size_t{0}, size_t{1}, codec::kEscapeCapacity - 1, codec::kEscapeCapacity,
                         codec::kEscapeCapacity + 1}) {
    INFO(outside << " words outside the window");
    const Bytes raw = chunk_with_exponents(120, spread_positions(outside, 5), 3, 6);
    const Coded coded = compress(raw);
    CHECK(raw_chunks(coded) == (outside > codec::kEscapeCapacity ? 1 : 0));
    CHECK(first_difference(decompress(coded, raw.size()), raw) == SIZE_MAX);
    // The escapes keep the outside words' exponents in word order, then zeros.
    if (outside > 0 && outside <= codec::kEscapeCapacity) {
      CHECK(coded.stored[codec::kEscapeOffset + outside - 1] == 3);
      if (outside < codec::kEscapeCapacity) CHECK(coded.stored[codec::kEscapeOffset + outside] == 0);
    }
  }
}

TEST_CASE("the window holding the most words is chosen, the lowest on a tie, up to the highest exponents",
          "[offload][codec]") {
  const auto flag_of = [](const Bytes& chunk) {
    std::vector<uint16_t> words(codec::kChunkWords);
    std::memcpy(words.data(), chunk.data(), codec::kChunkBytes);
    return codec::choose(words.data());
  };
  CHECK(flag_of(chunk_with_exponents(10, {}, 0, 1)) == 4 + 1);   // windows 4..10 to 10..16 tie: base 4
  CHECK(flag_of(chunk_with_exponents(2, {}, 0, 1)) == 0 + 1);    // none starts below 0
  CHECK(flag_of(chunk_with_exponents(255, {}, 0, 1)) == 249 + 1);  // NaNs and infinities: the last window
  // 1,000 words at exponent 20 beside the rest at 10: no window holds both, so the windows holding
  // the 31,768 at 10 win (bases 4 to 10), the lowest first.
  CHECK(flag_of(chunk_with_exponents(10, spread_positions(1000, 2), 20, 3)) == 4 + 1);
  // At 15 they fit one window with the rest: 9..15 and 10..16 hold all; base 9.
  CHECK(flag_of(chunk_with_exponents(10, spread_positions(1000, 2), 15, 3)) == 9 + 1);
}

TEST_CASE("compress_to_host and decompress_from_host round-trip through device memory and touch no neighbour",
          "[offload][codec]") {
  FakeMachine machine;
  cudaStream_t stream = fake::make_stream();
  const uvm::Call call = uvm::Call::of("test");
  // More than one batch of chunks, and a tail.
  const size_t bytes = (uvm::kCodecBatchChunks + 3) * codec::kChunkBytes + 4098;
  const size_t guard = 4096;
  Bytes raw = gaussian_bf16(bytes, 21);
  // Two chunks that do not pay, one in each batch.
  const Bytes noise = random_bytes(codec::kChunkBytes, 22);
  std::memcpy(&raw[7 * codec::kChunkBytes], noise.data(), noise.size());
  std::memcpy(&raw[(uvm::kCodecBatchChunks + 1) * codec::kChunkBytes], noise.data(), noise.size());
  uint8_t* device = nullptr;
  REQUIRE(cudaMalloc(reinterpret_cast<void**>(&device), bytes + 2 * guard) == cudaSuccess);
  std::memset(device, 0xA5, bytes + 2 * guard);
  std::memcpy(device + guard, raw.data(), bytes);
  Bytes host(bytes + guard, 0x5A), flags(codec::chunks_in(bytes) + 1, 0x77);
  size_t stored = 0;
  const uvm_status compressed = uvm::compress_to_host(call, 0, device + guard, bytes, host.data(), flags.data(), &stored, stream);
  INFO(uvm_last_error());
  REQUIRE(compressed == UVM_OK);
  const Coded expected = compress(raw);
  CHECK(stored == expected.stored.size());
  CHECK(first_difference(Bytes(host.begin(), host.begin() + stored), expected.stored) == SIZE_MAX);
  CHECK(first_difference(Bytes(flags.begin(), flags.end() - 1), expected.flags) == SIZE_MAX);
  CHECK(flags.back() == 0x77);
  CHECK(std::all_of(host.begin() + stored, host.end(), [](uint8_t b) { return b == 0x5A; }));
  CHECK(raw_chunks(expected) == 2);
  // The coder alone, into device memory: the same bytes.
  uint8_t* coded = nullptr;
  REQUIRE(cudaMalloc(reinterpret_cast<void**>(&coded), bytes) == cudaSuccess);
  size_t stored_on_device = 0;
  REQUIRE(uvm::compress_on_device(call, 0, device + guard, bytes, coded, flags.data(), &stored_on_device, stream) == UVM_OK);
  CHECK(stored_on_device == stored);
  CHECK(std::memcmp(coded, expected.stored.data(), stored) == 0);
  REQUIRE(cudaFree(coded) == cudaSuccess);
  // Back into the same memory, wiped, between neighbours that must not change.
  std::memset(device + guard, 0, bytes);
  REQUIRE(uvm::decompress_from_host(call, 0, host.data(), flags.data(), bytes, device + guard, stream) == UVM_OK);
  CHECK(std::memcmp(device + guard, raw.data(), bytes) == 0);
  for (size_t i = 0; i < guard; ++i) {
    if (device[i] != 0xA5 || device[guard + bytes + i] != 0xA5) FAIL("a neighbour changed at " << i);
  }
  // choose, encode, decode (2 batches each), and choose and encode again on the device
  CHECK(FakeMachine::ops_named(fake::OpKind::codec_kernel).size() == 2 + 2 + 2 + 2 + 2);
  CHECK(cudaPeekAtLastError() == cudaSuccess);
  REQUIRE(cudaFree(device) == cudaSuccess);
}

TEST_CASE("a failure while compressing or decompressing names its step and leaves the backup whole", "[offload][codec]") {
  FakeMachine machine;
  cudaStream_t stream = fake::make_stream();
  const uvm::Call call = uvm::Call::of("test");
  const size_t bytes = 4 * codec::kChunkBytes;
  const Bytes raw = gaussian_bf16(bytes, 31);
  uint8_t* device = nullptr;
  REQUIRE(cudaMalloc(reinterpret_cast<void**>(&device), bytes) == cudaSuccess);
  std::memcpy(device, raw.data(), bytes);
  Bytes host(bytes), flags(codec::chunks_in(bytes));
  size_t stored = 0;
  struct Failure {
    const char* call;
    int skip;
    const char* named;
  };
  for (const Failure& f : {Failure{"cudaMalloc", 0, "chosen chunk flags"}, Failure{"cudaMalloc", 1, "chunk flags"},
                           Failure{"cudaMalloc", 2, "compression scratch"}, Failure{"cudaStreamCreateWithFlags", 0, "copy stream"},
                           Failure{"cuLaunchKernel", 0, "uvm_codec_choose"}, Failure{"cuLaunchKernel", 1, "uvm_codec_encode"},
                           Failure{"cudaHostAlloc", 0, "mapped memory for the chosen chunk flags"},
                           Failure{"cudaMemcpyAsync", 1, "coded bytes to the host"}}) {
    INFO(f.call << " failing after " << f.skip);
    fake::fail_next(f.call, cudaErrorInvalidValue, f.skip);
    CHECK(uvm::compress_to_host(call, 0, device, bytes, host.data(), flags.data(), &stored, stream) == UVM_ERROR_CUDA);
    CHECK(mentions(uvm_last_error(), f.call));
    CHECK(mentions(uvm_last_error(), f.named));
    CHECK(cudaPeekAtLastError() == cudaSuccess);
    CHECK(std::memcmp(device, raw.data(), bytes) == 0);  // the source is only read
  }
  REQUIRE(uvm::compress_to_host(call, 0, device, bytes, host.data(), flags.data(), &stored, stream) == UVM_OK);
  const Bytes backup(host.begin(), host.begin() + stored), backup_flags = flags;
  // (No room for the scratch is no failure: the CPU decodes, tested below.)
  for (const Failure& f : {Failure{"cudaMemcpyAsync", 0, "chunk flags"},
                           Failure{"cudaMemcpyAsync", 1, "coded bytes from the host"},
                           Failure{"cuLaunchKernel", 0, "uvm_codec_decode"}}) {
    INFO(f.call << " failing after " << f.skip);
    std::memset(device, 0, bytes);
    fake::fail_next(f.call, cudaErrorInvalidValue, f.skip);
    CHECK(uvm::decompress_from_host(call, 0, host.data(), flags.data(), bytes, device, stream) == UVM_ERROR_CUDA);
    CHECK(mentions(uvm_last_error(), f.named));
    CHECK(cudaPeekAtLastError() == cudaSuccess);
    CHECK(first_difference(Bytes(host.begin(), host.begin() + stored), backup) == SIZE_MAX);  // the backup is only read: the next try has it
    CHECK(first_difference(flags, backup_flags) == SIZE_MAX);
    REQUIRE(uvm::decompress_from_host(call, 0, host.data(), flags.data(), bytes, device, stream) == UVM_OK);
    CHECK(std::memcmp(device, raw.data(), bytes) == 0);
  }
  REQUIRE(cudaFree(device) == cudaSuccess);
}

TEST_CASE("the coder refuses a source or destination off 16 bytes before any launch", "[offload][codec]") {
  FakeMachine machine;
  cudaStream_t stream = fake::make_stream();
  const uvm::Call call = uvm::Call::of("test");
  const size_t bytes = 2 * codec::kChunkBytes;
  const Bytes raw = gaussian_bf16(bytes, 41);
  uint8_t* device = nullptr;
  REQUIRE(cudaMalloc(reinterpret_cast<void**>(&device), bytes + 16) == cudaSuccess);
  std::memcpy(device + 2, raw.data(), bytes);
  Bytes host(bytes), flags(codec::chunks_in(bytes));
  size_t stored = 0;
  CHECK(uvm::compress_to_host(call, 0, device + 2, bytes, host.data(), flags.data(), &stored, stream) == UVM_ERROR_INTERNAL);
  CHECK(mentions(uvm_last_error(), "uvm_codec_choose"));
  CHECK(mentions(uvm_last_error(), "not 16-byte aligned"));
  std::memcpy(device, raw.data(), bytes);
  REQUIRE(uvm::compress_to_host(call, 0, device, bytes, host.data(), flags.data(), &stored, stream) == UVM_OK);
  CHECK(uvm::decompress_from_host(call, 0, host.data(), flags.data(), bytes, device + 8, stream) == UVM_ERROR_INTERNAL);
  CHECK(mentions(uvm_last_error(), "uvm_codec_decode"));
  CHECK(FakeMachine::ops_named(fake::OpKind::codec_kernel).size() == 2);  // the good compression's alone
  CHECK(cudaPeekAtLastError() == cudaSuccess);
  REQUIRE(cudaFree(device) == cudaSuccess);
}

TEST_CASE("decompress_from_host decodes on the CPU where the device has no room for the scratch, bit for bit",
          "[offload][codec]") {
  FakeMachine machine;
  cudaStream_t stream = fake::make_stream();
  const uvm::Call call = uvm::Call::of("test");
  const size_t bytes = 5 * codec::kChunkBytes + 777, guard = 4096;
  Bytes raw = gaussian_bf16(bytes, 51);
  const Bytes noise = random_bytes(codec::kChunkBytes, 52);
  std::memcpy(&raw[2 * codec::kChunkBytes], noise.data(), noise.size());  // one chunk kept raw
  uint8_t* device = nullptr;
  REQUIRE(cudaMalloc(reinterpret_cast<void**>(&device), bytes + 2 * guard) == cudaSuccess);
  std::memcpy(device + guard, raw.data(), bytes);
  Bytes host(bytes), flags(codec::chunks_in(bytes));
  size_t stored = 0;
  REQUIRE(uvm::compress_to_host(call, 0, device + guard, bytes, host.data(), flags.data(), &stored, stream) == UVM_OK);
  for (const char* failing : {"cudaMalloc", "cudaStreamCreateWithFlags"}) {
    CAPTURE(failing);
    std::memset(device, 0xA5, bytes + 2 * guard);
    fake::reset_ops();
    fake::fail_next(failing, cudaErrorMemoryAllocation);
    REQUIRE(uvm::decompress_from_host(call, 0, host.data(), flags.data(), bytes, device + guard, stream) == UVM_OK);
    CHECK(FakeMachine::ops_named(fake::OpKind::codec_kernel).empty());
    CHECK(std::memcmp(device + guard, raw.data(), bytes) == 0);
    for (size_t i = 0; i < guard; ++i) {
      if (device[i] != 0xA5 || device[guard + bytes + i] != 0xA5) FAIL("a neighbour changed at " << i);
    }
    CHECK(cudaPeekAtLastError() == cudaSuccess);
  }
  REQUIRE(cudaFree(device) == cudaSuccess);
}
