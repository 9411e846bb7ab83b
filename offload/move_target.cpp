#include "move_target.hpp"

#include <algorithm>

#include "../hints/ranges.hpp"

namespace uvm {

uvm_status resolve_target(const Call& call, const uvm_range* ranges, size_t count, MoveTarget* target) {
  if (uvm_status s = resolve_and_coalesce(call, ranges, count, &target->merged)) return s;
  if (target->merged.empty()) return UVM_OK;
  int lowest = target->merged.front().owner_device, highest = lowest;
  for (const HintRange& range : target->merged) {
    lowest = std::min(lowest, range.owner_device);
    highest = std::max(highest, range.owner_device);
  }
  if (lowest != highest) {
    return fail(call, UVM_ERROR_INVALID_ARGUMENT,
                "the ranges belong to devices %d and %d; move each device's ranges in a call of its "
                "own, on a stream of that device",
                lowest, highest);
  }
  target->device = lowest;
  return check_hint_support(call, target->device, &target->caps);
}

uvm_status enter_device(const Call& call, int device, cudaStream_t stream, ContextScope* scope) {
  if (uvm_status s = scope->enter(call, device, ContextScope::When::always)) return s;
  return check_not_capturing(call, stream);
}

HintRange clipped(const HintRange& range, const Span& span) {
  HintRange piece = range;
  piece.begin = span.begin;
  piece.end = span.end;
  return piece;
}

std::vector<Span> spans_of(const std::vector<HintRange>& ranges) {
  std::vector<Span> spans;
  for (const HintRange& range : ranges) spans.push_back(Span{range.begin, range.end});
  return spans;
}

}  // namespace uvm
