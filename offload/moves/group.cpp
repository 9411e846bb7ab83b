// uvm_begin_moves and uvm_end_moves: the calling thread's move calls in between are one move to the
// trace (hints/moves/trace.hpp) and to the staging store, which shrinks once, at the end.
#include "group.hpp"

#include "../../hints/moves/trace.hpp"
#include "../media/staging.hpp"

namespace uvm {
namespace {

// The calling thread's open group of moves, all of its state: how deeply its begins nest, and what
// its offloads expect to stage, have reserved, and owe the staging store. (Its calls' joined
// records are the trace's: join_move_records.)
struct OpenGroup {
  int depth = 0;
  size_t staging_expected = 0;     // what the group's offloads expect to stage (uvm_begin_moves)
  size_t staging_reserved = 0;     // what they reserved so far
  bool staging_free_owed = false;  // an offload of the group staged bytes: free what is unused at the end
};
thread_local OpenGroup open_group;

bool in_group() { return open_group.depth > 0; }

}  // namespace

void free_unused_staging_after_offload() {
  if (in_group()) {
    open_group.staging_free_owed = true;
    return;
  }
  staging().free_unused_in_background();
}

size_t staging_to_pin_ahead(size_t wanted) {
  if (!in_group()) return 0;
  const size_t planned = open_group.staging_reserved + wanted;
  return open_group.staging_expected > planned ? open_group.staging_expected - planned : 0;
}

void note_staging_reserved(size_t bytes) {
  if (in_group()) open_group.staging_reserved += bytes;
}

}  // namespace uvm

extern "C" uvm_status uvm_begin_moves(size_t staging_bytes) {
  const uvm::Call call = uvm::Call::of("uvm_begin_moves").with_size(staging_bytes);
  return uvm::guarded(call, [&] {
    if (uvm::open_group.depth == 0) uvm::join_move_records();
    ++uvm::open_group.depth;
    uvm::open_group.staging_expected += staging_bytes;  // a nested group's offloads are the outer one's too
    return UVM_OK;
  });
}

extern "C" uvm_status uvm_end_moves(void) {
  const uvm::Call call = uvm::Call::of("uvm_end_moves");
  return uvm::guarded(call, [&] {
    if (uvm::open_group.depth == 0) {
      return uvm::fail(call, UVM_ERROR_INVALID_ARGUMENT, "no uvm_begin_moves is open on this thread");
    }
    if (--uvm::open_group.depth > 0) return UVM_OK;
    uvm::publish_joined_records();
    const bool owed = uvm::open_group.staging_free_owed;
    uvm::open_group = uvm::OpenGroup{};
    if (owed) uvm::staging().free_unused_in_background();
    return UVM_OK;
  });
}
