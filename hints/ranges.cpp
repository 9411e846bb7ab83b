#include "ranges.hpp"

#include <algorithm>

namespace uvm {

std::vector<HintRange> coalesce(std::vector<HintRange> ranges) {
  std::sort(ranges.begin(), ranges.end(),
            [](const HintRange& a, const HintRange& b) { return a.begin < b.begin; });
  std::vector<HintRange> merged;
  merged.reserve(ranges.size());
  for (const HintRange& range : ranges) {
    if (!merged.empty()) {
      HintRange& last = merged.back();
      const bool same_allocation = range.allocation != 0 && range.allocation == last.allocation;
      const bool joins = same_allocation ? range.begin <= last.end : range.begin < last.end;
      if (joins) {
        last.end = std::max(last.end, range.end);
        continue;
      }
    }
    merged.push_back(range);
  }
  return merged;
}

}  // namespace uvm
