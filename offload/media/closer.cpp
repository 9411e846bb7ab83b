#include "closer.hpp"

#include <pthread.h>
#include <sys/resource.h>
#include <unistd.h>

#include <algorithm>
#include <array>
#include <condition_variable>
#include <cstddef>
#include <mutex>
#include <new>
#include <system_error>
#include <thread>

namespace uvm {
namespace {

// A 4 GiB model in 64 MiB tensors removes 64 files at once; more than this many waiting are
// closed by their caller, and no more than a sixteenth of the process's descriptor limit (64 of
// the default 1,024), so that waiting descriptors never starve the moves that need new ones.
constexpr size_t kMaxWaiting = 64;

size_t most_waiting() {
  struct rlimit limit {};
  if (getrlimit(RLIMIT_NOFILE, &limit) != 0 || limit.rlim_cur == RLIM_INFINITY) return kMaxWaiting;
  return std::min<size_t>(kMaxWaiting, static_cast<size_t>(limit.rlim_cur) / 16);
}

struct Closer {
  std::mutex mutex;
  std::condition_variable changed;
  std::array<int, kMaxWaiting> waiting{};  // fixed: queuing allocates nothing, so it cannot fail
  size_t count = 0;
  bool running = false;  // a closing thread exists: it ends only with nothing waiting
  bool held = false;
  int callers_waiting = 0;  // in wait_for_closed_files (tests wait for one to come)
};

Closer& closer() {
  static auto* made = [] {
    auto* state = new Closer();  // never destroyed: no code runs from static destructors
    // The closing thread is the parent's alone: a child made by fork closes its copies of the
    // waiting descriptors itself, and starts a thread of its own when it needs one.
    pthread_atfork([] { closer().mutex.lock(); }, [] { closer().mutex.unlock(); },
                   [] {
                     Closer& child = closer();
                     for (size_t i = 0; i < child.count; ++i) close(child.waiting[i]);
                     child.count = 0;
                     child.running = false;
                     new (&child.changed) std::condition_variable();  // no parent thread waits on it here
                     child.mutex.unlock();
                   });
    return state;
  }();
  return *made;
}

void close_waiting() noexcept {
  Closer& state = closer();
  std::unique_lock<std::mutex> lock(state.mutex);
  for (;;) {
    state.changed.wait(lock, [&] { return !state.held; });
    if (state.count == 0) {
      state.running = false;
      state.changed.notify_all();
      return;
    }
    std::array<int, kMaxWaiting> now = state.waiting;
    const size_t taken = state.count;
    state.count = 0;
    lock.unlock();
    for (size_t i = 0; i < taken; ++i) close(now[i]);
    lock.lock();
  }
}

}  // namespace

void close_in_background(int fd) noexcept {
  Closer& state = closer();
  {
    std::lock_guard<std::mutex> lock(state.mutex);
    if (state.count < most_waiting()) {
      state.waiting[state.count++] = fd;
      if (state.running) return;
      try {
        std::thread(close_waiting).detach();
        state.running = true;
        return;
      } catch (const std::system_error&) {
        --state.count;  // no thread: nothing else waits either, since none was running
      }
    }
  }
  close(fd);
}

void wait_for_closed_files() {
  Closer& state = closer();
  std::unique_lock<std::mutex> lock(state.mutex);
  if (!state.running) return;
  ++state.callers_waiting;
  state.changed.notify_all();
  state.changed.wait(lock, [&] { return !state.running; });
  --state.callers_waiting;
}

void wait_for_a_caller_waiting_for_test() {
  Closer& state = closer();
  std::unique_lock<std::mutex> lock(state.mutex);
  state.changed.wait(lock, [&] { return state.callers_waiting > 0; });
}

void hold_closing_for_test(bool held) {
  Closer& state = closer();
  std::lock_guard<std::mutex> lock(state.mutex);
  state.held = held;
  state.changed.notify_all();
}

}  // namespace uvm
