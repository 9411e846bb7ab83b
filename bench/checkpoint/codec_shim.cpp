// The reference coder of compressed backups (offload/coder/codec.hpp) behind a C entry point, for
// bench/checkpoint/stored.py, which compiles this file with offload/coder/codec.cpp (no CUDA needed):
// the GPU kernels write the same bytes (tests/gpu/test_codec_gpu.cpp holds them to it).
#include <cstddef>
#include <cstring>
#include <vector>

#include "../../offload/coder/codec.hpp"

// Compresses `bytes` at `src` as uvm_pause would a compressed allocation of that size; returns the
// bytes stored, and in *identical whether decompressing gave every byte back.
extern "C" size_t uvm_bench_stored_bytes(const void* src, size_t bytes, int* identical) {
  std::vector<uint8_t> flags(uvm::codec::chunks_in(bytes));
  std::vector<uint8_t> coded(bytes), back(bytes);
  const size_t stored = uvm::codec::compress(src, bytes, flags.data(), coded.data());
  uvm::codec::decompress(coded.data(), flags.data(), bytes, back.data());
  *identical = std::memcmp(src, back.data(), bytes) == 0;
  return stored;
}
