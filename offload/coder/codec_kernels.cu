// The GPU side of compressed backups: the format of offload/coder/codec.hpp, written and read by three
// kernels, one block of kThreads per 64 KiB chunk. libuvm.so is built without nvcc, so this file is
// compiled to PTX by scripts/codec_ptx.sh into offload/coder/codec_ptx.inc, which the library loads
// through the driver (offload/coder/compress.cpp); tests/offload/test_codec.cpp checks the two agree.
//
// Each block walks its chunk in 16 rounds of 256 groups of 8 words (one 16-byte load a thread, the
// block's loads contiguous). Escapes keep word order: a round's threads place theirs after the
// escapes of every earlier group, by a scan across the block.
#include <stdint.h>

// No function here has internal linkage (no unnamed namespace, no static function): the PTX names
// of their shared variables would then hold a hash of the file's path, and the generated file would
// differ from one checkout to the next.
static constexpr unsigned kThreads = 256;
static constexpr unsigned kChunkBytes = 64u << 10;
static constexpr unsigned kChunkWords = kChunkBytes / 2;
static constexpr unsigned kGroups = kChunkWords / 8;
static constexpr unsigned kRounds = kGroups / kThreads;  // 16
static constexpr unsigned kCodeOffset = kChunkWords;
static constexpr unsigned kEscapeOffset = kCodeOffset + 3 * kGroups;
static constexpr unsigned kEscapeCapacity = 2048;
static constexpr unsigned kCodedBytes = kEscapeOffset + kEscapeCapacity;
static constexpr unsigned kWindow = 7;
static constexpr unsigned kMaxBase = 256 - kWindow;

__device__ __forceinline__ unsigned exponent_of(unsigned word) { return (word >> 7) & 0xFFu; }
__device__ __forceinline__ unsigned low_of(unsigned word) { return ((word >> 8) & 0x80u) | (word & 0x7Fu); }

// The sum of `value` over the threads before this one in the block, and (in *total) over all.
// Every thread of the block must call it.
__device__ __forceinline__ unsigned exclusive_scan(unsigned value, unsigned* total) {
  __shared__ unsigned warp_sums[kThreads / 32];
  const unsigned lane = threadIdx.x % 32, warp = threadIdx.x / 32;
  unsigned inclusive = value;
  for (unsigned d = 1; d < 32; d *= 2) {
    const unsigned other = __shfl_up_sync(0xFFFFFFFFu, inclusive, d);
    if (lane >= d) inclusive += other;
  }
  if (lane == 31) warp_sums[warp] = inclusive;
  __syncthreads();
  unsigned before = 0, all = 0;
  for (unsigned w = 0; w < kThreads / 32; ++w) {
    if (w < warp) before += warp_sums[w];
    all += warp_sums[w];
  }
  __syncthreads();  // warp_sums is written again by the next call
  *total = all;
  return before + inclusive - value;
}

// Where chunk `chunk` starts among the stored chunks [first, ...): the stored sizes before it.
__device__ __forceinline__ uint64_t stored_offset(const uint8_t* flags, uint64_t first, uint64_t chunk) {
  __shared__ unsigned raw_count;
  if (threadIdx.x == 0) raw_count = 0;
  __syncthreads();
  unsigned raw = 0;
  for (uint64_t j = first + threadIdx.x; j < chunk; j += kThreads) raw += flags[j] == 0;
  if (raw) atomicAdd(&raw_count, raw);
  __syncthreads();
  const uint64_t before = chunk - first;
  return before * kCodedBytes + uint64_t{raw_count} * (kChunkBytes - kCodedBytes);
}

__device__ __forceinline__ void copy_chunk(uint4* dst, const uint4* src) {
  for (unsigned i = threadIdx.x; i < kChunkBytes / 16; i += kThreads) dst[i] = src[i];
}

// flags[c] for each chunk c of `src` (chunks of them): the base of the window of 7 exponents
// holding the most words plus 1 (the lowest base on a tie), or 0 (raw) when more than 2,048 words
// fall outside it. Unless null, host_flags[c] too: mapped host memory, which the host reads once
// the kernel has ended, with no copy queued behind the copy engine's other work.
extern "C" __global__ void __launch_bounds__(kThreads)
    uvm_codec_choose(const uint8_t* src, uint8_t* flags, uint8_t* host_flags) {
  __shared__ unsigned histogram[256];
  __shared__ unsigned long long best;
  histogram[threadIdx.x] = 0;
  if (threadIdx.x == 0) best = 0;
  __syncthreads();
  const uint4* chunk = reinterpret_cast<const uint4*>(src + uint64_t{blockIdx.x} * kChunkBytes);
  for (unsigned round = 0; round < kRounds; ++round) {
    const uint4 v = chunk[round * kThreads + threadIdx.x];
    const unsigned parts[4] = {v.x, v.y, v.z, v.w};
    for (unsigned p = 0; p < 4; ++p) {
      for (unsigned half = 0; half < 2; ++half) {
        const unsigned e = exponent_of(parts[p] >> (16 * half));
        const unsigned same = __match_any_sync(0xFFFFFFFFu, e);
        if (threadIdx.x % 32 == __ffs(same) - 1) atomicAdd(&histogram[e], __popc(same));
      }
    }
  }
  __syncthreads();
  if (threadIdx.x <= kMaxBase) {
    unsigned held = 0;
    for (unsigned k = 0; k < kWindow; ++k) held += histogram[threadIdx.x + k];
    // The most words held wins; on a tie the lowest base (the larger 255 - base).
    atomicMax(&best, (static_cast<unsigned long long>(held) << 8) | (255u - threadIdx.x));
  }
  __syncthreads();
  if (threadIdx.x == 0) {
    const unsigned held = static_cast<unsigned>(best >> 8), base = 255u - static_cast<unsigned>(best & 0xFFu);
    const uint8_t flag = kChunkWords - held > kEscapeCapacity ? 0 : static_cast<uint8_t>(base + 1);
    flags[blockIdx.x] = flag;
    if (host_flags != nullptr) host_flags[blockIdx.x] = flag;
  }
}

// Stores chunks first..first+gridDim.x-1 of `src` (the raw bytes, from chunk `first` on), coded under
// their flags, one after another from `dst`.
extern "C" __global__ void __launch_bounds__(kThreads)
    uvm_codec_encode(const uint8_t* src, const uint8_t* flags, uint64_t first, uint8_t* dst) {
  const uint64_t chunk = first + blockIdx.x;
  uint8_t* out = dst + stored_offset(flags, first, chunk);
  const uint8_t* in = src + uint64_t{blockIdx.x} * kChunkBytes;
  const unsigned flag = flags[chunk];
  if (flag == 0) {
    copy_chunk(reinterpret_cast<uint4*>(out), reinterpret_cast<const uint4*>(in));
    return;
  }
  const unsigned base = flag - 1;
  for (unsigned i = threadIdx.x; i < kEscapeCapacity / 8; i += kThreads) {
    reinterpret_cast<uint2*>(out + kEscapeOffset)[i] = make_uint2(0, 0);
  }
  __syncthreads();  // the padding is zeroed before any escape is written over it
  unsigned escaped_before_round = 0;
  for (unsigned round = 0; round < kRounds; ++round) {
    const unsigned group = round * kThreads + threadIdx.x;
    const uint4 v = reinterpret_cast<const uint4*>(in)[group];
    const unsigned parts[4] = {v.x, v.y, v.z, v.w};
    unsigned lows[2] = {0, 0}, planes[3] = {0, 0, 0}, escapes = 0;
    unsigned exponents[8];
    for (unsigned j = 0; j < 8; ++j) {
      const unsigned word = (parts[j / 2] >> (16 * (j % 2))) & 0xFFFFu;
      const unsigned e = exponent_of(word);
      unsigned code = e - base;
      if (code >= kWindow) {
        code = kWindow;
        exponents[escapes++] = e;
      }
      lows[j / 4] |= low_of(word) << (8 * (j % 4));
      for (unsigned k = 0; k < 3; ++k) planes[k] |= ((code >> k) & 1u) << j;
    }
    reinterpret_cast<uint2*>(out)[group] = make_uint2(lows[0], lows[1]);
    for (unsigned k = 0; k < 3; ++k) out[kCodeOffset + k * kGroups + group] = static_cast<uint8_t>(planes[k]);
    unsigned round_total = 0;
    const unsigned at = escaped_before_round + exclusive_scan(escapes, &round_total);
    for (unsigned i = 0; i < escapes; ++i) {
      if (at + i < kEscapeCapacity) out[kEscapeOffset + at + i] = static_cast<uint8_t>(exponents[i]);
    }
    escaped_before_round += round_total;
  }
}

// Reverses uvm_codec_encode: chunks first..first+gridDim.x-1, stored one after another from `src`,
// into their raw bytes from `dst` (chunk `first` at dst).
extern "C" __global__ void __launch_bounds__(kThreads)
    uvm_codec_decode(const uint8_t* src, const uint8_t* flags, uint64_t first, uint8_t* dst) {
  const uint64_t chunk = first + blockIdx.x;
  const uint8_t* in = src + stored_offset(flags, first, chunk);
  uint8_t* out = dst + uint64_t{blockIdx.x} * kChunkBytes;
  const unsigned flag = flags[chunk];
  if (flag == 0) {
    copy_chunk(reinterpret_cast<uint4*>(out), reinterpret_cast<const uint4*>(in));
    return;
  }
  const unsigned base = flag - 1;
  unsigned escaped_before_round = 0;
  for (unsigned round = 0; round < kRounds; ++round) {
    const unsigned group = round * kThreads + threadIdx.x;
    const uint2 lows = reinterpret_cast<const uint2*>(in)[group];
    unsigned planes[3];
    for (unsigned k = 0; k < 3; ++k) planes[k] = in[kCodeOffset + k * kGroups + group];
    const unsigned escapes = __popc(planes[0] & planes[1] & planes[2]);  // code 7: all three bits set
    unsigned round_total = 0;
    unsigned at = escaped_before_round + exclusive_scan(escapes, &round_total);
    unsigned words[4] = {0, 0, 0, 0};
    for (unsigned j = 0; j < 8; ++j) {
      const unsigned code = ((planes[0] >> j) & 1u) | ((planes[1] >> j) & 1u) << 1 | ((planes[2] >> j) & 1u) << 2;
      unsigned e = base + code;
      if (code == kWindow) {
        e = at < kEscapeCapacity ? in[kEscapeOffset + at] : 0;
        ++at;
      }
      const unsigned low = ((j < 4 ? lows.x : lows.y) >> (8 * (j % 4))) & 0xFFu;
      const unsigned word = ((low & 0x80u) << 8) | (e << 7) | (low & 0x7Fu);
      words[j / 2] |= word << (16 * (j % 2));
    }
    reinterpret_cast<uint4*>(out)[group] = make_uint4(words[0], words[1], words[2], words[3]);
    escaped_before_round += round_total;
  }
}
