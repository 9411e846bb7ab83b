#include "settle.hpp"

#include <pthread.h>

#include <algorithm>
#include <condition_variable>
#include <mutex>
#include <new>
#include <system_error>
#include <thread>

#include "devices.hpp"
#include "options.hpp"
#include "vmm.hpp"

namespace uvm {
namespace {

using Clock = std::chrono::steady_clock;

// The driver's background work after a large free outlasts a wake's copies and then goes on for
// several times as long (bench/probes/first_release_probe.py); a poll that finds nothing to wait for costs
// one small cuMemCreate and cuMemRelease.
constexpr SettleTiming kTiming{std::chrono::milliseconds(100), std::chrono::milliseconds(50),
                               std::chrono::milliseconds(2000)};

struct Settler {
  std::mutex mutex;
  std::condition_variable changed;
  Clock::time_point next[kMaxDevices] = {};   // the device's next poll
  Clock::time_point until[kMaxDevices] = {};  // no poll after this; {} when none is pending
  bool running = false;                       // the polling thread exists
  SettleTiming timing = kTiming;
  // Tests: the clock moves only when advance_settle_clock_for_test moves it, and the polling thread
  // says when it waits for a later poll, so that a test knows every poll due has run.
  bool manual = false;
  Clock::time_point manual_now{};
  bool waiting = false;  // the polling thread waits for its next poll
};

Clock::time_point now(const Settler& s) { return s.manual ? s.manual_now : Clock::now(); }

Settler& settler() {
  static auto* made = [] {
    auto* state = new Settler();  // never destroyed: no code runs from static destructors
    // A child made by fork has no polling thread; it starts its own when a wake of its own needs one.
    pthread_atfork([] { settler().mutex.lock(); }, [] { settler().mutex.unlock(); },
                   [] {
                     Settler& child = settler();
                     for (int d = 0; d < kMaxDevices; ++d) child.until[d] = {};
                     child.running = false;
                     new (&child.changed) std::condition_variable();  // no parent thread waits on it here
                     child.mutex.unlock();
                   });
    return state;
  }();
  return *made;
}

bool pending(const Settler& s, int device) { return s.until[device] != Clock::time_point{}; }

// The device whose poll comes first, or -1 when none is pending (polls past their window dropped).
int next_device(Settler& s) {
  int first = -1;
  for (int d = 0; d < kMaxDevices; ++d) {
    if (!pending(s, d)) continue;
    if (s.next[d] > s.until[d]) {
      s.until[d] = {};
      continue;
    }
    if (first < 0 || s.next[d] < s.next[first]) first = d;
  }
  return first;
}

void poll_pending() noexcept {
  Settler& s = settler();
  std::unique_lock<std::mutex> lock(s.mutex);
  for (;;) {
    const int device = next_device(s);
    if (device < 0) {
      s.running = false;
      s.changed.notify_all();
      return;
    }
    if (now(s) < s.next[device]) {
      s.waiting = true;
      s.changed.notify_all();
      if (s.manual) s.changed.wait(lock);
      else s.changed.wait_until(lock, s.next[device]);
      s.waiting = false;
      continue;  // then look again: a wake or a release may have moved it
    }
    lock.unlock();
    (void)vmm_touch_driver(device);
    lock.lock();
    // A wake while the driver held the poll has put the next one later: it stays there.
    s.next[device] = std::max(s.next[device], now(s) + s.timing.every);
  }
}

}  // namespace

void settle_after_wake(int device) noexcept {
  if (!options().settle || device < 0 || device >= kMaxDevices) return;
  Settler& s = settler();
  std::lock_guard<std::mutex> lock(s.mutex);
  if (s.timing.window.count() == 0) return;  // the tests' way of asking for none
  const Clock::time_point at = now(s);
  // The polling thread needs waking only if this poll comes before the one it waits for; a wake's
  // later maps only move it on, and it finds that when it wakes.
  const bool sooner = !pending(s, device) || at + s.timing.first < s.next[device];
  s.next[device] = at + s.timing.first;
  s.until[device] = at + s.timing.window;
  if (s.running) {
    if (sooner) s.changed.notify_all();
    return;
  }
  try {
    std::thread(poll_pending).detach();
    s.running = true;
  } catch (const std::system_error&) {
    s.until[device] = {};  // no thread: the next release pays, as without polls
  }
}

void settle_cancel(int device) noexcept {
  if (device < 0 || device >= kMaxDevices) return;
  Settler& s = settler();
  std::lock_guard<std::mutex> lock(s.mutex);
  if (!pending(s, device)) return;
  s.until[device] = {};
  s.changed.notify_all();
}

void set_settle_timing_for_test(SettleTiming timing) {
  Settler& s = settler();
  std::lock_guard<std::mutex> lock(s.mutex);
  s.timing = timing;
}

void set_settle_clock_for_test(bool manual) {
  Settler& s = settler();
  std::lock_guard<std::mutex> lock(s.mutex);
  if (manual == s.manual) return;
  s.manual = manual;
  s.manual_now = Clock::now();
  for (int d = 0; d < kMaxDevices; ++d) s.until[d] = {};  // polls timed on the other clock end
  s.changed.notify_all();
}

void advance_settle_clock_for_test(std::chrono::milliseconds by) {
  Settler& s = settler();
  std::unique_lock<std::mutex> lock(s.mutex);
  s.manual_now += by;
  s.changed.notify_all();
  // The thread is done for now once it waits and each pending poll is a later one in its window: a
  // poll due, or one past its window, or none pending at all, makes it run (or end) first.
  const auto only_later_polls = [&] {
    bool any = false;
    for (int d = 0; d < kMaxDevices; ++d) {
      if (!pending(s, d)) continue;
      if (s.next[d] > s.until[d] || s.next[d] <= s.manual_now) return false;
      any = true;
    }
    return any;
  };
  s.changed.wait(lock, [&] { return !s.running || (s.waiting && only_later_polls()); });
}

bool settling() {
  Settler& s = settler();
  std::lock_guard<std::mutex> lock(s.mutex);
  return s.running;
}

void wait_until_settled() {
  Settler& s = settler();
  std::unique_lock<std::mutex> lock(s.mutex);
  s.changed.wait(lock, [&] { return !s.running; });
}

}  // namespace uvm
