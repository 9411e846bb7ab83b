// Waiting for another thread to be parked, not for time to pass: a negative ("it did not do X
// meanwhile") checked after a sleep passes on wrong code when the host is slow. Linux only (/proc).
#pragma once

#include <sys/syscall.h>
#include <unistd.h>

#include <chrono>
#include <fstream>
#include <iterator>
#include <string>
#include <thread>

namespace threads {

// The calling thread's id, as /proc/self/task names it.
inline pid_t this_id() { return static_cast<pid_t>(syscall(SYS_gettid)); }

// The state /proc gives thread `tid` of this process: 'S' asleep in a wait (a lock, a condition, a
// held call of the double), 'R' running, ...; '\0' once it has ended.
inline char state_of(pid_t tid) {
  std::ifstream stat("/proc/self/task/" + std::to_string(tid) + "/stat");
  const std::string text((std::istreambuf_iterator<char>(stat)), std::istreambuf_iterator<char>());
  const size_t name_end = text.rfind(')');  // the thread's name may hold spaces and parentheses
  return name_end != std::string::npos && name_end + 2 < text.size() ? text[name_end + 2] : '\0';
}

// Waits until thread `tid` (0: not started yet, waited for too) sleeps or has ended; false after
// `timeout_ms`, which only a failing test reaches. A thread the test keeps from going on (a lock it
// holds, a call of the double it holds) then stays where it is, so what it has not done by then it
// will not do until the test lets it go.
template <typename Id>
bool wait_until_parked(const Id& tid, int timeout_ms = 300000) {
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::milliseconds(timeout_ms);
  while (std::chrono::steady_clock::now() < deadline) {
    const pid_t id = tid;
    if (id != 0) {
      const char state = state_of(id);
      if (state == 'S' || state == '\0') return true;
    }
    std::this_thread::sleep_for(std::chrono::microseconds(200));
  }
  return false;
}

}  // namespace threads
