// Where a recorded move goes once its call returns: this thread's last move for its device
// (uvm_last_move, last_move.cpp) and the UVM_TRACE file (trace_file.cpp).
#pragma once

#include <memory>
#include <vector>

#include "trace.hpp"

namespace uvm {

// A published move with its intervals on the host clock and no CUDA events left: what the sinks
// keep once a move's marks have completed.
struct TimedMove : MoveFacts {
  std::vector<TimedInterval> intervals;
};

// `log` timed (waiting for its marks with `wait`); false while a mark has not completed.
bool time_move(const MoveLog& log, bool wait, TimedMove* out);

// Hands a finished move to both sinks.
void publish_move(const std::shared_ptr<const MoveLog>& log);

// Keeps `log` as this thread's last move on its device, timed already where `timed` is given.
void keep_last_move(const std::shared_ptr<const MoveLog>& log, const TimedMove* timed);

// Whether UVM_TRACE names a file; then write_to_trace_file queues `log` and writes every queued
// move whose marks have completed.
bool trace_file_wanted();
void write_to_trace_file(const std::shared_ptr<const MoveLog>& log, const TimedMove* timed);

}  // namespace uvm
