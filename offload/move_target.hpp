// What offload and onload share: the merged ranges of one call and the one device they belong to.
#pragma once

#include <vector>

#include "../alloc/span_set.hpp"
#include "../hints/hint_range.hpp"

namespace uvm {

// The merged ranges of one call, all of one device: one stream belongs to one device.
struct MoveTarget {
  std::vector<HintRange> merged;
  int device = 0;
  DeviceCaps caps;
};

// Validates and merges the ranges, checks they belong to one device (named in order, not by heap
// address) and that it supports hints.
uvm_status resolve_target(const Call& call, const uvm_range* ranges, size_t count, MoveTarget* target);

// Enters the device's own context, so that uvm's streams and events belong with the caller's
// stream, and checks the stream is not being captured.
uvm_status enter_device(const Call& call, int device, cudaStream_t stream, ContextScope* scope);

// `range` cut down to `span` (which lies inside it).
HintRange clipped(const HintRange& range, const Span& span);

std::vector<Span> spans_of(const std::vector<HintRange>& ranges);

}  // namespace uvm
