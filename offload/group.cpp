// uvm_begin_moves and uvm_end_moves: the calling thread's move calls in between are one move to the
// trace (hints/moves/trace.hpp) and to the staging store, which shrinks once, at the end.
#include "group.hpp"

#include "../hints/moves/trace.hpp"
#include "staging.hpp"

namespace uvm {
namespace {

thread_local bool staging_free_owed = false;  // an offload of the open group staged bytes
thread_local size_t staging_expected = 0;     // what the open group's offloads expect to stage
thread_local size_t staging_reserved = 0;     // what they reserved so far

}  // namespace

void free_unused_staging_after_offload() {
  if (in_move_group()) {
    staging_free_owed = true;
    return;
  }
  staging().free_unused_in_background();
}

size_t staging_to_pin_ahead(size_t wanted) {
  if (!in_move_group()) return 0;
  const size_t planned = staging_reserved + wanted;
  return staging_expected > planned ? staging_expected - planned : 0;
}

void note_staging_reserved(size_t bytes) {
  if (in_move_group()) staging_reserved += bytes;
}

}  // namespace uvm

extern "C" uvm_status uvm_begin_moves(size_t staging_bytes) {
  const uvm::Call call = uvm::Call::of("uvm_begin_moves").with_size(staging_bytes);
  return uvm::guarded(call, [&] {
    uvm::begin_move_group();
    uvm::staging_expected += staging_bytes;  // a nested group's offloads are the outer one's too
    return UVM_OK;
  });
}

extern "C" uvm_status uvm_end_moves(void) {
  const uvm::Call call = uvm::Call::of("uvm_end_moves");
  return uvm::guarded(call, [&] {
    if (!uvm::end_move_group()) {
      return uvm::fail(call, UVM_ERROR_INVALID_ARGUMENT, "no uvm_begin_moves is open on this thread");
    }
    if (uvm::in_move_group()) return UVM_OK;
    uvm::staging_expected = uvm::staging_reserved = 0;
    if (uvm::staging_free_owed) {
      uvm::staging_free_owed = false;
      uvm::staging().free_unused_in_background();
    }
    return UVM_OK;
  });
}
