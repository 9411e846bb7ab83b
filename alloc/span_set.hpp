// A set of disjoint byte spans [begin, end), kept sorted and merged. Each allocation uses one to
// remember which of its bytes uvm last moved to the host.
#pragma once

#include <cstddef>
#include <cstdint>
#include <utility>
#include <vector>

namespace uvm {

class SpanSet {
 public:
  // Adds [begin, end); returns how many bytes were not in the set before.
  size_t add(size_t begin, size_t end);
  // Removes [begin, end); returns how many bytes were in the set.
  size_t remove(size_t begin, size_t end);
  size_t total() const { return total_; }
  // Whether any byte of [begin, end) is in the set (a binary search: block calls ask on every block).
  bool overlaps(size_t begin, size_t end) const;
  // The first span that ends after `offset`: where a walk over [offset, ...) starts.
  std::vector<std::pair<size_t, size_t>>::const_iterator first_ending_after(size_t offset) const;
  const std::vector<std::pair<size_t, size_t>>& spans() const { return spans_; }

 private:
  std::vector<std::pair<size_t, size_t>> spans_;
  size_t total_ = 0;
};

}  // namespace uvm

namespace uvm {

// One byte range [begin, end) of the address space.
struct Span {
  uintptr_t begin = 0;
  uintptr_t end = 0;
  size_t size() const { return end - begin; }
};

}  // namespace uvm
