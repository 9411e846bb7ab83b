#include "plan.hpp"

#include <algorithm>
#include <cstdlib>
#include <string>

namespace uvm {
namespace {

// Populating a piece and copying it right after ran 37–41 GB/s on an H100 with two streams in every
// case measured (bench/transfer_probe.cu). On an H200 with the 4 GiB benchmark model, four streams
// gave 43.4 GB/s against 40–42 for two; 32 MiB × 4 and 16 MiB × 8 were no better (43.5–43.6).
constexpr size_t kDefaultChunkMiB = 64;
constexpr int kDefaultStreams = 4;

long parse_in_range(const char* text, long low, long high, long fallback) {
  if (text == nullptr || *text == '\0') return fallback;
  char* end = nullptr;
  const long value = std::strtol(text, &end, 10);
  if (*end != '\0' || value < low || value > high) return fallback;
  return value;
}

}  // namespace

uvm_strategy choose_strategy(uvm_strategy requested, bool discard_supported) {
  if (requested != UVM_STRATEGY_AUTO) return requested;
  return discard_supported ? UVM_STRATEGY_STAGED : UVM_STRATEGY_MIGRATE;
}

std::vector<Span> subtract(const Span& range, const std::vector<Span>& covered) {
  std::vector<Span> parts;
  uintptr_t at = range.begin;
  for (const Span& c : covered) {
    if (c.end <= at || c.begin >= range.end) continue;
    if (c.begin > at) parts.push_back(Span{at, c.begin});
    at = std::max(at, c.end);
    if (at >= range.end) break;
  }
  if (at < range.end) parts.push_back(Span{at, range.end});
  return parts;
}

std::vector<Span> split_into_chunks(const std::vector<Span>& spans, size_t chunk_bytes) {
  std::vector<Span> chunks;
  for (const Span& span : spans) {
    for (uintptr_t at = span.begin; at < span.end; at += chunk_bytes) {
      chunks.push_back(Span{at, at + std::min<size_t>(chunk_bytes, span.end - at)});
    }
  }
  return chunks;
}

OnloadPipeline parse_onload_pipeline(const char* chunk_mib, const char* streams) {
  return OnloadPipeline{
      static_cast<size_t>(parse_in_range(chunk_mib, 1, 4096, kDefaultChunkMiB)) << 20,
      static_cast<int>(parse_in_range(streams, 1, kMaxWorkerStreams, kDefaultStreams))};
}

std::vector<OnloadChunk> plan_onload(const std::vector<CopyPiece>& pieces, size_t chunk_bytes) {
  std::vector<OnloadChunk> chunks;
  for (size_t i = 0; i < pieces.size(); ++i) {
    const CopyPiece& piece = pieces[i];
    const CopyPiece* before = i > 0 ? &pieces[i - 1] : nullptr;
    for (uintptr_t at = piece.span.begin; at < piece.span.end;) {
      const bool continues = at == piece.span.begin && before != nullptr && !chunks.empty() &&
                             before->memory == piece.memory && piece.memory != 0 &&
                             piece.span.begin == before->span.end && chunks.back().populate.end == before->span.end;
      const bool fits = continues && piece.span.begin - chunks.back().populate.begin < chunk_bytes;
      if (!fits) chunks.push_back(OnloadChunk{Span{at, at}, {}});
      OnloadChunk& chunk = chunks.back();
      const uintptr_t end = std::min<uintptr_t>(piece.span.end, chunk.populate.begin + chunk_bytes);
      chunk.copies.push_back(CopyPiece{Span{at, end}, piece.allocation, piece.host + (at - piece.span.begin), piece.memory});
      chunk.populate.end = end;
      at = end;
    }
  }
  return chunks;
}

size_t copy_run_end(const std::vector<CopyPiece>& pieces, size_t first,
                    const std::function<bool(const char* host, size_t bytes)>& one_registration) {
  size_t end = first + 1;
  size_t bytes = pieces[first].span.size();
  while (end < pieces.size()) {
    const CopyPiece& before = pieces[end - 1];
    const CopyPiece& next = pieces[end];
    const bool follows = next.memory == before.memory && next.memory != 0 && next.span.begin == before.span.end &&
                         next.host == before.host + before.span.size();
    if (!follows || !one_registration(pieces[first].host, bytes + next.span.size())) break;
    bytes += next.span.size();
    ++end;
  }
  return end;
}

OnloadPipeline onload_pipeline() {
  static const OnloadPipeline pipeline =
      parse_onload_pipeline(std::getenv("UVM_ONLOAD_CHUNK_MIB"), std::getenv("UVM_ONLOAD_STREAMS"));
  return pipeline;
}

}  // namespace uvm
