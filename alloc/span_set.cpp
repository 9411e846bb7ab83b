#include "span_set.hpp"

#include <algorithm>

namespace uvm {

size_t SpanSet::add(size_t begin, size_t end) {
  if (begin >= end) return 0;
  const size_t before = total_;
  remove(begin, end);  // clears the overlap so the new span stands alone
  auto at = std::lower_bound(spans_.begin(), spans_.end(), std::make_pair(begin, end));
  at = spans_.insert(at, {begin, end});
  total_ += end - begin;
  // Merge with touching neighbours so the set stays minimal.
  if (at + 1 != spans_.end() && (at + 1)->first == at->second) {
    at->second = (at + 1)->second;
    spans_.erase(at + 1);
  }
  if (at != spans_.begin() && (at - 1)->second == at->first) {
    (at - 1)->second = at->second;
    spans_.erase(at);
  }
  return total_ - before;
}

size_t SpanSet::remove(size_t begin, size_t end) {
  if (begin >= end) return 0;
  size_t removed = 0;
  std::vector<std::pair<size_t, size_t>> kept;
  kept.reserve(spans_.size() + 1);
  for (const auto& span : spans_) {
    if (span.second <= begin || span.first >= end) {
      kept.push_back(span);
      continue;
    }
    removed += std::min(span.second, end) - std::max(span.first, begin);
    if (span.first < begin) kept.emplace_back(span.first, begin);
    if (span.second > end) kept.emplace_back(end, span.second);
  }
  spans_.swap(kept);
  total_ -= removed;
  return removed;
}

std::vector<std::pair<size_t, size_t>>::const_iterator SpanSet::first_ending_after(size_t offset) const {
  return std::upper_bound(spans_.begin(), spans_.end(), offset,
                          [](size_t at, const std::pair<size_t, size_t>& span) { return at < span.second; });
}

bool SpanSet::overlaps(size_t begin, size_t end) const {
  const auto span = first_ending_after(begin);
  return begin < end && span != spans_.end() && span->first < end;
}

}  // namespace uvm
