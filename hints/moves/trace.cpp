#include "trace.hpp"

#include <atomic>
#include <chrono>
#include <map>
#include <mutex>

#if __has_include(<nvtx3/nvToolsExt.h>)
#include <nvtx3/nvToolsExt.h>
#define UVM_HAVE_NVTX 1
#endif

#include "../../alloc/devices.hpp"
#include "trace_sinks.hpp"

namespace uvm {
namespace {

// An epoch's event must be this recent: elapsed times are floats in milliseconds, which keep about
// a microsecond of resolution up to 10 s.
constexpr double kEpochLifetimeSeconds = 10.0;
// How long a new epoch's event may take to complete on an idle stream before timing gives up.
constexpr double kEpochWaitSeconds = 0.1;

thread_local MoveLog* current_log = nullptr;

// The records of the calling thread's open group of moves (join_move_records): one per device its
// calls moved on. Held on the heap and deleted when published: a group a thread leaves open when
// it exits is leaked, so that no thread's exit destroys CUDA events.
struct JoinedRecords {
  std::vector<std::unique_ptr<MoveLog>> logs;
};
thread_local JoinedRecords* joined_records = nullptr;

MoveLog* group_log(int device) {
  for (const std::unique_ptr<MoveLog>& log : joined_records->logs) {
    if (log->device == device) return log.get();
  }
  return nullptr;
}

// NVTX ranges (start/end, not push/pop: a move's phases overlap), in a "uvm" domain. Costs a
// branch when no tool is attached; compiled out where the toolkit has no NVTX headers.
#ifdef UVM_HAVE_NVTX
nvtxDomainHandle_t nvtx_domain() {
  static const nvtxDomainHandle_t domain = nvtxDomainCreateA("uvm");
  return domain;
}
uint64_t nvtx_start(const char* name) {
  nvtxEventAttributes_t attributes = {};
  attributes.version = NVTX_VERSION;
  attributes.size = NVTX_EVENT_ATTRIB_STRUCT_SIZE;
  attributes.messageType = NVTX_MESSAGE_TYPE_ASCII;
  attributes.message.ascii = name;
  return nvtxDomainRangeStartEx(nvtx_domain(), &attributes);
}
void nvtx_end(uint64_t range) { nvtxDomainRangeEnd(nvtx_domain(), range); }
#else
uint64_t nvtx_start(const char*) { return 0; }
void nvtx_end(uint64_t) {}
#endif

// A timing event recorded on `stream` now, or null.
EventRef try_mark(cudaStream_t stream) {
  const RelaxedCapture relaxed;
  return try_record_timing(stream);
}

struct Epoch {
  EventRef event;
  double host = 0;
};

// Per device: a mark on an idle stream of uvm's own, and the host time at which it was seen
// complete. A mark's host time is then the epoch's plus the elapsed time between the two events.
class Epochs {
 public:
  Epoch of(int device) {
    const RelaxedCapture relaxed;
    std::lock_guard<std::mutex> lock(mutex_);
    Epoch& epoch = epochs_[device];
    if (epoch.event && host_seconds() - epoch.host < kEpochLifetimeSeconds) return epoch;
    epoch = Epoch{};
    cudaStream_t& idle = idle_streams_[device];
    if (idle == nullptr &&
        clear_cuda_error(cudaStreamCreateWithFlags(&idle, cudaStreamNonBlocking)) != cudaSuccess) {
      idle = nullptr;
      return epoch;
    }
    EventRef mark = try_mark(idle);
    if (!mark) return epoch;
    // Polled rather than synchronized: nothing else runs on this stream, so it completes at once.
    const double deadline = host_seconds() + kEpochWaitSeconds;
    cudaError_t e;
    while ((e = cudaEventQuery(mark->handle)) == cudaErrorNotReady && host_seconds() < deadline) {
    }
    if (clear_cuda_error(e) == cudaSuccess) epoch = Epoch{mark, host_seconds()};
    return epoch;
  }

 private:
  std::mutex mutex_;
  std::map<int, Epoch> epochs_;
  std::map<int, cudaStream_t> idle_streams_;  // kept for the life of the process, like uvm's streams
};

Epochs& epochs() {
  static Epochs* const instance = new Epochs();  // never destroyed: no CUDA call at exit
  return *instance;
}

// Whether `mark` has completed (waiting for it first with `wait`); false also if it failed.
bool completed(const EventRef& mark, bool wait, bool* not_yet) {
  const cudaError_t e = wait ? cudaEventSynchronize(mark->handle) : cudaEventQuery(mark->handle);
  clear_cuda_error(e);
  if (e == cudaErrorNotReady) *not_yet = true;
  return e == cudaSuccess;
}

// The host time of `mark`, from the epoch; false if the driver cannot time it.
bool host_time_of(const MoveLog& log, const EventRef& mark, double* out) {
  float milliseconds = 0;
  if (clear_cuda_error(cudaEventElapsedTime(&milliseconds, log.epoch->handle, mark->handle)) != cudaSuccess) {
    return false;
  }
  *out = log.epoch_host + milliseconds / 1e3;
  return true;
}

}  // namespace

const char* phase_name(Phase phase) {
  static const char* const names[kPhaseCount] = {"pin",     "wait",  "copy", "discard", "release", "map",
                                                 "populate", "migrate", "write", "read",   "code"};
  const int index = static_cast<int>(phase);
  return index >= 0 && index < kPhaseCount ? names[index] : "unknown";
}

double host_seconds() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

uint64_t thread_number() {
  static std::atomic<uint64_t> next{1};
  thread_local const uint64_t number = next++;
  return number;
}

MoveRecord::MoveRecord(const char* call) noexcept {
  if (current_log != nullptr) return;  // inside another move: that one records everything
  try {
    log_ = std::make_unique<MoveLog>();
  } catch (...) {
    return;
  }
  log_->call = call;
  log_->device = -1;
  log_->thread = thread_number();
  log_->host_begin = host_seconds();
  log_->nvtx_range = nvtx_start(call);
  current_log = log_.get();
}

uvm_status MoveRecord::done(uvm_status status) noexcept {
  if (!log_) return status;
  MoveLog* const log = current_log != nullptr ? current_log : log_.get();  // a group's, once joined
  if (log->status == UVM_OK) log->status = status;  // a group keeps its first failure
  return status;
}

MoveRecord::~MoveRecord() {
  if (!log_) return;
  MoveLog* const joined = current_log != log_.get() ? current_log : nullptr;  // a group's record
  current_log = nullptr;
  const double end = host_seconds();
  nvtx_end(log_->nvtx_range);
  if (joined != nullptr) {
    joined->host_end = end;
    return;
  }
  log_->host_end = end;
  if (log_->device < 0) return;  // failed before it knew its device: nothing moved
  try {
    if (joined_records != nullptr) {  // the group's first call on this device: the group keeps it
      joined_records->logs.push_back(std::move(log_));
      return;
    }
    std::shared_ptr<const MoveLog> log(std::move(log_));
    publish_move(log);
  } catch (...) {
    // Host memory ran out while keeping the record: the move itself is unaffected.
  }
}

void join_move_records() {
  if (joined_records == nullptr) joined_records = new JoinedRecords();
}

void publish_joined_records() {
  if (joined_records == nullptr) return;
  const std::unique_ptr<JoinedRecords> group(joined_records);
  joined_records = nullptr;
  for (std::unique_ptr<MoveLog>& log : group->logs) {
    try {
      publish_move(std::shared_ptr<const MoveLog>(std::move(log)));
    } catch (...) {
      // Host memory ran out while keeping the record: the moves themselves are unaffected.
    }
  }
}

void trace_move_device(int device) {
  if (current_log == nullptr || current_log->device >= 0) return;
  if (joined_records != nullptr) {
    if (MoveLog* const joined = group_log(device)) {
      // A later call of the group on this device: what it recorded so far goes to the group's
      // record, and so does the rest (timed against that record's epoch).
      try {
        joined->intervals.insert(joined->intervals.end(), current_log->intervals.begin(),
                                 current_log->intervals.end());
      } catch (...) {
        return;  // host memory ran out: this call goes unrecorded
      }
      joined->bytes += current_log->bytes;
      current_log = joined;
      return;
    }
  }
  current_log->device = device;
  const Epoch epoch = epochs().of(device);
  current_log->epoch = epoch.event;
  current_log->epoch_host = epoch.host;
}

void trace_move_bytes(size_t bytes) {
  if (current_log != nullptr) current_log->bytes += bytes;
}

HostPhase::HostPhase(Phase phase) : phase_(phase), begin_(0), open_(current_log != nullptr) {
  if (!open_) return;
  begin_ = host_seconds();
  nvtx_range_ = nvtx_start(phase_name(phase));
}

void HostPhase::finish(size_t bytes) {
  if (!open_) return;
  open_ = false;
  nvtx_end(nvtx_range_);
  if (current_log == nullptr) return;
  Interval interval;
  interval.phase = phase_;
  interval.bytes = bytes;
  interval.host_begin = begin_;
  interval.host_end = host_seconds();
  current_log->intervals.push_back(std::move(interval));
}

HostPhase::~HostPhase() { finish(0); }

StreamPhase::StreamPhase(Phase phase, cudaStream_t stream, int lane, uintptr_t address)
    : phase_(phase), stream_(stream), lane_(lane), address_(address), open_(current_log != nullptr) {
  if (!open_) return;
  begin_ = try_mark(stream);
  nvtx_range_ = nvtx_start(phase_name(phase));
}

void StreamPhase::end(size_t bytes, bool start_another) {
  if (!open_) return;
  nvtx_end(nvtx_range_);
  EventRef end = try_mark(stream_);
  if (begin_ && end && current_log != nullptr) {
    Interval interval;
    interval.phase = phase_;
    interval.bytes = bytes;
    interval.lane = lane_;
    interval.address = address_;
    interval.begin = begin_;
    interval.end = end;
    current_log->intervals.push_back(std::move(interval));
  }
  begin_ = std::move(end);
  open_ = start_another;
}

void StreamPhase::next(Phase phase, size_t bytes_done) {
  end(bytes_done, true);
  if (!open_) return;
  phase_ = phase;
  nvtx_range_ = nvtx_start(phase_name(phase));
}

void StreamPhase::finish(size_t bytes) { end(bytes, false); }

StreamPhase::~StreamPhase() {
  // A phase left open by a failure is not timed: its end would mark work that was never issued.
  if (open_) nvtx_end(nvtx_range_);
}

bool time_intervals(const MoveLog& log, bool wait, std::vector<TimedInterval>* out) {
  const RelaxedCapture relaxed;
  out->clear();
  bool not_yet = false;
  for (const Interval& interval : log.intervals) {
    TimedInterval timed{interval.phase,  interval.bytes,      interval.lane,
                        interval.address, interval.host_begin, interval.host_end};
    if (interval.begin) {
      if (!log.epoch) continue;
      const bool both = completed(interval.begin, wait, &not_yet) && completed(interval.end, wait, &not_yet);
      if (not_yet) return false;
      if (!both || !host_time_of(log, interval.begin, &timed.begin) || !host_time_of(log, interval.end, &timed.end)) {
        continue;
      }
    }
    out->push_back(timed);
  }
  return true;
}

}  // namespace uvm

namespace uvm {

bool time_move(const MoveLog& log, bool wait, TimedMove* out) {
  // Queried from the move's device's context when the thread has none (after the move's own
  // context scope ended, or from a thread that never had one: uvm_last_move, the trace file's
  // flush at exit); with none current, the runtime would create device 0's.
  ContextScope scope;
  if (log.device >= 0) (void)scope.enter(Call::of("uvm_last_move"), log.device, ContextScope::When::only_if_none_current);
  if (!time_intervals(log, wait, &out->intervals)) return false;
  static_cast<MoveFacts&>(*out) = log;
  return true;
}

void publish_move(const std::shared_ptr<const MoveLog>& log) {
  // Timed at once where the GPU is already done (always on the CPU test double), so that no
  // event is kept longer than the move needs it.
  TimedMove timed;
  const bool complete = time_move(*log, false, &timed);
  keep_last_move(log, complete ? &timed : nullptr);
  if (trace_file_wanted()) write_to_trace_file(log, complete ? &timed : nullptr);
}

}  // namespace uvm
