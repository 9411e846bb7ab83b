// uvm_offload_selection, uvm_onload_selection and uvm_discard_selection: whole allocations, chosen
// by device and tags where the move begins (under the moves lock that uvm_free takes too), each
// device's in one move. A caller that listed the allocations first and then moved their ranges
// could move bytes at an address that another thread had freed and handed to another allocation.
#include <vector>

#include "../../alloc/registry.hpp"
#include "../../hints/discard_batch.hpp"
#include "../../hints/moves/trace.hpp"
#include "offload.hpp"
#include "onload.hpp"

namespace uvm {
namespace {

// Handles that name no device's stream but each device's own (its legacy or per-thread stream, in
// its context): the only ones a move of every device can take.
bool names_no_device(cudaStream_t stream) {
  return stream == nullptr || stream == cudaStreamLegacy || stream == cudaStreamPerThread;
}

// Moves the selection of `device` and `tags`, one device at a time, each in its own context and
// recorded as its own move (uvm_last_move of that device). `move` runs one device's part; a
// strategy is checked first, so that a bad one fails where nothing is selected too.
template <typename Move>
uvm_status move_selection(const char* name, int device, const char* const* tags, size_t tag_count,
                          cudaStream_t stream, size_t* bytes, Move move, int strategy = UVM_STRATEGY_AUTO) {
  const Call call = Call::of(name).with_selection(device).with_tags(tags, tag_count);
  return guarded(call, [&] {
    if (bytes != nullptr) *bytes = 0;
    if (!is_strategy(strategy)) return fail(call, UVM_ERROR_INVALID_ARGUMENT, "strategy %d is not a uvm_strategy", strategy);
    Selection selection;
    if (uvm_status s = select_arguments(call, device, tags, tag_count, &selection)) return s;
    if (device == UVM_ANY_DEVICE && !names_no_device(stream)) {
      return fail(call, UVM_ERROR_INVALID_ARGUMENT,
                  "stream %p belongs to one device; with UVM_ANY_DEVICE pass NULL, cudaStreamLegacy or "
                  "cudaStreamPerThread (each device's own), or move each device in a call of its own",
                  static_cast<void*>(stream));
    }
    // Read without the moves lock: which devices to begin a move on; each move selects again under it.
    for (int on : registry().devices_of(selection)) {
      Selection of_device = selection;
      of_device.device = on;
      size_t moved = 0;
      MoveRecord record(name);
      ContextScope scope;  // a stream that names no device is this one's (a discard's too)
      uvm_status status = scope.enter(call, on, ContextScope::When::always);
      if (status == UVM_OK) status = move(call, MoveArgs::selected(of_device, &moved), stream);
      if (record.done(status) != UVM_OK) return status;
      if (bytes != nullptr) *bytes += moved;
    }
    return UVM_OK;
  });
}

}  // namespace
}  // namespace uvm

extern "C" {

uvm_status uvm_offload_selection(int device, const char* const* tags, size_t tag_count, uvm_strategy strategy,
                                 cudaStream_t stream, size_t* bytes) {
  const int requested = uvm::raw_enum(strategy);
  return uvm::move_selection("uvm_offload_selection", device, tags, tag_count, stream, bytes,
                             [&](const uvm::Call& call, const uvm::MoveArgs& args, cudaStream_t on) {
                               return uvm::offload_moves(call, args, requested, on);
                             },
                             requested);
}

uvm_status uvm_onload_selection(int device, const char* const* tags, size_t tag_count, cudaStream_t stream,
                                size_t* bytes) {
  return uvm::move_selection("uvm_onload_selection", device, tags, tag_count, stream, bytes,
                             [](const uvm::Call& call, const uvm::MoveArgs& args, cudaStream_t on) {
                               uvm::OnloadMode mode;
                               mode.name = "uvm_onload_selection";
                               return uvm::onload_moves(call, args, on, mode);
                             });
}

uvm_status uvm_discard_selection(int device, const char* const* tags, size_t tag_count, cudaStream_t stream,
                                 size_t* bytes) {
  return uvm::move_selection("uvm_discard_selection", device, tags, tag_count, stream, bytes, uvm::discard_moves);
}

}  // extern "C"
