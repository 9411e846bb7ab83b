#include "plan.hpp"

#include <algorithm>
#include <map>

namespace uvm {

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

RangeSplit split_range(const Span& range, std::vector<Span> staged, std::vector<Span> free) {
  const auto by_address = [](const Span& a, const Span& b) { return a.begin < b.begin; };
  std::vector<Span> held = staged;
  held.insert(held.end(), free.begin(), free.end());
  std::sort(held.begin(), held.end(), by_address);
  std::sort(staged.begin(), staged.end(), by_address);
  std::sort(free.begin(), free.end(), by_address);
  return RangeSplit{std::move(staged), std::move(free), subtract(range, held)};
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

std::vector<CopyRun> copy_runs(const std::vector<CopyPiece>& pieces,
                               const std::function<bool(const char* host, size_t bytes)>& one_registration) {
  std::vector<CopyRun> runs;
  for (size_t first = 0; first < pieces.size();) {
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
    runs.push_back(CopyRun{first, end, bytes});
    first = end;
  }
  return runs;
}

}  // namespace uvm

namespace uvm {
namespace {

uint64_t align_down(uint64_t value, size_t align) { return value & ~static_cast<uint64_t>(align - 1); }
uint64_t align_up(uint64_t value, size_t align) { return align_down(value + align - 1, align); }

}  // namespace

std::vector<SpillBatch> plan_spill(const std::vector<SpillItem>& items, size_t buffer_bytes, size_t align) {
  std::vector<SpillBatch> batches;
  size_t used = buffer_bytes;  // none open yet
  const size_t longest = buffer_bytes - align;  // room for an unaligned start's widening
  for (size_t i = 0; i < items.size(); ++i) {
    const SpillItem& item = items[i];
    for (uintptr_t at = item.span.begin; at < item.span.end;) {
      SpillChunk chunk;
      chunk.item = i;
      chunk.target = item.target;
      chunk.offset = item.offset + (at - item.span.begin);
      // A chunk starting aligned fills the buffer; one that does not leaves room for its widening.
      const size_t room = chunk.offset % align == 0 ? buffer_bytes : longest;
      const size_t bytes = std::min<size_t>(room, item.span.end - at);
      chunk.span = Span{at, at + bytes};
      chunk.io_begin = align_down(chunk.offset, align);
      chunk.io_bytes = static_cast<size_t>(align_up(chunk.offset + bytes, align) - chunk.io_begin);
      if (used + chunk.io_bytes > buffer_bytes) {
        batches.emplace_back();
        used = 0;
      }
      chunk.bounce = used;
      used += chunk.io_bytes;
      batches.back().chunks.push_back(chunk);
      at += bytes;
    }
  }
  return batches;
}

CopyLayout lay_out_copies(const std::vector<Span>& pieces, const std::vector<uintptr_t>& allocations, size_t align) {
  CopyLayout layout;
  std::map<uintptr_t, size_t> target_of;
  for (size_t i = 0; i < pieces.size(); ++i) {
    auto found = target_of.find(allocations[i]);
    if (found == target_of.end()) {
      found = target_of.emplace(allocations[i], layout.target_allocations.size()).first;
      layout.target_allocations.push_back(allocations[i]);
      layout.target_bytes.push_back(0);
    }
    uint64_t& size = layout.target_bytes[found->second];
    layout.items.push_back(SpillItem{pieces[i], found->second, size});
    size += align_up(pieces[i].size(), align);
  }
  return layout;
}

}  // namespace uvm
