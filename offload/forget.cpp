// The one "forget these bytes" hook (alloc/moves.hpp): the staged copies this room keeps and the
// last moves hints/order keeps are the only state about bytes that outlives a call.
#include "../alloc/moves.hpp"
#include "../hints/order.hpp"
#include "staging.hpp"

namespace uvm {

void forget_moved_state(uintptr_t begin, uintptr_t end) {
  staging().release(begin, end, nullptr);
  forget_last_moves(begin, end);
}

}  // namespace uvm
