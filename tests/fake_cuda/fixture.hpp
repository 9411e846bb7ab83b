// A clean fake machine for each CPU test: no allocations, no ops, default advice and limits, the
// calling thread on device 0's context.
#pragma once

#include <dirent.h>
#include <ftw.h>
#include <limits.h>
#include <stdlib.h>
#include <unistd.h>

#include <atomic>
#include <memory>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "../../alloc/settle.hpp"
#include "fake_cuda.hpp"
#include "threads.hpp"
#include "uvm_test.hpp"

struct FakeMachine {
  FakeMachine() {
    quiet_settling();
    give_back_spares();
    fake::reset();
    for (int device = 0; device < 3; ++device) uvm_set_limit(device, 0);
    uvm_set_default_advice(UVM_ADVICE_DEVICE);
    uvm_report_blocks(0);
    fake::set_thread_context(0);
    uvm_clear_last_error();
  }
  ~FakeMachine() {
    give_back_spares();
    fake::reset();
  }
  // No polls after a wake (alloc/settle.hpp) unless a test asks for them (tests/alloc/test_settle.cpp):
  // they would add driver calls to the ops a test counts. Any a test left pending end first.
  static void quiet_settling() {
    uvm::set_settle_timing_for_test(uvm::SettleTiming{});
    for (int device = 0; device < 3; ++device) uvm::settle_cancel(device);
    uvm::wait_until_settled();
  }
  // uvm keeps spare physical memory across calls (uvm_set_spare_limit); the fake forgets its
  // handles at reset, so it goes back first and no test inherits another's.
  static void give_back_spares() {
    for (int device = 0; device < 3; ++device) uvm_set_spare_limit(device, 0);
  }

  // How many blocks of host memory were pinned (cudaHostAlloc or cudaHostRegister) since the ops
  // were last reset.
  static size_t pinnings() {
    return ops_named(fake::OpKind::host_alloc).size() + ops_named(fake::OpKind::host_register).size();
  }

  // The bytes the ops of one kind logged so far moved (copy_to_host: copied out to staging).
  static size_t bytes_of(fake::OpKind kind) {
    size_t bytes = 0;
    for (const fake::Op& op : ops_named(kind)) bytes += op.size;
    return bytes;
  }

  // The ops logged so far of one kind.
  static std::vector<fake::Op> ops_named(fake::OpKind kind) {
    std::vector<fake::Op> selected;
    for (const fake::Op& op : fake::ops()) {
      if (op.call == kind) selected.push_back(op);
    }
    return selected;
  }
};

// A thread a test starts beside itself, joined when it goes out of scope. A REQUIRE that fails
// before the test joins it then reports the failure and the run goes on to the next test, where a
// std::thread still joinable would end the process (the report lost, the disk directory left). A
// call the fake holds is let go first: the thread may be waiting there.
class TestThread {
 public:
  template <class Body>
  explicit TestThread(Body&& body)
      : id_(std::make_shared<std::atomic<pid_t>>(0)),
        thread_([id = id_, body = std::forward<Body>(body)]() mutable {
          *id = threads::this_id();
          body();
        }) {}
  TestThread(TestThread&&) = default;
  TestThread& operator=(TestThread&&) = delete;
  ~TestThread() {
    if (!thread_.joinable()) return;
    fake::release_held();
    thread_.join();
  }
  void join() { thread_.join(); }
  // The thread's id as /proc names it (0 until it has started): for threads::wait_until_parked.
  const std::atomic<pid_t>& id() const { return *id_; }

 private:
  std::shared_ptr<std::atomic<pid_t>> id_;
  std::thread thread_;
};

// Whether `text` (an error message) contains `part`.
inline bool mentions(const char* text, const char* part) { return std::string(text).find(part) != std::string::npos; }

// uvm's residency counts for `device` (or UVM_ANY_DEVICE) and `tag` (nullptr: any).
inline uvm_residency residency(int device = 0, const char* tag = nullptr) {
  uvm_residency r{};
  REQUIRE(uvm_get_residency(device, tag, &r) == UVM_OK);
  return r;
}

// A byte that depends on every bit of its position `i` and on `seed`: bytes moved to another place
// show, at any distance (a pattern of `i` alone repeats every 256 bytes, so that bytes a multiple of
// 256 from where they belong, such as a bounce buffer's slice or batch read twice, looked right).
inline unsigned char pattern_byte(size_t i, unsigned seed) {
  return static_cast<unsigned char>((uint64_t{i} * 0x9E3779B97F4A7C15ull + uint64_t{seed} * 0xD1B54A32D192ED03ull) >> 56);
}

// A releasable allocation (uvm_malloc_releasable) filled with a pattern that depends on `seed` and
// each byte's position, so that a test can tell which bytes survived a move.
struct Releasable {
  explicit Releasable(size_t size = size_t{1} << 20, int device = 0, unsigned seed = 3) : size(size), device(device), seed(seed) {
    ptr = static_cast<unsigned char*>(uvm_malloc_releasable(size, device, nullptr));
    REQUIRE(ptr != nullptr);
    fill();
  }
  ~Releasable() { uvm_free(ptr, size, device, nullptr); }
  unsigned char expected(size_t i) const { return pattern_byte(i, seed); }
  void fill() {
    for (size_t i = 0; i < size; ++i) ptr[i] = expected(i);
  }
  bool intact(size_t from = 0, size_t to = 0) const { return held_by(ptr, from, to); }
  // Whether `bytes` (the memory, or a copy of it) hold what fill() wrote, from `from` to `to` (0: the end).
  bool held_by(const unsigned char* bytes, size_t from = 0, size_t to = 0) const {
    for (size_t i = from; i < (to ? to : size); ++i) {
      if (bytes[i] != expected(i)) return false;
    }
    return true;
  }
  uvm_range whole() const { return uvm_range{ptr, size}; }
  uvm_range part(size_t from, size_t to) const { return uvm_range{ptr + from, to - from}; }
  unsigned char* ptr;
  size_t size;
  int device;
  unsigned seed;
};

// A Releasable of `size` bytes on `device` made under `tag` with `backup` (the calling thread's
// uvm_set_thread_tag and uvm_set_thread_backup), the thread's settings restored after.
inline std::unique_ptr<Releasable> releasable_under(const char* tag, uvm_backup backup, unsigned seed,
                                                    size_t size = size_t{1} << 20, int device = 0) {
  REQUIRE(uvm_set_thread_tag(tag) == UVM_OK);
  REQUIRE(uvm_set_thread_backup(backup) == UVM_OK);
  auto memory = std::make_unique<Releasable>(size, device, seed);
  REQUIRE(uvm_set_thread_tag(nullptr) == UVM_OK);
  REQUIRE(uvm_set_thread_backup(UVM_BACKUP_NONE) == UVM_OK);
  return memory;
}

// The directory disk copies go to in these tests, made once per process under the working
// directory (meson runs tests in the build directory, on a disk: /tmp may be a tmpfs, which uvm
// refuses) and removed at exit.
inline const std::string& test_disk_dir() {
  static const std::string dir = [] {
    char name[] = "uvm-disk-test-XXXXXX";
    REQUIRE(mkdtemp(name) != nullptr);
    char full[PATH_MAX];
    REQUIRE(realpath(name, full) != nullptr);
    REQUIRE(uvm_set_disk_backup_dir(full) == UVM_OK);
    static std::string removed_at_exit;
    static pid_t owner;
    removed_at_exit = full;
    owner = getpid();
    std::atexit([] {
      if (getpid() != owner) return;  // a forked child that exits leaves its parent's directory
      nftw(removed_at_exit.c_str(), [](const char* path, const struct stat*, int, struct FTW*) { return remove(path); },
           8, FTW_DEPTH | FTW_PHYS);
    });
    return std::string(full);
  }();
  return dir;
}

// The backup files in `dir` (uvm-*.backup), by name.
inline std::vector<std::string> backup_files(const std::string& dir) {
  std::vector<std::string> names;
  if (DIR* d = opendir(dir.c_str())) {
    while (const dirent* entry = readdir(d)) {
      const std::string name = entry->d_name;
      if (name.size() > 7 && name.compare(name.size() - 7, 7, ".backup") == 0) names.push_back(name);
    }
    closedir(d);
  }
  return names;
}

// The kept copies of `device` (or UVM_ANY_DEVICE) and `tag` (nullptr: any).
inline uvm_kept_copies kept_copies(int device = UVM_ANY_DEVICE, const char* tag = nullptr) {
  uvm_kept_copies kept{};
  REQUIRE(uvm_get_kept_copies(device, tag, &kept) == UVM_OK);
  return kept;
}
