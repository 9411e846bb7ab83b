// Offloads kept in mmap'ed memory or on disk (offload/media/spill.cpp, offload/media/disk.cpp): bytes back
// exactly, neighbours untouched, copies that die with what they belong to, and every fault —
// a bad directory, a full disk, a file changed while offloaded, a dead process's files — failing
// clearly with the device bytes kept.
#include <fcntl.h>
#include <sched.h>
#include <signal.h>
#include <sys/file.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <sys/statvfs.h>
#include <sys/vfs.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <fstream>
#include <thread>

#include "../../offload/media/closer.hpp"
#include "../../offload/media/spill.hpp"
#include "fixture.hpp"

namespace {
constexpr size_t kMiB = size_t{1} << 20;
constexpr uvm_strategy kKeptStrategies[] = {UVM_STRATEGY_MMAP, UVM_STRATEGY_DISK};

const char* name_of(uvm_strategy strategy) { return strategy == UVM_STRATEGY_MMAP ? "mmap" : "disk"; }

// A managed allocation (uvm_malloc) filled with a pattern of `seed`.
struct Managed {
  explicit Managed(size_t size, unsigned seed = 5) : size(size), seed(seed) {
    ptr = static_cast<unsigned char*>(uvm_malloc(size, 0, nullptr));
    REQUIRE(ptr != nullptr);
    for (size_t i = 0; i < size; ++i) ptr[i] = expected(i);
  }
  ~Managed() { uvm_free(ptr, size, 0, nullptr); }
  unsigned char expected(size_t i) const { return pattern_byte(i, seed); }
  // The first byte in [from, to) that does not hold the pattern, or -1.
  long first_wrong(size_t from, size_t to) const {
    for (size_t i = from; i < to; ++i) {
      if (ptr[i] != expected(i)) return static_cast<long>(i);
    }
    return -1;
  }
  unsigned char* ptr;
  size_t size;
  unsigned seed;
};

std::string only_file(const std::string& dir) {
  const auto files = backup_files(dir);
  REQUIRE(files.size() == 1);
  return dir + "/" + files.front();
}

// A child process runs `body` and exits with its result: for what must not touch this process
// (a user switch, a file-size limit with its signal).
int in_child(const std::function<int()>& body) {
  const pid_t child = fork();
  if (child == 0) _exit(body());
  int status = 0;
  waitpid(child, &status, 0);
  return WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
}
}  // namespace

TEST_CASE("mmap and disk offloads bring every byte back and give their copies back", "[spill][cuda13]") {
  const std::string& dir = test_disk_dir();
  for (const uvm_strategy strategy : kKeptStrategies) {
    CAPTURE(name_of(strategy));
    FakeMachine machine;
    // 40 MiB: three bounce buffers' worth, so that several workers each move batches.
    Releasable whole(40 * kMiB, 0, 7);
    Releasable neighbour(kMiB, 0, 9);
    const size_t mapped = fake::mapped_reservations();
    const uvm_range range = whole.whole();
    const uvm_status offloaded = uvm_offload_ranges(&range, 1, strategy, nullptr);
    INFO(last_error());
    REQUIRE(offloaded == UVM_OK);
    CHECK(fake::mapped_reservations() == mapped - 1);  // released once copied
    const uvm_kept_copies kept = kept_copies();
    CHECK(kept.pinned_bytes == 0);
    CHECK((strategy == UVM_STRATEGY_MMAP ? kept.pageable_bytes : kept.disk_bytes) == whole.size);
    CHECK(kept.disk_files == (strategy == UVM_STRATEGY_DISK ? 1u : 0u));
    CHECK(backup_files(dir).size() == kept.disk_files);
    CHECK(residency().staged_bytes == 0);  // staged_bytes counts pinned staging only
    CHECK(residency().host_bytes == whole.size);
    CHECK(FakeMachine::pinnings() <= 8);   // bounce buffers only, not 40 MiB of staging

    REQUIRE(uvm_onload_ranges(&range, 1, nullptr) == UVM_OK);
    CHECK(whole.intact());
    CHECK(neighbour.intact());
    CHECK(kept_copies().pageable_bytes + kept_copies().disk_bytes == 0);
    CHECK(backup_files(dir).empty());  // the file goes with its last piece
    CHECK(residency().device_bytes == residency().live_bytes);
    CHECK(cudaPeekAtLastError() == cudaSuccess);
  }
}

TEST_CASE("a part of a managed allocation at odd offsets moves alone; its neighbours keep what was written meanwhile",
          "[spill][safety][cuda13]") {
  test_disk_dir();
  for (const uvm_strategy strategy : kKeptStrategies) {
    CAPTURE(name_of(strategy));
    FakeMachine machine;
    Managed memory(20 * kMiB + 333);
    const size_t from = 4097 + 11, to = 17 * kMiB + 5;  // not aligned to anything
    const uvm_range part{memory.ptr + from, to - from};
    REQUIRE(uvm_offload_ranges(&part, 1, strategy, nullptr) == UVM_OK);
    std::memset(memory.ptr, 0x3c, from);  // the program writes its neighbours meanwhile
    std::memset(memory.ptr + to, 0x3c, memory.size - to);
    // Then brings back pieces of it in an order of its own: unaligned reads of the copy.
    const uvm_range second_half{memory.ptr + 9 * kMiB + 3, to - (9 * kMiB + 3)};
    const uvm_range first_half{memory.ptr + from, 9 * kMiB + 3 - from};
    REQUIRE(uvm_onload_ranges(&second_half, 1, nullptr) == UVM_OK);
    CHECK(memory.first_wrong(9 * kMiB + 3, to) == -1);
    REQUIRE(uvm_onload_ranges(&first_half, 1, nullptr) == UVM_OK);
    CHECK(memory.first_wrong(from, to) == -1);
    for (size_t i : {size_t{0}, from - 1, to, memory.size - 1}) CHECK(memory.ptr[i] == 0x3c);
    CHECK(kept_copies().pageable_bytes + kept_copies().disk_bytes == 0);
  }
}

TEST_CASE("a copy dies with its bytes: freed, discarded, or its block reused", "[spill][safety][cuda13]") {
  const std::string& dir = test_disk_dir();
  for (const uvm_strategy strategy : kKeptStrategies) {
    CAPTURE(name_of(strategy));
    FakeMachine machine;
    {
      Releasable freed(2 * kMiB);
      const uvm_range range = freed.whole();
      REQUIRE(uvm_offload_ranges(&range, 1, strategy, nullptr) == UVM_OK);
    }  // freed while offloaded
    CHECK(backup_files(dir).empty());
    CHECK(kept_copies().pageable_bytes + kept_copies().disk_bytes == 0);

    Managed memory(4 * kMiB, 1);
    const uvm_range old_tensor{memory.ptr, kMiB};
    REQUIRE(uvm_offload_ranges(&old_tensor, 1, strategy, nullptr) == UVM_OK);
    REQUIRE(uvm_discard_ranges(&old_tensor, 1, nullptr) == UVM_OK);  // the tensor dies
    CHECK(backup_files(dir).empty());
    std::memset(memory.ptr, 7, kMiB);  // a new tensor in the same block
    REQUIRE(uvm_onload_ranges(&old_tensor, 1, nullptr) == UVM_OK);
    CHECK(memory.ptr[0] == 7);  // no stale copy written over it
    CHECK(memory.ptr[kMiB - 1] == 7);
    CHECK(memory.first_wrong(kMiB, memory.size) == -1);
  }
}

TEST_CASE("pause keeps mmap and disk backups apart from the host one, files only while paused", "[spill][pause][cuda13]") {
  const std::string& dir = test_disk_dir();
  FakeMachine machine;
  std::vector<std::unique_ptr<Releasable>> made;
  const uvm_backup backups[] = {UVM_BACKUP_HOST, UVM_BACKUP_MMAP, UVM_BACKUP_DISK, UVM_BACKUP_DISK};
  REQUIRE(uvm_set_thread_tag("model") == UVM_OK);
  for (size_t i = 0; i < 4; ++i) {
    REQUIRE(uvm_set_thread_backup(backups[i]) == UVM_OK);
    made.push_back(std::make_unique<Releasable>((i + 1) * kMiB + 4096 * i, 0, static_cast<unsigned>(i)));
  }
  REQUIRE(uvm_set_thread_backup(UVM_BACKUP_NONE) == UVM_OK);
  REQUIRE(uvm_set_thread_tag(nullptr) == UVM_OK);
  const size_t mapped = fake::mapped_reservations();
  for (int cycle = 0; cycle < 3; ++cycle) {
    REQUIRE(uvm_pause(UVM_ANY_DEVICE, "model") == UVM_OK);
    CHECK(fake::mapped_reservations() == mapped - 4);
    const uvm_kept_copies kept = kept_copies(0, "model");
    CHECK(kept.pinned_bytes == made[0]->size);
    CHECK(kept.pageable_bytes == made[1]->size);
    CHECK(kept.disk_bytes == made[2]->size + made[3]->size);
    const auto files = backup_files(dir);
    CHECK(files.size() == 2);  // one per allocation
    for (const std::string& file : files) {
      struct stat about {};
      REQUIRE(stat((dir + "/" + file).c_str(), &about) == 0);
      CHECK((about.st_mode & 0777) == 0600);  // the owner's only
    }
    REQUIRE(uvm_resume(UVM_ANY_DEVICE, "model") == UVM_OK);
    for (const auto& memory : made) CHECK(memory->intact());
    CHECK(backup_files(dir).empty());
    CHECK(kept_copies(0, "model").pageable_bytes == 0);
  }
}

TEST_CASE("a move to disk or mmap reports its write and read phases", "[spill][trace][cuda13]") {
  test_disk_dir();
  FakeMachine machine;
  Releasable memory(3 * kMiB);
  const uvm_range range = memory.whole();
  auto phases = [] {
    uvm_move_report report{};
    REQUIRE(uvm_last_move(0, &report) == UVM_OK);
    std::string names;
    for (size_t i = 0; i < report.phase_count; ++i) names += std::string(report.phases[i].name) + " ";
    return names;
  };
  REQUIRE(uvm_offload_ranges(&range, 1, UVM_STRATEGY_DISK, nullptr) == UVM_OK);
  CHECK_THAT(phases(), Has("write"));
  REQUIRE(uvm_onload_ranges(&range, 1, nullptr) == UVM_OK);
  CHECK_THAT(phases(), Has("read"));
}

TEST_CASE("the disk directory is refused by name when it cannot hold backups", "[spill][disk]") {
  FakeMachine machine;
  CHECK(uvm_set_disk_backup_dir(nullptr) == UVM_ERROR_INVALID_ARGUMENT);
  CHECK_THAT(last_error(), Has("path is NULL or empty"));
  CHECK(uvm_set_disk_backup_dir("/nonexistent/uvm/backups") == UVM_ERROR_INVALID_ARGUMENT);
  CHECK_THAT(last_error(), Has("the disk backup directory /nonexistent/uvm/backups does not exist"));
  const std::string file = test_disk_dir() + "/../uvm-disk-test-plain-file";
  std::ofstream(file) << "x";
  CHECK(uvm_set_disk_backup_dir(file.c_str()) == UVM_ERROR_INVALID_ARGUMENT);
  CHECK_THAT(last_error(), Has("is not a directory"));
  std::remove(file.c_str());

  // A directory of this user's own on a tmpfs (/dev/shm itself is root's: another user would be
  // refused for that first).
  struct statfs shm {};
  char on_tmpfs[] = "/dev/shm/uvm-disk-test-shm-XXXXXX";
  if (statfs("/dev/shm", &shm) == 0 && shm.f_type == 0x01021994 && mkdtemp(on_tmpfs) != nullptr) {  // TMPFS_MAGIC
    CHECK(uvm_set_disk_backup_dir(on_tmpfs) == UVM_ERROR_INVALID_ARGUMENT);
    CHECK_THAT(last_error(), Has(std::string(on_tmpfs) + " is on a tmpfs, whose files live in host memory"));
    rmdir(on_tmpfs);
  } else {
    WARN("no directory of this user's on a tmpfs at /dev/shm: the tmpfs refusal is not exercised");
  }

  std::ofstream(file) << "x";  // a file where a parent directory should be
  CHECK(uvm_set_disk_backup_dir((file + "/backups").c_str()) == UVM_ERROR_INVALID_ARGUMENT);
  CHECK_THAT(last_error(), Has("cannot be reached by uid") && Has("(ENOTDIR)"));
  std::remove(file.c_str());

  // Every directory below is made under /tmp (sticky, open to every user), never beside the
  // checkout, whose parents another user may not enter (a mktemp -d folder, /root).
  char outer[] = "/tmp/uvm-disk-test-outer-XXXXXX";
  REQUIRE(mkdtemp(outer) != nullptr);
  const std::string other = std::string(outer) + "/other", unreachable = std::string(outer) + "/closed/backups";
  REQUIRE(mkdir(other.c_str(), 0700) == 0);
  REQUIRE(mkdir((std::string(outer) + "/closed").c_str(), 0700) == 0);
  REQUIRE(mkdir(unreachable.c_str(), 0700) == 0);
  if (geteuid() == 0) {
    // Another user's directory; then, as that user, a directory it may not write, and one inside a
    // directory it may not enter.
    REQUIRE(chmod(outer, 0755) == 0);
    REQUIRE(chown(other.c_str(), 4242, 4242) == 0);
    REQUIRE(chown(unreachable.c_str(), 4242, 4242) == 0);
    CHECK(uvm_set_disk_backup_dir(other.c_str()) == UVM_ERROR_INVALID_ARGUMENT);
    CHECK_THAT(last_error(), Has("belongs to uid 4242, not to this process's uid 0"));
    REQUIRE(chmod(other.c_str(), 0500) == 0);
    const int refused = in_child([&] {
      if (setuid(4242) != 0) return 2;
      if (uvm_set_disk_backup_dir(other.c_str()) != UVM_ERROR_INVALID_ARGUMENT) return 3;
      if (std::string(uvm_last_error()).find("is not writable: Permission denied") == std::string::npos) return 4;
      if (uvm_set_disk_backup_dir(unreachable.c_str()) != UVM_ERROR_INVALID_ARGUMENT) return 5;
      const std::string message = uvm_last_error();
      if (message.find("the disk backup directory " + unreachable + " cannot be reached by uid 4242: Permission "
                       "denied (EACCES)") == std::string::npos) return 6;
      return cudaPeekAtLastError() == cudaSuccess ? 0 : 7;
    });
    CHECK(refused == 0);
  } else {
    REQUIRE(chmod(other.c_str(), 0500) == 0);
    CHECK(uvm_set_disk_backup_dir(other.c_str()) == UVM_ERROR_INVALID_ARGUMENT);
    CHECK_THAT(last_error(), Has("is not writable"));
    REQUIRE(chmod((std::string(outer) + "/closed").c_str(), 0600) == 0);  // not searchable
    CHECK(uvm_set_disk_backup_dir(unreachable.c_str()) == UVM_ERROR_INVALID_ARGUMENT);
    CHECK_THAT(last_error(), Has("cannot be reached by uid") && Has("Permission denied (EACCES)"));
    REQUIRE(chmod((std::string(outer) + "/closed").c_str(), 0700) == 0);
    WARN("not root: another user's directory is not exercised");
  }
  rmdir(unreachable.c_str());
  rmdir((std::string(outer) + "/closed").c_str());
  rmdir(other.c_str());
  rmdir(outer);
  // The directory in use stays what it was.
  char in_use[PATH_MAX] = {};
  REQUIRE(uvm_get_disk_backup_dir(in_use, sizeof in_use) == UVM_OK);
  CHECK(std::string(in_use) == test_disk_dir());
  char tiny[4];
  CHECK(uvm_get_disk_backup_dir(tiny, sizeof tiny) == UVM_ERROR_INVALID_ARGUMENT);
  CHECK_THAT(last_error(), Has("more than 4"));
}

TEST_CASE("a disk offload that cannot finish keeps the bytes on the device and leaves no file", "[spill][disk][cuda13]") {
  const std::string& dir = test_disk_dir();
  // A file-size limit stands in for a full disk: the second file cannot be made, after the first
  // was written. In a child, since the limit and its signal are the process's.
  const int result = in_child([&] {
    FakeMachine machine;
    Releasable first(kMiB, 0, 1), second(3 * kMiB, 0, 2);
    signal(SIGXFSZ, SIG_IGN);
    const rlimit limit{2 * kMiB, 2 * kMiB};
    if (setrlimit(RLIMIT_FSIZE, &limit) != 0) return 10;
    const size_t mapped = fake::mapped_reservations();
    const uvm_range ranges[] = {first.whole(), second.whole()};
    if (uvm_offload_ranges(ranges, 2, UVM_STRATEGY_DISK, nullptr) != UVM_ERROR_IO) return 11;
    const std::string message = uvm_last_error();
    if (message.find("uvm_offload_ranges(count=2)") == std::string::npos) return 12;
    if (message.find(dir) == std::string::npos || message.find("EFBIG") == std::string::npos) return 13;
    if (fake::mapped_reservations() != mapped) return 14;  // nothing released
    if (!first.intact() || !second.intact()) return 15;
    if (!backup_files(dir).empty()) return 16;  // the first file went too
    uvm_kept_copies kept{};
    uvm_get_kept_copies(UVM_ANY_DEVICE, nullptr, &kept);
    if (kept.disk_bytes != 0) return 17;
    if (cudaPeekAtLastError() != cudaSuccess) return 18;
    return 0;
  });
  CHECK(result == 0);
}

TEST_CASE("a backup file changed, truncated or removed while offloaded fails the onload by name; nothing moves",
          "[spill][disk][cuda13]") {
  const std::string& dir = test_disk_dir();
  const std::vector<std::pair<const char*, std::function<void(const std::string&)>>> faults = {
      {"was written or changed", [](const std::string& path) {
         const int fd = open(path.c_str(), O_WRONLY);
         REQUIRE(pwrite(fd, "x", 1, 100) == 1);
         close(fd);
       }},
      {"was truncated or extended", [](const std::string& path) { REQUIRE(truncate(path.c_str(), 4096) == 0); }},
      {"was removed while its bytes were offloaded", [](const std::string& path) { REQUIRE(unlink(path.c_str()) == 0); }},
  };
  for (const auto& [expected, fault] : faults) {
    CAPTURE(expected);
    FakeMachine machine;
    Releasable memory(2 * kMiB);
    const uvm_range range = memory.whole();
    REQUIRE(uvm_offload_ranges(&range, 1, UVM_STRATEGY_DISK, nullptr) == UVM_OK);
    const std::string path = only_file(dir);
    fault(path);
    CHECK(uvm_onload_ranges(&range, 1, nullptr) == UVM_ERROR_IO);
    CHECK_THAT(last_error(), Has(path) && Has(expected));
    CHECK(kept_copies().disk_bytes == memory.size);  // still offloaded: nothing read from it
    CHECK(cudaPeekAtLastError() == cudaSuccess);
    REQUIRE(uvm_discard_ranges(&range, 1, nullptr) == UVM_OK);  // the caller gives up on them
    CHECK(backup_files(dir).empty());
  }
}

TEST_CASE("files a dead process left are removed by the next one; a live process's stay", "[spill][disk]") {
  FakeMachine machine;
  char dir[] = "uvm-disk-test-sweep-XXXXXX";
  REQUIRE(mkdtemp(dir) != nullptr);
  const std::string base = dir;
  auto touch = [&](const std::string& name) { std::ofstream(base + "/" + name) << "bytes"; };
  touch("uvm-777-dead.lock");  // nobody holds it: its owner is gone
  touch("uvm-777-dead-1.backup");
  touch("uvm-777-dead-2.backup");
  touch("uvm-888-live.lock");
  touch("uvm-888-live-1.backup");
  touch("unrelated.txt");
  const int live = open((base + "/uvm-888-live.lock").c_str(), O_RDWR);
  REQUIRE(flock(live, LOCK_EX) == 0);  // a live process holds its lock
  char previous[PATH_MAX];
  REQUIRE(uvm_get_disk_backup_dir(previous, sizeof previous) == UVM_OK);
  REQUIRE(uvm_set_disk_backup_dir(dir) == UVM_OK);
  const auto left = backup_files(base);
  CHECK(left == std::vector<std::string>{"uvm-888-live-1.backup"});
  CHECK(access((base + "/uvm-777-dead.lock").c_str(), F_OK) != 0);
  CHECK(access((base + "/unrelated.txt").c_str(), F_OK) == 0);
  close(live);
  if (previous[0] != '\0') REQUIRE(uvm_set_disk_backup_dir(previous) == UVM_OK);
  // A killed process: a child pauses to disk and dies; the next process to use the directory
  // finds its lock free.
  char killed_dir[] = "uvm-disk-test-killed-XXXXXX";
  REQUIRE(mkdtemp(killed_dir) != nullptr);
  const int killed = in_child([&] {
    fake::set_thread_context(0);
    if (uvm_set_disk_backup_dir(killed_dir) != UVM_OK) return 1;
    void* p = uvm_malloc_releasable(kMiB, 0, nullptr);
    const uvm_range range{p, kMiB};
    if (uvm_offload_ranges(&range, 1, UVM_STRATEGY_DISK, nullptr) != UVM_OK) return 2;
    if (backup_files(killed_dir).size() != 1) return 3;
    raise(SIGKILL);
    return 4;
  });
  CHECK(killed == 128 + SIGKILL);
  CHECK(backup_files(killed_dir).size() == 1);
  REQUIRE(uvm_set_disk_backup_dir(killed_dir) == UVM_OK);
  CHECK(backup_files(killed_dir).empty());
  REQUIRE(uvm_set_disk_backup_dir(previous[0] != '\0' ? previous : test_disk_dir().c_str()) == UVM_OK);
  for (const std::string& made : {base, std::string(killed_dir)}) {
    nftw(made.c_str(), [](const char* path, const struct stat*, int, struct FTW*) { return remove(path); }, 8,
         FTW_DEPTH | FTW_PHYS);
  }
}

TEST_CASE("a process that exits normally removes its files and its lock", "[spill][disk]") {
  FakeMachine machine;
  char dir[] = "uvm-disk-test-exit-XXXXXX";
  REQUIRE(mkdtemp(dir) != nullptr);
  const pid_t child = fork();
  if (child == 0) {  // offloads to disk, then exits as a program does, staged copy and all
    fake::set_thread_context(0);
    if (uvm_set_disk_backup_dir(dir) != UVM_OK) _exit(1);
    void* p = uvm_malloc_releasable(kMiB, 0, nullptr);
    const uvm_range range{p, kMiB};
    if (uvm_offload_ranges(&range, 1, UVM_STRATEGY_DISK, nullptr) != UVM_OK) _exit(2);
    if (backup_files(dir).size() != 1) _exit(3);
    std::exit(0);
  }
  int status = 0;
  REQUIRE(waitpid(child, &status, 0) == child);
  REQUIRE(WIFEXITED(status));
  REQUIRE(WEXITSTATUS(status) == 0);
  CHECK(backup_files(dir).empty());
  CHECK(rmdir(dir) == 0);  // nothing else left either: no lock file
}

TEST_CASE("threads moving their own allocations to disk and mmap at once lose nothing", "[spill][threads][cuda13]") {
  test_disk_dir();
  FakeMachine machine;
  std::vector<std::thread> threads;
  std::atomic<int> wrong{0};
  for (int t = 0; t < 4; ++t) {
    threads.emplace_back([&, t] {
      fake::set_thread_context(0);
      Releasable memory((t + 1) * 5 * kMiB + 123 * 4096, 0, static_cast<unsigned>(t));
      const uvm_range range = memory.whole();
      for (int round = 0; round < 5; ++round) {
        const uvm_strategy strategy = (t + round) % 2 ? UVM_STRATEGY_DISK : UVM_STRATEGY_MMAP;
        if (uvm_offload_ranges(&range, 1, strategy, nullptr) != UVM_OK) ++wrong;
        if (uvm_onload_ranges(&range, 1, nullptr) != UVM_OK) ++wrong;
        if (!memory.intact()) ++wrong;
      }
    });
  }
  for (std::thread& thread : threads) thread.join();
  CHECK(wrong == 0);
  CHECK(backup_files(test_disk_dir()).empty());
}

// A process may hold no more descriptors than its limit (1,024 by default), and a model may have
// more tensors than that, each with a file of its own.
TEST_CASE("a disk onload of more files than the process may hold open at once brings every byte back",
          "[spill][disk][cuda13]") {
  test_disk_dir();
  FakeMachine machine;
  struct rlimit before {};
  REQUIRE(getrlimit(RLIMIT_NOFILE, &before) == 0);
  struct rlimit lowered = before;
  lowered.rlim_cur = 64;
  REQUIRE(setrlimit(RLIMIT_NOFILE, &lowered) == 0);
  std::vector<std::unique_ptr<Releasable>> memory;
  std::vector<uvm_range> ranges;
  for (unsigned i = 0; i < 300; ++i) {  // every other one moves: its neighbours stay
    memory.push_back(std::make_unique<Releasable>(64 * 1024 + i * 4096, 0, i));
    if (i % 2 == 0) ranges.push_back(memory.back()->whole());
  }
  const uvm_status offloaded = uvm_offload_ranges(ranges.data(), ranges.size(), UVM_STRATEGY_DISK, nullptr);
  const std::string offload_error = last_error();
  const uvm_status onloaded = uvm_onload_ranges(ranges.data(), ranges.size(), nullptr);
  const std::string onload_error = last_error();
  REQUIRE(setrlimit(RLIMIT_NOFILE, &before) == 0);
  INFO(offload_error << " / " << onload_error);
  CHECK(offloaded == UVM_OK);
  CHECK(onloaded == UVM_OK);
  CHECK(ranges.size() == 150);
  size_t wrong = 0;
  for (const auto& each : memory) wrong += each->intact() ? 0 : 1;
  CHECK(wrong == 0);
  if (onloaded != UVM_OK) REQUIRE(uvm_onload_ranges(ranges.data(), ranges.size(), nullptr) == UVM_OK);
  CHECK(backup_files(test_disk_dir()).size() == 0);
}

TEST_CASE("strategies outside the enum, and managed memory uvm did not allocate, are refused", "[spill][cuda13]") {
  test_disk_dir();
  FakeMachine machine;
  void* foreign = nullptr;
  REQUIRE(cudaMallocManaged(&foreign, kMiB, cudaMemAttachGlobal) == cudaSuccess);
  const uvm_range range{foreign, kMiB};
  CHECK(uvm_offload_ranges(&range, 1, UVM_STRATEGY_DISK, nullptr) == UVM_ERROR_INVALID_ARGUMENT);
  CHECK_THAT(last_error(), Has("managed memory not allocated by uvm: a disk copy must die with its memory"));
  uvm_strategy bad = UVM_STRATEGY_AUTO;
  const int five = 5;
  std::memcpy(&bad, &five, sizeof bad);
  CHECK(uvm_offload_ranges(&range, 1, bad, nullptr) == UVM_ERROR_INVALID_ARGUMENT);
  CHECK_THAT(last_error(), Has("strategy 5 is not a uvm_strategy"));
  cudaFree(foreign);
}

// Run alone (meson test offload-no-disk-dir): the process must never have set a directory.
TEST_CASE("a disk offload with no directory set fails saying how to set one; nothing moves", "[no_disk_dir][cuda13]") {
  FakeMachine machine;
  char dir[PATH_MAX] = "x";
  REQUIRE(uvm_get_disk_backup_dir(dir, sizeof dir) == UVM_OK);
  INFO("the directory this process set before: " << dir);
  REQUIRE(std::string(dir).empty());  // else the offload below succeeds, and reading the memory it gave back crashes
  Releasable memory(kMiB);
  const size_t mapped = fake::mapped_reservations();
  const uvm_range range = memory.whole();
  CHECK(uvm_offload_ranges(&range, 1, UVM_STRATEGY_DISK, nullptr) == UVM_ERROR_INVALID_ARGUMENT);
  CHECK_THAT(last_error(), Has("no disk backup directory: call uvm_set_disk_backup_dir or set UVM_DISK_BACKUP_DIR"));
  CHECK(fake::mapped_reservations() == mapped);
  CHECK(memory.intact());
  // A pause of a disk-backed allocation fails the same way and leaves it unpaused, on the device.
  REQUIRE(uvm_set_thread_backup(UVM_BACKUP_DISK) == UVM_OK);
  REQUIRE(uvm_set_thread_tag("weights") == UVM_OK);
  Releasable weights(kMiB, 0, 4);
  REQUIRE(uvm_set_thread_tag(nullptr) == UVM_OK);
  REQUIRE(uvm_set_thread_backup(UVM_BACKUP_NONE) == UVM_OK);
  CHECK(uvm_pause(UVM_ANY_DEVICE, "weights") == UVM_ERROR_INVALID_ARGUMENT);
  CHECK_THAT(last_error(), Has("uvm_pause(device=any, tag=\"weights\")") && Has("no disk backup directory"));
  size_t paused = 1;
  REQUIRE(uvm_paused_count(UVM_ANY_DEVICE, "weights", &paused) == UVM_OK);
  CHECK(paused == 0);
  CHECK(weights.intact());
}

// Run with env UVM_DISK_BACKUP_DIR (meson test offload-disk-dir-env): the environment names it.
TEST_CASE("UVM_DISK_BACKUP_DIR names the directory until a call sets another", "[disk_dir_env][cuda13]") {
  FakeMachine machine;
  const char* from_env = std::getenv("UVM_DISK_BACKUP_DIR");
  REQUIRE(from_env != nullptr);
  REQUIRE((mkdir(from_env, 0700) == 0 || errno == EEXIST));
  Releasable memory(kMiB);
  const uvm_range range = memory.whole();
  REQUIRE(uvm_offload_ranges(&range, 1, UVM_STRATEGY_DISK, nullptr) == UVM_OK);
  CHECK(backup_files(from_env).size() == 1);
  REQUIRE(uvm_onload_ranges(&range, 1, nullptr) == UVM_OK);
  CHECK(memory.intact());
  CHECK(backup_files(from_env).empty());
}

TEST_CASE("a removed file's descriptor closes on uvm's closing thread; past the most that may wait, and in a fork's child, at once",
          "[spill][disk]") {
  auto open_removed = [] {
    char name[] = "uvm-closer-test-XXXXXX";
    const int fd = mkstemp(name);
    REQUIRE(fd >= 0);
    REQUIRE(unlink(name) == 0);
    return fd;
  };
  auto is_open = [](int fd) { return fcntl(fd, F_GETFD) != -1; };
  struct rlimit limit {};
  REQUIRE(getrlimit(RLIMIT_NOFILE, &limit) == 0);  // at most 64 wait, and a sixteenth of the limit
  const size_t most = limit.rlim_cur == RLIM_INFINITY ? 64 : std::min<size_t>(64, limit.rlim_cur / 16);
  REQUIRE(most > 0);
  uvm::hold_closing_for_test(true);
  std::vector<int> fds;
  for (size_t i = 0; i <= most; ++i) fds.push_back(open_removed());
  for (int fd : fds) uvm::close_in_background(fd);
  for (size_t i = 0; i < most; ++i) CHECK(is_open(fds[i]));  // waiting on the held thread
  CHECK_FALSE(is_open(fds[most]));                             // one more: closed by its caller

  SECTION("the thread closes them all, and waiting returns after") {
    uvm::hold_closing_for_test(false);
    uvm::wait_for_closed_files();
    for (size_t i = 0; i < most; ++i) CHECK_FALSE(is_open(fds[i]));
  }
  SECTION("a child made by fork closes its copies itself and closes new ones on a thread of its own") {
    const pid_t child = fork();
    REQUIRE(child >= 0);
    if (child == 0) {
      for (size_t i = 0; i < most; ++i) {
        if (is_open(fds[i])) _exit(1);  // the parent's thread does not run here
      }
      uvm::hold_closing_for_test(false);
      const int fd = open_removed();
      uvm::close_in_background(fd);
      uvm::wait_for_closed_files();
      _exit(is_open(fd) ? 2 : 0);
    }
    int status = 0;
    REQUIRE(waitpid(child, &status, 0) == child);
    CHECK(WIFEXITED(status));
    CHECK(WEXITSTATUS(status) == 0);
    for (size_t i = 0; i < most; ++i) CHECK(is_open(fds[i]));  // the parent's stay held
    uvm::hold_closing_for_test(false);
    uvm::wait_for_closed_files();
    for (size_t i = 0; i < most; ++i) CHECK_FALSE(is_open(fds[i]));
  }
}

// Run by tests/offload/small_fs.sh (meson test offload-small-fs) with env UVM_TEST_SMALL_FS naming
// a directory on a small file system of its own: the disk really fills (ENOSPC from the kernel, not
// a stand-in), part-way through a run of offloads and within one call.
TEST_CASE("a full disk fails the offload and the pause by name; bytes stay on the device, no file, space back",
          "[small_fs][cuda13]") {
  const char* dir = std::getenv("UVM_TEST_SMALL_FS");
  REQUIRE(dir != nullptr);
  REQUIRE(uvm_set_disk_backup_dir(dir) == UVM_OK);
  auto free_bytes = [&] {
    struct statvfs about {};
    REQUIRE(statvfs(dir, &about) == 0);
    return static_cast<size_t>(about.f_bavail) * about.f_frsize;
  };
  FakeMachine machine;
  const size_t free_before = free_bytes();
  INFO("free on the small file system: " << free_before);
  REQUIRE(free_before > 4 * kMiB);
  const size_t mapped_before = fake::mapped_reservations();

  SECTION("one call that cannot fit: nothing moves, not even the part that fits") {
    Releasable fits(kMiB, 0, 1), too_big(free_before + 4 * kMiB, 0, 2);
    const size_t mapped = fake::mapped_reservations();
    const uvm_range ranges[] = {fits.whole(), too_big.whole()};
    CHECK(uvm_offload_ranges(ranges, 2, UVM_STRATEGY_DISK, nullptr) == UVM_ERROR_IO);
    CHECK_THAT(last_error(), Has("uvm_offload_ranges(count=2)") && Has(dir) && Has("(ENOSPC)"));
    CHECK(fake::mapped_reservations() == mapped);  // nothing released
    CHECK(fits.intact());
    CHECK(too_big.intact());
    CHECK(backup_files(dir).empty());
    CHECK(kept_copies().disk_bytes == 0);
    uvm::wait_for_closed_files();  // the names went at once, the blocks on uvm's closing thread
    CHECK(free_bytes() == free_before);
    CHECK(cudaPeekAtLastError() == cudaSuccess);
  }

  SECTION("one call whose files are made a few at a time fills the disk in a later group; nothing moves, no file") {
    // Groups of 3 files (as a move of thousands of allocations goes): the first groups are
    // written and sealed before a later one finds the disk full.
    constexpr size_t kEach = 2 * kMiB;
    std::vector<std::unique_ptr<Releasable>> made;
    std::vector<uvm_range> ranges;
    for (size_t i = 0; i < free_before / kEach + 2; ++i) {
      made.push_back(std::make_unique<Releasable>(kEach, 0, 40 + i));
      ranges.push_back(made.back()->whole());
    }
    const size_t mapped = fake::mapped_reservations();
    uvm::set_files_at_once_for_test(3);
    const uvm_status status = uvm_offload_ranges(ranges.data(), ranges.size(), UVM_STRATEGY_DISK, nullptr);
    uvm::set_files_at_once_for_test(0);
    CHECK(status == UVM_ERROR_IO);
    CHECK_THAT(last_error(), Has(dir) && Has("(ENOSPC)"));
    CHECK(fake::mapped_reservations() == mapped);  // nothing released
    for (const auto& memory : made) CHECK(memory->intact());
    CHECK(backup_files(dir).empty());  // the groups written before go too
    CHECK(kept_copies().disk_bytes == 0);
    uvm::wait_for_closed_files();
    CHECK(free_bytes() == free_before);
    CHECK(cudaPeekAtLastError() == cudaSuccess);
  }

  SECTION("offloads one after another until the disk is full: the first ones come back whole") {
    constexpr size_t kEach = 2 * kMiB;
    std::vector<std::unique_ptr<Releasable>> made;
    for (size_t i = 0; i < free_before / kEach + 2; ++i) made.push_back(std::make_unique<Releasable>(kEach, 0, i));
    size_t offloaded = 0;
    for (const auto& memory : made) {
      const uvm_range range = memory->whole();
      const size_t mapped = fake::mapped_reservations();
      const uvm_status status = uvm_offload_ranges(&range, 1, UVM_STRATEGY_DISK, nullptr);
      if (status == UVM_OK) {
        CHECK(offloaded == static_cast<size_t>(&memory - &made.front()));  // no success after a failure
        ++offloaded;
        continue;
      }
      CHECK(status == UVM_ERROR_IO);
      CHECK_THAT(last_error(), Has(dir) && Has("(ENOSPC)"));
      CHECK(fake::mapped_reservations() == mapped);
      CHECK(memory->intact());
    }
    CHECK(offloaded >= 1);
    CHECK(offloaded < made.size());  // the disk did fill
    CHECK(backup_files(dir).size() == offloaded);
    for (size_t i = 0; i < offloaded; ++i) {
      const uvm_range range = made[i]->whole();
      REQUIRE(uvm_onload_ranges(&range, 1, nullptr) == UVM_OK);
    }
    for (const auto& memory : made) CHECK(memory->intact());
    CHECK(backup_files(dir).empty());
    uvm::wait_for_closed_files();  // the names went at once, the blocks on uvm's closing thread
    CHECK(free_bytes() == free_before);
    CHECK(fake::mapped_reservations() == mapped_before + made.size());
  }

  SECTION("an offload right after an onload waits for the blocks of the files the onload removed") {
    const size_t each = free_before * 3 / 5 / 4096 * 4096;  // two copies cannot be on the disk at once
    Releasable first(each, 0, 5), second(each, 0, 6);
    const uvm_range a = first.whole(), b = second.whole();
    REQUIRE(uvm_offload_ranges(&a, 1, UVM_STRATEGY_DISK, nullptr) == UVM_OK);
    uvm::hold_closing_for_test(true);
    REQUIRE(uvm_onload_ranges(&a, 1, nullptr) == UVM_OK);
    CHECK(first.intact());
    CHECK(backup_files(dir).empty());     // the name went at once
    CHECK(free_bytes() < free_before);    // the blocks are still held
    std::thread let_go([] {
      uvm::wait_for_a_caller_waiting_for_test();  // the offload, finding the disk full
      uvm::hold_closing_for_test(false);
    });
    const uvm_status offloaded = uvm_offload_ranges(&b, 1, UVM_STRATEGY_DISK, nullptr);
    let_go.join();
    INFO(last_error());
    CHECK(offloaded == UVM_OK);  // it waited for the closing thread instead of failing with ENOSPC
    REQUIRE(uvm_onload_ranges(&b, 1, nullptr) == UVM_OK);
    CHECK(second.intact());
    uvm::wait_for_closed_files();
    CHECK(free_bytes() == free_before);
  }

  SECTION("a pause to a full disk fails naming the directory and leaves every allocation unpaused") {
    REQUIRE(uvm_set_thread_backup(UVM_BACKUP_DISK) == UVM_OK);
    REQUIRE(uvm_set_thread_tag("weights") == UVM_OK);
    Releasable first(kMiB, 0, 3), second(free_before, 0, 4);
    REQUIRE(uvm_set_thread_tag(nullptr) == UVM_OK);
    REQUIRE(uvm_set_thread_backup(UVM_BACKUP_NONE) == UVM_OK);
    const size_t mapped = fake::mapped_reservations();
    CHECK(uvm_pause(UVM_ANY_DEVICE, "weights") == UVM_ERROR_IO);
    CHECK_THAT(last_error(), Has("uvm_pause(device=any, tag=\"weights\")") && Has(dir) && Has("(ENOSPC)"));
    size_t paused = 1;
    REQUIRE(uvm_paused_count(UVM_ANY_DEVICE, "weights", &paused) == UVM_OK);
    CHECK(paused == 0);
    CHECK(fake::mapped_reservations() == mapped);
    CHECK(first.intact());
    CHECK(second.intact());
    CHECK(backup_files(dir).empty());
    uvm::wait_for_closed_files();  // the names went at once, the blocks on uvm's closing thread
    CHECK(free_bytes() == free_before);
  }
}

TEST_CASE("mmap copies move on one thread per CPU, 8 to 16; disk writes on 8, disk reads 4 x 64 MiB", "[spill][cuda13]") {
  test_disk_dir();
  cpu_set_t cpus;
  REQUIRE(sched_getaffinity(0, sizeof cpus, &cpus) == 0);
  const size_t expected_mmap = std::clamp<size_t>(CPU_COUNT(&cpus), 8, 16);
  // The buffers are pinned as one block: registered, or cudaHostAlloc'ed (UVM_PINNED=hostalloc).
  auto pinned_blocks = [] {
    auto pinned = FakeMachine::ops_named(fake::OpKind::host_alloc);
    for (const fake::Op& op : FakeMachine::ops_named(fake::OpKind::host_register)) pinned.push_back(op);
    return pinned;
  };
  // 17 bounce buffers' worth: enough batches for every thread either way could start.
  for (const uvm_strategy strategy : kKeptStrategies) {
    CAPTURE(name_of(strategy));
    FakeMachine machine;
    Releasable memory(17 * 16 * kMiB, 0, 4);
    REQUIRE(uvm_release_staging() == UVM_OK);  // the bounce buffers too: each thread pins its own anew
    fake::reset_ops();
    const uvm_range range = memory.whole();
    REQUIRE(uvm_offload_ranges(&range, 1, strategy, nullptr) == UVM_OK);
    auto pinned = pinned_blocks();
    REQUIRE(pinned.size() == 1);
    CHECK(pinned[0].size == (strategy == UVM_STRATEGY_MMAP ? expected_mmap : 8u) * 16 * kMiB);
    fake::reset_ops();
    REQUIRE(uvm_onload_ranges(&range, 1, nullptr) == UVM_OK);
    CHECK(memory.intact());
    pinned = pinned_blocks();
    if (strategy == UVM_STRATEGY_MMAP) {
      CHECK(pinned.empty());  // the offload's buffers again
    } else {
      REQUIRE(pinned.size() == 1);
      CHECK(pinned[0].size == 4 * 64 * kMiB);
    }
    REQUIRE(uvm_release_staging() == UVM_OK);
    CHECK(fake::pinned_blocks() == 0);  // every block given back, whatever its buffers' size
  }
}

TEST_CASE("a backup worker whose stream cannot be made or destroyed names it and loses nothing", "[spill][errors][cuda13]") {
  // Issue 58 item 5: each mmap move starts its workers with a stream of their own.
  test_disk_dir();
  FakeMachine machine;
  Releasable whole(40 * kMiB, 0, 7);
  const uvm_range range = whole.whole();
  // The k-th stream made fails, until it is a worker's (other streams are made once, or are the
  // trace's, which does without one).
  bool worker_failed = false;
  for (int skip = 0; skip < 16 && !worker_failed; ++skip) {
    fake::fail_next("cudaStreamCreateWithFlags", cudaErrorLaunchFailure, skip);
    uvm_clear_last_error();
    const uvm_status offloaded = uvm_offload_ranges(&range, 1, UVM_STRATEGY_MMAP, nullptr);
    CHECK(cudaPeekAtLastError() == cudaSuccess);
    worker_failed = offloaded != UVM_OK && last_error().find("for a backup worker") != std::string::npos;
    if (offloaded != UVM_OK) {
      CHECK_THAT(last_error(), Has("cudaStreamCreateWithFlags") && Has("cudaErrorLaunchFailure"));
    }
    fake::clear_injections();
    REQUIRE(uvm_onload_ranges(&range, 1, nullptr) == UVM_OK);  // whatever moved comes back
    CHECK(whole.intact());
  }
  CHECK(worker_failed);
  fake::fail_next("cudaStreamDestroy", cudaErrorLaunchFailure);  // after the work: nothing to undo
  REQUIRE(uvm_offload_ranges(&range, 1, UVM_STRATEGY_MMAP, nullptr) == UVM_OK);
  CHECK(cudaPeekAtLastError() == cudaSuccess);
  REQUIRE(uvm_onload_ranges(&range, 1, nullptr) == UVM_OK);
  CHECK(whole.intact());
  CHECK(kept_copies().pageable_bytes == 0);
}
