// UVM_TRACE=<file>: every move as Chrome trace events (chrome://tracing, ui.perfetto.dev), one
// lane for each calling thread and one per stream a move used: the per-op timeline users ask for
// when a sleep or wake is slow, with no profiler attached.
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <deque>
#include <mutex>
#include <set>
#include <string>

#include "../../alloc/options.hpp"
#include "trace_sinks.hpp"

namespace uvm {
namespace {

// Moves waiting for their GPU work before they are written; past this the oldest is waited for.
constexpr size_t kMaxPending = 256;

// The file always holds a whole JSON array: each write goes in before the closing "\n]\n".
class TraceFile {
 public:
  TraceFile() : path_(options().trace_path) {}

  bool wanted() const { return !path_.empty(); }

  void add(const std::shared_ptr<const MoveLog>& log, const TimedMove* timed) {
    std::lock_guard<std::mutex> lock(mutex_);
    Pending pending;
    if (timed != nullptr) pending.timed = *timed;
    else pending.log = log;
    pending_.push_back(std::move(pending));
    drain(false);
    while (pending_.size() > kMaxPending) drain_one(true);
  }

  uvm_status flush(const Call& call) {
    std::lock_guard<std::mutex> lock(mutex_);
    while (!pending_.empty()) drain_one(true);
    if (!error_.empty()) {
      return fail(call, UVM_ERROR_INVALID_ARGUMENT, "cannot write the UVM_TRACE file %s: %s", path_.c_str(),
                  error_.c_str());
    }
    return UVM_OK;
  }

 private:
  struct Pending {
    std::shared_ptr<const MoveLog> log;  // until timed
    TimedMove timed;
  };

  void drain(bool wait) {
    while (!pending_.empty() && drain_one(wait)) {
    }
  }

  // Writes the oldest pending move if its marks have completed (with `wait`, once they have).
  bool drain_one(bool wait) {
    Pending& front = pending_.front();
    if (front.log && !time_move(*front.log, wait, &front.timed)) return false;
    write(front.timed);
    pending_.pop_front();
    return true;
  }

  // Opens the file at the first move written, whose start becomes the trace's time 0.
  bool open(const TimedMove& first) {
    if (file_ != nullptr) return true;
    if (!error_.empty()) return false;
    file_ = std::fopen(path_.c_str(), "w");
    if (file_ == nullptr) {
      error_ = std::strerror(errno);
      std::fprintf(stderr, "uvm: cannot write the UVM_TRACE file %s: %s; moves are not traced\n", path_.c_str(),
                   error_.c_str());
      return false;
    }
    origin_ = first.host_begin;
    std::fputs("[", file_);
    return true;
  }

  static long long micros(double seconds) { return static_cast<long long>(seconds * 1e6); }

  // A lane's id: the calling thread's number, or a stream of a device.
  static long long lane_id(const TimedMove& move, int lane) {
    return lane < 0 ? static_cast<long long>(move.thread) : 1000000LL + move.device * 1000LL + lane;
  }

  void name_lane(std::string* out, const TimedMove& move, int lane) {
    const long long id = lane_id(move, lane);
    if (!named_.insert(id).second) return;
    char name[64];
    if (lane < 0) std::snprintf(name, sizeof name, "host thread %llu", static_cast<unsigned long long>(move.thread));
    else if (lane == 0) std::snprintf(name, sizeof name, "GPU %d: caller's stream", move.device);
    else std::snprintf(name, sizeof name, "GPU %d: uvm worker stream %d", move.device, lane);
    append(out, "{\"name\":\"thread_name\",\"ph\":\"M\",\"pid\":%d,\"tid\":%lld,\"args\":{\"name\":\"%s\"}}",
           getpid(), id, name);
  }

  template <typename... Args>
  void append(std::string* out, const char* format, Args... args) {
    char line[512];
    std::snprintf(line, sizeof line, format, args...);
    if (wrote_any_ || !out->empty()) out->append(",\n");
    out->append(line);
  }

  void write(const TimedMove& move) {
    if (!open(move)) return;
    std::string events;
    name_lane(&events, move, -1);
    append(&events,
           "{\"name\":\"%s\",\"cat\":\"uvm\",\"ph\":\"X\",\"ts\":%lld,\"dur\":%lld,\"pid\":%d,\"tid\":%lld,"
           "\"args\":{\"device\":%d,\"bytes\":%zu,\"status\":\"%s\"}}",
           move.call, micros(move.host_begin - origin_), micros(move.host_end - move.host_begin), getpid(),
           lane_id(move, -1), move.device, move.bytes, uvm_status_string(move.status));
    for (const TimedInterval& interval : move.intervals) {
      name_lane(&events, move, interval.lane);
      const double seconds = interval.end - interval.begin;
      append(&events,
             "{\"name\":\"%s\",\"cat\":\"uvm\",\"ph\":\"X\",\"ts\":%lld,\"dur\":%lld,\"pid\":%d,\"tid\":%lld,"
             "\"args\":{\"call\":\"%s\",\"bytes\":%zu,\"GB/s\":%.2f,\"address\":\"0x%llx\"}}",
             phase_name(interval.phase), micros(interval.begin - origin_), micros(seconds), getpid(),
             lane_id(move, interval.lane), move.call, interval.bytes,
             seconds > 0 ? interval.bytes / seconds / 1e9 : 0.0, static_cast<unsigned long long>(interval.address));
    }
    if (wrote_any_) std::fseek(file_, -3, SEEK_END);  // back over "\n]\n"
    std::fputs(events.c_str(), file_);
    std::fputs("\n]\n", file_);
    std::fflush(file_);
    wrote_any_ = true;
  }

  const std::string path_;
  std::mutex mutex_;
  std::deque<Pending> pending_;
  std::FILE* file_ = nullptr;
  std::string error_;
  double origin_ = 0;
  bool wrote_any_ = false;
  std::set<long long> named_;
};

TraceFile& trace_file() {
  static TraceFile* const instance = new TraceFile();  // never destroyed: no CUDA call at exit
  return *instance;
}

}  // namespace

bool trace_file_wanted() { return trace_file().wanted(); }

void write_to_trace_file(const std::shared_ptr<const MoveLog>& log, const TimedMove* timed) {
  trace_file().add(log, timed);
}

}  // namespace uvm

extern "C" uvm_status uvm_trace_flush(void) {
  const uvm::Call call = uvm::Call::of("uvm_trace_flush");
  return uvm::guarded(call, [&] { return uvm::trace_file().wanted() ? uvm::trace_file().flush(call) : UVM_OK; });
}
