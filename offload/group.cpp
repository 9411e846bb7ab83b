// uvm_begin_moves and uvm_end_moves: the calling thread's move calls in between are one move to the
// trace (hints/moves/trace.hpp) and to the staging store, which shrinks once, at the end.
#include "group.hpp"

#include "../hints/moves/trace.hpp"
#include "staging.hpp"

namespace uvm {
namespace {

thread_local bool staging_free_owed = false;  // an offload of the open group staged bytes

}  // namespace

void free_unused_staging_after_offload() {
  if (in_move_group()) {
    staging_free_owed = true;
    return;
  }
  staging().free_unused_in_background();
}

}  // namespace uvm

extern "C" uvm_status uvm_begin_moves(void) {
  const uvm::Call call = uvm::Call::of("uvm_begin_moves");
  return uvm::guarded(call, [] {
    uvm::begin_move_group();
    return UVM_OK;
  });
}

extern "C" uvm_status uvm_end_moves(void) {
  const uvm::Call call = uvm::Call::of("uvm_end_moves");
  return uvm::guarded(call, [&] {
    if (!uvm::end_move_group()) {
      return uvm::fail(call, UVM_ERROR_INVALID_ARGUMENT, "no uvm_begin_moves is open on this thread");
    }
    if (!uvm::in_move_group() && uvm::staging_free_owed) {
      uvm::staging_free_owed = false;
      uvm::staging().free_unused_in_background();
    }
    return UVM_OK;
  });
}
