// The lossless format of compressed backups, and its reference coder on the CPU.
//
// bf16 weights waste the link: the exponent byte of a weight takes a handful of values (the scale
// of its tensor), the sign and mantissa bits are noise. So each chunk of 64 KiB, read as 16-bit
// words, keeps every word's sign and 7 mantissa bits as they are (one byte) and its 8-bit exponent
// as a 3-bit code: 0 to 6 for the exponents base..base+6, 7 for any other, whose exponent follows
// in the chunk's escape list. A coded chunk takes 47,104 bytes (0.72 of it). A chunk whose window of
// 7 exponents misses more than kEscapeCapacity words (random bytes, fp32, int8 data) is kept raw;
// so is a tail shorter than a chunk. Lossless for every bit pattern (NaNs, denormals, -0): every
// bit of every word is either kept or coded exactly.
//
// The GPU kernels (codec_kernels.cu) write and read exactly these bytes; this coder is their
// reference (the GPU tests compare byte for byte) and what the CUDA test double runs for them.
#pragma once

#include <cstddef>
#include <cstdint>
#include <vector>

namespace uvm::codec {

constexpr size_t kChunkBytes = size_t{64} << 10;      // raw bytes per chunk
constexpr size_t kChunkWords = kChunkBytes / 2;       // 16-bit words per chunk
constexpr size_t kGroupWords = 8;                     // words whose code bits share one byte per plane
constexpr size_t kGroups = kChunkWords / kGroupWords;  // 4,096
constexpr size_t kEscapeCapacity = 2048;              // escaped words a coded chunk holds (6.25 %)
// A coded chunk: the low plane (sign << 7 | mantissa, one byte a word), three code bit-planes
// (plane k's byte g holds bit k of the codes of words 8g..8g+7, word 8g + j at bit j), then the
// escape list (the escaped words' exponents in word order, zero-padded).
constexpr size_t kLowOffset = 0;
constexpr size_t kCodeOffset = kChunkWords;                   // 32,768
constexpr size_t kEscapeOffset = kCodeOffset + 3 * kGroups;   // 45,056
constexpr size_t kCodedBytes = kEscapeOffset + kEscapeCapacity;  // 47,104
constexpr uint8_t kRaw = 0;  // a chunk's flag: kept raw; else base exponent + 1 (1..250)
constexpr unsigned kWindow = 7;
constexpr unsigned kMaxBase = 256 - kWindow;  // 249

// What a chunk's flag makes of its stored size.
inline size_t stored_bytes(uint8_t flag) { return flag == kRaw ? kChunkBytes : kCodedBytes; }

// The whole chunks in `bytes` (the tail after them is kept raw).
inline size_t chunks_in(size_t bytes) { return bytes / kChunkBytes; }

// The flag of one chunk (kChunkWords words): the base of the window of 7 exponents holding the most
// words (the lowest base on a tie), or kRaw when more than kEscapeCapacity words fall outside it.
uint8_t choose(const uint16_t* chunk);

// Writes the chunk coded under `flag` (not kRaw) into `out` (kCodedBytes).
void encode(const uint16_t* chunk, uint8_t flag, uint8_t* out);

// Reads a chunk coded under `flag` (not kRaw) from `in` into `out` (kChunkWords words).
void decode(const uint8_t* in, uint8_t flag, uint16_t* out);

// The compressed size of `bytes` whose chunks have `flags` (chunks_in(bytes) of them): each chunk's
// stored bytes, then the raw tail.
size_t compressed_bytes(const uint8_t* flags, size_t bytes);

// Compresses `bytes` at `src` into `dst` (room for `bytes`: nothing is ever larger), filling
// `flags` (chunks_in(bytes)); returns the compressed size. The CPU's whole path, as the GPU's runs it.
size_t compress(const void* src, size_t bytes, uint8_t* flags, void* dst);

// Reverses compress: the `bytes` raw bytes from `src`, coded under `flags`, into `dst`.
void decompress(const void* src, const uint8_t* flags, size_t bytes, void* dst);

}  // namespace uvm::codec
