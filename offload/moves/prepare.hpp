// What a pause tells uvm_prepare_pause (prepare.cpp): the two must not pin for the same allocations
// at once.
#pragma once

#include "../../alloc/registry.hpp"

namespace uvm {

// A pause that will stage bytes of `selection`, for as long as it lives: a preparation of any of
// them under way stops after the batch it is pinning, and one asked meanwhile pins nothing. The
// pause pins the rest for itself; a preparation going on beside it pinned the same allocations a
// second time (they hold no copy until the pause has issued theirs) and took its share of the
// host's page-fault rate.
class PauseUnderway {
 public:
  explicit PauseUnderway(const Selection& selection);
  ~PauseUnderway();
  PauseUnderway(const PauseUnderway&) = delete;
  PauseUnderway& operator=(const PauseUnderway&) = delete;

 private:
  const Selection selection_;
};

}  // namespace uvm
