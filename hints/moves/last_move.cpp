// uvm_last_move: each thread's last move per device, phase by phase.
#include <algorithm>
#include <map>
#include <mutex>
#include <vector>

#include "trace_sinks.hpp"

namespace uvm {
namespace {

// Moves kept at most; past it the oldest go (threads that moved memory once and ended).
constexpr size_t kMaxKeptMoves = 1024;

struct KeptMove {
  std::shared_ptr<const MoveLog> pending;  // until its marks are timed
  TimedMove timed;
  uint64_t sequence = 0;
};

class KeptReports {
 public:
  void keep(const std::shared_ptr<const MoveLog>& log, const TimedMove* timed) {
    KeptMove kept;
    if (timed != nullptr) kept.timed = *timed;
    else kept.pending = log;
    std::lock_guard<std::mutex> lock(mutex_);
    kept.sequence = ++sequence_;
    moves_[{log->thread, log->device}] = std::move(kept);
    if (moves_.size() > kMaxKeptMoves) {
      moves_.erase(std::min_element(moves_.begin(), moves_.end(), [](const auto& a, const auto& b) {
        return a.second.sequence < b.second.sequence;
      }));
    }
  }

  // This thread's last move on `device` (UVM_ANY_DEVICE: on any); false if it made none.
  bool find(uint64_t thread, int device, KeptMove* out) {
    std::lock_guard<std::mutex> lock(mutex_);
    const KeptMove* found = nullptr;
    for (const auto& [key, kept] : moves_) {
      if (key.first != thread || (device != UVM_ANY_DEVICE && key.second != device)) continue;
      if (found == nullptr || kept.sequence > found->sequence) found = &kept;
    }
    if (found != nullptr) *out = *found;
    return found != nullptr;
  }

 private:
  std::mutex mutex_;
  std::map<std::pair<uint64_t, int>, KeptMove> moves_;  // by (thread, device)
  uint64_t sequence_ = 0;
};

KeptReports& kept_reports() {
  static KeptReports* const instance = new KeptReports();  // never destroyed: its events outlive exit
  return *instance;
}

struct PhaseTotal {
  bool seen = false;
  double first = 0, last = 0;
  size_t bytes = 0;
  uint32_t operations = 0;
};

void fill_report(const TimedMove& move, uvm_move_report* report) {
  report->call = move.call;
  report->device = move.device;
  report->status = static_cast<uvm_status>(move.status);
  report->bytes = move.bytes;
  report->host_seconds = move.host_end - move.host_begin;
  PhaseTotal totals[kPhaseCount];
  double last_end = move.host_end;
  for (const TimedInterval& interval : move.intervals) {
    PhaseTotal& total = totals[static_cast<int>(interval.phase)];
    total.first = total.seen ? std::min(total.first, interval.begin) : interval.begin;
    total.last = total.seen ? std::max(total.last, interval.end) : interval.end;
    total.seen = true;
    total.bytes += interval.bytes;
    ++total.operations;
    last_end = std::max(last_end, interval.end);
  }
  report->seconds = last_end - move.host_begin;
  std::vector<int> order;
  for (int phase = 0; phase < kPhaseCount; ++phase) {
    if (totals[phase].seen) order.push_back(phase);
  }
  std::sort(order.begin(), order.end(), [&](int a, int b) { return totals[a].first < totals[b].first; });
  const size_t count = std::min<size_t>(order.size(), UVM_MOVE_PHASES);
  for (size_t i = 0; i < count; ++i) {
    const PhaseTotal& total = totals[order[i]];
    uvm_move_phase& phase = report->phases[i];
    phase.name = phase_name(static_cast<Phase>(order[i]));
    phase.bytes = total.bytes;
    phase.operations = total.operations;
    phase.start = total.first - move.host_begin;
    phase.seconds = total.last - total.first;
  }
  report->phase_count = count;
}

uvm_status last_move(const Call& call, int device, uvm_move_report* report) {
  if (report == nullptr) return fail(call, UVM_ERROR_INVALID_ARGUMENT, "report is NULL");
  if (device < UVM_ANY_DEVICE) {
    return fail(call, UVM_ERROR_INVALID_ARGUMENT, "device %d is neither an ordinal nor UVM_ANY_DEVICE", device);
  }
  *report = uvm_move_report{};
  KeptMove kept;
  if (!kept_reports().find(thread_number(), device, &kept)) return UVM_OK;
  if (kept.pending) time_move(*kept.pending, true, &kept.timed);  // waits for the move's GPU work
  fill_report(kept.timed, report);
  return UVM_OK;
}

}  // namespace

void keep_last_move(const std::shared_ptr<const MoveLog>& log, const TimedMove* timed) {
  kept_reports().keep(log, timed);
}

}  // namespace uvm

extern "C" uvm_status uvm_last_move(int device, uvm_move_report* report) {
  const uvm::Call call = uvm::Call::of("uvm_last_move").with_selection(device);
  return uvm::guarded(call, [&] { return uvm::last_move(call, device, report); });
}
