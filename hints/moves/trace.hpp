// A record of every move: which phases (pinning, copies, discards, mapping…) a call ran, with their
// bytes and times, kept as the calling thread's last move per device (uvm_last_move), written to
// UVM_TRACE as a Chrome trace, and marked with NVTX ranges for Nsight Systems. Users ask for
// per-phase timings when a sleep or wake is slow; this answers without a profiler.
//
// Phases on the host are timed with the host clock; phases on a stream with CUDA timing events,
// placed on the host clock through a per-device epoch (an event known to have completed at a known
// host time). Recording never fails a move: a mark that cannot be had leaves its phase out.
#pragma once

#include <cuda_runtime_api.h>

#include <cstddef>
#include <cstdint>
#include <memory>
#include <vector>

#include "../../alloc/events.hpp"

namespace uvm {

enum class Phase : uint8_t {
  pin,       // pinning staging memory (host)
  wait,      // waiting on the host for copies before giving memory back
  copy,      // cudaMemcpyAsync between the device and pinned staging memory
  discard,   // cudaMemDiscardBatchAsync
  release,   // giving releasable allocations' physical memory back (host: cuMemUnmap, cuMemRelease)
  map,       // mapping new physical memory for releasable allocations (host: cuMemCreate, cuMemMap)
  populate,  // prefetches that populate device pages around an onload's copies
  migrate,   // cudaMemPrefetchAsync moving pages between host and device
  write,     // copies out to pageable memory or disk through bounce buffers (host)
  read,      // copies back from pageable memory or disk through bounce buffers (host)
  code,      // compressed copies: chunks coded on the GPU and copied out, or copied in and decoded
};
constexpr int kPhaseCount = 11;

// The phase's name as reports and traces print it ("copy").
const char* phase_name(Phase phase);

// A host clock in seconds, the one every recorded time is placed on.
double host_seconds();

// A small number naming the calling thread (1, 2, …), for lookups and the trace's lanes.
uint64_t thread_number();

// One timed operation of a phase: on the host (events null) or between two marks on a stream.
struct Interval {
  Phase phase = Phase::copy;
  size_t bytes = 0;
  int lane = -1;  // -1: the calling thread; 0: the caller's stream; 1…: uvm's worker streams
  uintptr_t address = 0;  // the device address it starts at, where one applies
  double host_begin = 0, host_end = 0;
  EventRef begin, end;
};

// What a move call was, once it returned: kept by both the log and its timed form.
struct MoveFacts {
  const char* call = "";
  int device = 0;
  int status = 0;
  size_t bytes = 0;  // what the call moved
  double host_begin = 0, host_end = 0;
  uint64_t thread = 0;  // a small number per host thread, for the trace's lanes
};

// Everything recorded of one move call.
struct MoveLog : MoveFacts {
  EventRef epoch;       // the device's clock epoch: completed at host time epoch_host
  double epoch_host = 0;
  std::vector<Interval> intervals;
  uint64_t nvtx_range = 0;
};

// Records the move call made inside its lifetime on the calling thread (the C entry makes one around
// its body), then publishes it as this thread's last move for its device and to UVM_TRACE. Never
// throws; a record that cannot be kept (host memory) records nothing. A record made inside another
// (a move calling a move) adds nothing: the outer one has it all.
class MoveRecord {
 public:
  explicit MoveRecord(const char* call) noexcept;
  ~MoveRecord();
  MoveRecord(const MoveRecord&) = delete;
  MoveRecord& operator=(const MoveRecord&) = delete;
  // Keeps the call's status and returns it: `return record.done(guarded(...))`.
  uvm_status done(uvm_status status) noexcept;

 private:
  std::unique_ptr<MoveLog> log_;
};

// The trace's side of a group of moves (offload/moves/group.hpp owns the group itself: uvm_begin_moves):
// from join_move_records until publish_joined_records, each of the calling thread's move records
// joins one record per device, so that uvm_last_move and UVM_TRACE show the group's calls on a
// device as one move, named after the first, with the first failure's status. Called by the
// group's outermost begin and end. join_move_records may throw std::bad_alloc (the C entry's guard
// reports it).
void join_move_records();
void publish_joined_records();

// The device the recorded move runs on, once its context is current: starts the epoch that places
// its stream marks on the host clock. A move that never names one is not published.
void trace_move_device(int device);

// Adds to the bytes the recorded move moves.
void trace_move_bytes(size_t bytes);

// A phase timed on the host, from construction until finish() (or destruction, after a failure).
class HostPhase {
 public:
  explicit HostPhase(Phase phase);
  ~HostPhase();
  HostPhase(const HostPhase&) = delete;
  HostPhase& operator=(const HostPhase&) = delete;
  void finish(size_t bytes);

 private:
  Phase phase_;
  double begin_;
  bool open_;
  uint64_t nvtx_range_ = 0;
};

// A phase timed on `stream` between a mark made at construction and one made by next() or
// finish(). next() ends this phase and starts another at the same mark (one event for both).
// `address`: the device bytes it works on start there (a trace shows which chunk was slow).
class StreamPhase {
 public:
  StreamPhase(Phase phase, cudaStream_t stream, int lane = 0, uintptr_t address = 0);
  ~StreamPhase();
  StreamPhase(const StreamPhase&) = delete;
  StreamPhase& operator=(const StreamPhase&) = delete;
  void next(Phase phase, size_t bytes_done);
  void finish(size_t bytes);

 private:
  void end(size_t bytes, bool start_another);
  Phase phase_;
  cudaStream_t stream_;
  int lane_;
  uintptr_t address_;
  EventRef begin_;
  bool open_;
  uint64_t nvtx_range_ = 0;
};

// An interval placed on the host clock (seconds, host_seconds()).
struct TimedInterval {
  Phase phase;
  size_t bytes;
  int lane;
  uintptr_t address;
  double begin, end;
};

// `log`'s intervals on the host clock, in the order recorded; false while a mark has not completed
// (with `wait`: after waiting for them). A mark that cannot be timed leaves its interval out.
bool time_intervals(const MoveLog& log, bool wait, std::vector<TimedInterval>* out);

}  // namespace uvm
