#include "codec.hpp"

#include <cstring>

namespace uvm::codec {
namespace {

// A bf16 word's parts: its 8-bit exponent, and its sign and 7 mantissa bits as one byte.
inline unsigned exponent_of(uint16_t word) { return (word >> 7) & 0xFFu; }
inline uint8_t low_of(uint16_t word) { return static_cast<uint8_t>(((word >> 8) & 0x80u) | (word & 0x7Fu)); }
inline uint16_t word_of(uint8_t low, unsigned exponent) {
  return static_cast<uint16_t>(((low & 0x80u) << 8) | (exponent << 7) | (low & 0x7Fu));
}

// Words are read and written as little-endian bytes, as the GPU stores them.
void load_words(const uint8_t* bytes, uint16_t* words) {
  for (size_t i = 0; i < kChunkWords; ++i) words[i] = static_cast<uint16_t>(bytes[2 * i] | bytes[2 * i + 1] << 8);
}
void store_words(const uint16_t* words, uint8_t* bytes) {
  for (size_t i = 0; i < kChunkWords; ++i) {
    bytes[2 * i] = static_cast<uint8_t>(words[i]);
    bytes[2 * i + 1] = static_cast<uint8_t>(words[i] >> 8);
  }
}

}  // namespace

uint8_t choose(const uint16_t* chunk) {
  size_t histogram[256] = {};
  for (size_t i = 0; i < kChunkWords; ++i) ++histogram[exponent_of(chunk[i])];
  size_t best = 0;
  unsigned best_base = 0;
  for (unsigned base = 0; base <= kMaxBase; ++base) {
    size_t held = 0;
    for (unsigned k = 0; k < kWindow; ++k) held += histogram[base + k];
    if (held > best) best = held, best_base = base;  // strictly more: the lowest base wins a tie
  }
  return kChunkWords - best > kEscapeCapacity ? kRaw : static_cast<uint8_t>(best_base + 1);
}

void encode(const uint16_t* chunk, uint8_t flag, uint8_t* out) {
  const unsigned base = flag - 1u;
  std::memset(out, 0, kCodedBytes);
  size_t escaped = 0;
  for (size_t i = 0; i < kChunkWords; ++i) {
    const unsigned exponent = exponent_of(chunk[i]);
    unsigned code = exponent - base;  // wraps past the window when below it
    if (code >= kWindow) {
      code = kWindow;
      out[kEscapeOffset + escaped++] = static_cast<uint8_t>(exponent);
    }
    out[kLowOffset + i] = low_of(chunk[i]);
    for (unsigned k = 0; k < 3; ++k) {
      out[kCodeOffset + k * kGroups + i / kGroupWords] |= static_cast<uint8_t>(((code >> k) & 1u) << (i % kGroupWords));
    }
  }
}

void decode(const uint8_t* in, uint8_t flag, uint16_t* out) {
  const unsigned base = flag - 1u;
  size_t escaped = 0;
  for (size_t i = 0; i < kChunkWords; ++i) {
    unsigned code = 0;
    for (unsigned k = 0; k < 3; ++k) code |= ((in[kCodeOffset + k * kGroups + i / kGroupWords] >> (i % kGroupWords)) & 1u) << k;
    const unsigned exponent = code == kWindow ? in[kEscapeOffset + escaped++] : base + code;
    out[i] = word_of(in[kLowOffset + i], exponent);
  }
}

size_t compressed_bytes(const uint8_t* flags, size_t bytes) {
  const size_t chunks = chunks_in(bytes);
  size_t total = bytes - chunks * kChunkBytes;
  for (size_t c = 0; c < chunks; ++c) total += stored_bytes(flags[c]);
  return total;
}

size_t compress(const void* src, size_t bytes, uint8_t* flags, void* dst) {
  const auto* in = static_cast<const uint8_t*>(src);
  auto* out = static_cast<uint8_t*>(dst);
  std::vector<uint16_t> words(kChunkWords);
  const size_t chunks = chunks_in(bytes);
  size_t at = 0;
  for (size_t c = 0; c < chunks; ++c) {
    load_words(in + c * kChunkBytes, words.data());
    flags[c] = choose(words.data());
    if (flags[c] == kRaw) {
      std::memcpy(out + at, in + c * kChunkBytes, kChunkBytes);
    } else {
      encode(words.data(), flags[c], out + at);
    }
    at += stored_bytes(flags[c]);
  }
  std::memcpy(out + at, in + chunks * kChunkBytes, bytes - chunks * kChunkBytes);
  return at + bytes - chunks * kChunkBytes;
}

void decompress(const void* src, const uint8_t* flags, size_t bytes, void* dst) {
  const auto* in = static_cast<const uint8_t*>(src);
  auto* out = static_cast<uint8_t*>(dst);
  std::vector<uint16_t> words(kChunkWords);
  const size_t chunks = chunks_in(bytes);
  size_t at = 0;
  for (size_t c = 0; c < chunks; ++c) {
    if (flags[c] == kRaw) {
      std::memcpy(out + c * kChunkBytes, in + at, kChunkBytes);
    } else {
      decode(in + at, flags[c], words.data());
      store_words(words.data(), out + c * kChunkBytes);
    }
    at += stored_bytes(flags[c]);
  }
  std::memcpy(out + chunks * kChunkBytes, in + at, bytes - chunks * kChunkBytes);
}

}  // namespace uvm::codec
