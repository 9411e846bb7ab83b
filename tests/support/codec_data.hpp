// Data for the compressed backups' tests, CPU and GPU alike: bf16 weights as a Llama-style model is
// initialized, and what compression must survive without paying (random bytes and the like).
#pragma once

#include <cstddef>
#include <cstdint>
#include <cstring>
#include <random>
#include <vector>

namespace codec_data {

using Bytes = std::vector<uint8_t>;

// bf16 of `value`, rounded to nearest even, as torch converts.
inline uint16_t bf16(float value) {
  uint32_t bits;
  std::memcpy(&bits, &value, 4);
  bits += 0x7FFFu + ((bits >> 16) & 1u);
  return static_cast<uint16_t>(bits >> 16);
}

// Word `i` of `bytes`, as little-endian 16-bit words.
inline void put_word(Bytes& bytes, size_t i, uint16_t word) {
  bytes[2 * i] = static_cast<uint8_t>(word);
  bytes[2 * i + 1] = static_cast<uint8_t>(word >> 8);
}

// `bytes` of bf16 weights drawn normal with `std_dev` (a Llama-style model's projections: 0.02).
inline Bytes gaussian_bf16(size_t bytes, unsigned seed, float std_dev = 0.02f) {
  Bytes out(bytes);
  std::mt19937 rng(seed);
  std::normal_distribution<float> normal(0.0f, std_dev);
  for (size_t i = 0; i < bytes / 2; ++i) put_word(out, i, bf16(normal(rng)));
  return out;
}

inline Bytes random_bytes(size_t bytes, unsigned seed) {
  Bytes out(bytes);
  std::mt19937 rng(seed);
  for (auto& b : out) b = static_cast<uint8_t>(rng());
  return out;
}

// NaNs, infinities, signed zeros and denormals, cycled.
inline Bytes special_values(size_t bytes) {
  Bytes out(bytes);
  const uint16_t patterns[] = {0x7FC0, 0xFFC1, 0x7F80, 0xFF80, 0x8000, 0x0000, 0x0001, 0x807F, 0x7F81};
  for (size_t i = 0; i < bytes / 2; ++i) put_word(out, i, patterns[i % 9]);
  return out;
}

// fp32 weights (normal, std 0.02): their low halves look random, so no chunk pays.
inline Bytes gaussian_fp32(size_t bytes, unsigned seed) {
  Bytes out(bytes);
  std::mt19937 rng(seed);
  std::normal_distribution<float> normal(0.0f, 0.02f);
  for (size_t i = 0; i + 4 <= bytes; i += 4) {
    const float value = normal(rng);
    std::memcpy(&out[i], &value, 4);
  }
  return out;
}

// Where `a` and `b` first differ (the shorter one's end if one is a prefix of the other), or
// SIZE_MAX when they are the same: a failing check prints one index, not megabytes of bytes.
inline size_t first_difference(const Bytes& a, const Bytes& b) {
  const size_t common = a.size() < b.size() ? a.size() : b.size();
  for (size_t i = 0; i < common; ++i) {
    if (a[i] != b[i]) return i;
  }
  return a.size() == b.size() ? SIZE_MAX : common;
}

}  // namespace codec_data
