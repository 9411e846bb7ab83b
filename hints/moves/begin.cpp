#include "begin.hpp"

#include <algorithm>
#include <set>

#include "../../alloc/moves.hpp"
#include "../../alloc/options.hpp"
#include "../../share/export.hpp"
#include "order.hpp"
#include "ranges.hpp"
#include "streams.hpp"
#include "trace.hpp"

namespace uvm {
namespace {

uvm_status resolve_selection(const Call& call, const MoveArgs& args, MoveScope* move) {
  std::vector<uvm_range> ranges;
  size_t bytes = 0;
  for (const AllocationView& found : registry().select(*args.selection)) {
    ranges.push_back(uvm_range{reinterpret_cast<const void*>(found.base), found.size});
    move->selected.push_back(found.base);
    bytes += found.size;
  }
  if (args.selected_bytes != nullptr) *args.selected_bytes = bytes;
  return resolve_and_coalesce(call, ranges.data(), ranges.size(), &move->ranges);
}

uvm_status resolve(const Call& call, const MoveArgs& args, MoveScope* move) {
  std::vector<HintRange>* merged = &move->ranges;
  if (args.selection != nullptr) return resolve_selection(call, args, move);
  if (args.batch) return resolve_and_coalesce(call, args.ranges, args.count, merged);
  if (args.size == 0) return UVM_OK;
  HintRange range;
  if (uvm_status s = resolve_range(call, args.ptr, args.size, &range)) return s;
  merged->push_back(range);
  return UVM_OK;
}

uvm_status check_prefetch(const Call& call, int location, MoveScope* move) {
  if (uvm_status s = check_all_managed(call, move->ranges, "prefetch")) return s;
  if (uvm_status s = check_device(call, location, true)) return s;
  // Every range's deciding device is checked before anything is issued: ranges to the CPU may come
  // from allocations on several devices.
  for (const HintRange& range : move->ranges) {
    if (uvm_status s = check_hint_support(call, deciding_device(location, range))) return s;
  }
  move->device = deciding_device(location, move->ranges.front());
  return UVM_OK;
}

uvm_status check_discard(const Call& call, MoveScope* move) {
  std::set<int> checked;
  for (const HintRange& range : move->ranges) {
    if (range.releasable) continue;  // uvm releases its physical memory: no driver discard needed
    if (!checked.insert(range.owner_device).second) continue;
    DeviceCaps caps;
    if (uvm_status s = check_hint_support(call, range.owner_device, &caps)) return s;
    if (!caps.discard_supported) {
      return fail(call, UVM_ERROR_UNSUPPORTED,
                  "discard needs a CUDA 13 runtime and driver (cudaMemDiscardBatchAsync); this "
                  "build or driver is older");
    }
  }
  move->device = move->ranges.front().owner_device;
  return UVM_OK;
}

// Offload and onload: one device (named in order, not by heap address), which supports hints.
uvm_status check_one_device(const Call& call, MoveScope* move) {
  int lowest = move->ranges.front().owner_device, highest = lowest;
  for (const HintRange& range : move->ranges) {
    lowest = std::min(lowest, range.owner_device);
    highest = std::max(highest, range.owner_device);
  }
  if (lowest != highest) {
    return fail(call, UVM_ERROR_INVALID_ARGUMENT,
                "the ranges belong to devices %d and %d; move each device's ranges in a call of its "
                "own, on a stream of that device",
                lowest, highest);
  }
  move->device = lowest;
  return check_hint_support(call, move->device, &move->caps);
}

}  // namespace

uvm_status begin_move(const Call& call, MoveKind kind, const MoveArgs& args, cudaStream_t stream, MoveScope* move) {
  if (uvm_status s = check_options(call)) return s;
  move->lock_ = lock_moves();
  if (uvm_status s = resolve(call, args, move)) return s;
  if (move->ranges.empty()) return UVM_OK;
  const bool one_device = kind == MoveKind::offload || kind == MoveKind::onload;
  uvm_status checked = UVM_OK;
  if (kind == MoveKind::prefetch) checked = check_prefetch(call, args.location, move);
  else if (kind == MoveKind::discard) checked = check_discard(call, move);
  else checked = check_one_device(call, move);
  if (checked != UVM_OK) return checked;
  if (kind == MoveKind::offload || kind == MoveKind::discard) {  // another process may map them
    const char* what = kind == MoveKind::offload ? "an offload" : "a discard";
    for (const HintRange& range : move->ranges) {
      if (!range.releasable) continue;
      if (uvm_status s = check_not_shared(call, range.allocation, what)) return s;
    }
  }
  const auto when = one_device ? ContextScope::When::always : ContextScope::When::only_if_none_current;
  if (uvm_status s = move->scope_.enter(call, move->device, when)) return s;
  trace_move_device(move->device);
  if (kind != MoveKind::offload) {  // an offload counts the bytes it moves, round by round
    for (const HintRange& range : move->ranges) trace_move_bytes(range.end - range.begin);
  }
  if (uvm_status s = check_not_capturing(call, stream)) return s;
  if (kind == MoveKind::discard && is_legacy_stream(stream)) {
    if (uvm_status s = ordering_stream(call, &stream)) return s;
  }
  move->stream = stream;
  // A move of bytes another move still works on, on another stream (an onload copying back on
  // uvm's worker streams), would meet it on the GPU: it waits for it.
  return wait_for_last_moves(call, move->ranges, stream);
}

uvm_status finish_move(uvm_status status, const MoveArgs& args, const MoveScope& move) {
  if (status == UVM_OK && args.mark_paused) registry().set_paused(move.selected, *args.mark_paused);
  return status;
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
