// How a move starts. Prefetch, discard, offload and onload all begin here, in this order:
//   1. the options are understood (alloc/options.hpp);
//   2. the moves lock is taken (alloc/moves.hpp): until the move has recorded what it did, no other
//      move, uvm_free or block call changes the registry under it;
//   3. the ranges are resolved and merged (ranges.hpp); with none left there is nothing to do;
//   4. the kind's checks (below), before anything reaches the driver;
//   5. the deciding device's context is entered, as the kind's rule says;
//   6. the move is traced on that device (trace.hpp), with its bytes;
//   7. the stream is not being captured (a discard on the legacy stream takes uvm's ordering stream);
//   8. the stream waits for the last move of every allocation the ranges touch (order.hpp).
// What differs between the four kinds is written once, in begin.cpp's rules, not in four preambles.
#pragma once

#include <cuda_runtime_api.h>

#include <mutex>
#include <optional>
#include <vector>

#include "../../alloc/devices.hpp"
#include "../../alloc/registry.hpp"
#include "../../alloc/span_set.hpp"
#include "hint_range.hpp"

namespace uvm {

enum class MoveKind {
  // To `location` (a device or the CPU), of managed memory only; each range's deciding device must
  // have concurrent managed access. Runs in the caller's context where one is current: the stream
  // (and the timing events recorded on it) belong to it, and a prefetch to the CPU may name
  // allocations of several devices.
  prefetch,
  // Of managed memory where the driver can discard (CUDA 13), and of releasable memory. The
  // caller's context, as for prefetch.
  discard,
  // Offload and onload: every range on one device, whose context they run in, always, since they
  // use uvm's streams and events of that device; the caller passes a stream of that device.
  offload,
  onload,
};

// What a call moves: one range (uvm_prefetch, uvm_discard), a batch, or a selection of whole
// allocations (uvm_offload_selection…, uvm_pause, uvm_resume).
struct MoveArgs {
  const void* ptr = nullptr;
  size_t size = 0;
  const uvm_range* ranges = nullptr;
  size_t count = 0;
  bool batch = false;
  int location = 0;  // prefetch only
  // The allocations are chosen at step 3, under the moves lock that uvm_free takes too: one freed
  // or made by another thread meanwhile is moved whole or not at all, and an address freed and
  // handed to another allocation is never moved for the old one.
  const Selection* selection = nullptr;
  size_t* selected_bytes = nullptr;  // if set, the bytes of the allocations selected
  // On success, still under the lock, the selected allocations are marked paused or not.
  std::optional<bool> mark_paused;

  static MoveArgs one(const void* ptr, size_t size) {
    MoveArgs args;
    args.ptr = ptr;
    args.size = size;
    return args;
  }
  static MoveArgs of(const uvm_range* ranges, size_t count) {
    MoveArgs args;
    args.ranges = ranges;
    args.count = count;
    args.batch = true;
    return args;
  }
  static MoveArgs selected(const Selection& selection, size_t* bytes = nullptr) {
    MoveArgs args;
    args.selection = &selection;
    args.selected_bytes = bytes;
    return args;
  }
  MoveArgs& to(int where) { location = where; return *this; }
  MoveArgs& marking_paused(bool paused) { mark_paused = paused; return *this; }
};

// A move begun: held for the call, it holds the moves lock and the context it entered.
class MoveScope {
 public:
  std::vector<HintRange> ranges;  // merged, sorted; empty: nothing to move
  int device = 0;                 // the device whose capabilities decided, and whose context it entered
  DeviceCaps caps;                // that device's (offload, onload)
  cudaStream_t stream = nullptr;  // the stream the move issues on (a discard's legacy stream replaced)
  std::vector<uintptr_t> selected; // a selection's allocations, by base

  // Lets go of the moves lock, keeping the context: an offload pins staging memory (seconds for
  // GiBs) with no lock held, then begins again.
  void unlock() { lock_.unlock(); }

 private:
  friend uvm_status begin_move(const Call& call, MoveKind kind, const MoveArgs& args, cudaStream_t stream,
                               MoveScope* move);
  std::unique_lock<std::mutex> lock_;
  ContextScope scope_;
};

// Runs the steps above for a move of `kind`; `move` is fresh. On UVM_OK with `move->ranges` empty
// there is nothing to move (steps 4–8 were skipped).
uvm_status begin_move(const Call& call, MoveKind kind, const MoveArgs& args, cudaStream_t stream, MoveScope* move);

// A move's last step, with its lock still held: once `status` is UVM_OK, marks a selection's
// allocations paused or not when `args` asks to. Returns `status`.
uvm_status finish_move(uvm_status status, const MoveArgs& args, const MoveScope& move);

// `range` cut down to `span` (which lies inside it).
HintRange clipped(const HintRange& range, const Span& span);

std::vector<Span> spans_of(const std::vector<HintRange>& ranges);

}  // namespace uvm
