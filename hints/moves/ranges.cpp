#include "ranges.hpp"

#include <algorithm>

namespace uvm {

uvm_status resolve_ranges(const Call& call, const uvm_range* ranges, size_t count,
                          std::vector<HintRange>* resolved) {
  if (count == 0) return UVM_OK;
  if (ranges == nullptr) return fail(call, UVM_ERROR_INVALID_ARGUMENT, "ranges is NULL");
  resolved->reserve(count);
  for (size_t i = 0; i < count; ++i) {
    if (ranges[i].size == 0) continue;
    HintRange range;
    const Call item = Call::of("range").with_ptr(ranges[i].ptr).with_size(ranges[i].size);
    if (uvm_status s = resolve_range(item, ranges[i].ptr, ranges[i].size, &range)) {
      return fail(call.at_range(i), s, "range %zu of %zu is invalid: %s", i, count, uvm_last_error());
    }
    resolved->push_back(range);
  }
  return UVM_OK;
}

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

uvm_status resolve_and_coalesce(const Call& call, const uvm_range* ranges, size_t count,
                                std::vector<HintRange>* merged) {
  std::vector<HintRange> resolved;
  if (uvm_status s = resolve_ranges(call, ranges, count, &resolved)) return s;
  *merged = coalesce(std::move(resolved));
  return UVM_OK;
}

}  // namespace uvm
