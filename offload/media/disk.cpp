#include "disk.hpp"

#include <dirent.h>
#include <fcntl.h>
#include <linux/magic.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <sys/vfs.h>
#include <unistd.h>

#include <atomic>
#include <climits>
#include <cstdio>
#include <cstdlib>
#include <vector>
#include <cerrno>
#include <chrono>
#include <cstring>
#include <mutex>
#include <set>

#include "../../alloc/options.hpp"
#include "closer.hpp"

namespace uvm {
namespace {

// What names this process's files: its pid and the time it first named a file, so that two
// processes with one pid (in two containers sharing the directory) never share a name. A child
// made by fork gets a tag of its own: it must not pass for its parent.
std::string process_tag() {
  static std::mutex mutex;
  static pid_t tagged = 0;
  static std::string* tag = new std::string();  // never destroyed: no code runs from static destructors
  std::lock_guard<std::mutex> lock(mutex);
  if (tagged != getpid()) {
    tagged = getpid();
    const auto now = std::chrono::system_clock::now().time_since_epoch();
    char text[64];
    std::snprintf(text, sizeof text, "%d-%llx", static_cast<int>(tagged),
                  static_cast<unsigned long long>(std::chrono::duration_cast<std::chrono::nanoseconds>(now).count()));
    *tag = text;
  }
  return *tag;
}

struct Directory {
  std::mutex mutex;
  pid_t process = 0;             // whose locks `locked` lists (a forked child holds none of its own)
  std::string path;              // set, or the environment's once prepared
  bool set_by_call = false;      // uvm_set_disk_backup_dir chose it
  std::set<std::string> locked;  // directories holding this process's lock
};

Directory& directory() {
  static auto* state = new Directory();  // never destroyed: no code runs from static destructors
  return *state;
}

// Why `path` could not be followed (`error`, from realpath or stat), as a failure of `call`. A path
// this process may not follow is the caller's to fix, as a missing one is: a parent it may not
// enter (EACCES: a checkout under another user's 0700 home), a file where a directory should be,
// a loop, a name too long.
uvm_status refuse_unfollowable(const Call& call, const char* path, int error) {
  if (error == ENOENT) return fail(call, UVM_ERROR_INVALID_ARGUMENT, "the disk backup directory %s does not exist", path);
  if (error == EACCES || error == ENOTDIR || error == ELOOP || error == ENAMETOOLONG) {
    return fail(call, UVM_ERROR_INVALID_ARGUMENT, "the disk backup directory %s cannot be reached by uid %u: %s (%s)%s",
                path, static_cast<unsigned>(geteuid()), std::strerror(error), strerrorname_np(error),
                error == EACCES ? ": a directory on its path may not be searched by this user" : "");
  }
  return fail_errno(call, error, "resolving the disk backup directory %s", path);
}

// Why `path` cannot hold disk backups, as a failure of `call`; UVM_OK if it can.
uvm_status check_directory(const Call& call, const std::string& path) {
  struct stat about{};
  if (stat(path.c_str(), &about) != 0) return refuse_unfollowable(call, path.c_str(), errno);
  if (!S_ISDIR(about.st_mode)) {
    return fail(call, UVM_ERROR_INVALID_ARGUMENT, "the disk backup directory %s is not a directory", path.c_str());
  }
  if (about.st_uid != geteuid()) {
    return fail(call, UVM_ERROR_INVALID_ARGUMENT,
                "the disk backup directory %s belongs to uid %u, not to this process's uid %u: its owner could "
                "read or replace the backups",
                path.c_str(), static_cast<unsigned>(about.st_uid), static_cast<unsigned>(geteuid()));
  }
  if (access(path.c_str(), W_OK | X_OK) != 0) {
    return fail(call, UVM_ERROR_INVALID_ARGUMENT, "the disk backup directory %s is not writable: %s", path.c_str(),
                std::strerror(errno));
  }
  struct statfs system{};
  if (statfs(path.c_str(), &system) != 0) return fail_errno(call, errno, "statfs(%s)", path.c_str());
  if (system.f_type == TMPFS_MAGIC || system.f_type == RAMFS_MAGIC) {
    return fail(call, UVM_ERROR_INVALID_ARGUMENT,
                "the disk backup directory %s is on a %s, whose files live in host memory, which a disk backup "
                "is meant to spare: choose a directory on a disk",
                path.c_str(), system.f_type == TMPFS_MAGIC ? "tmpfs" : "ramfs");
  }
  return UVM_OK;
}

// "uvm-<tag>.lock" → "<tag>"; "" for other names.
std::string lock_owner(const char* name) {
  const std::string text = name;
  const std::string prefix = "uvm-", suffix = ".lock";
  if (text.size() <= prefix.size() + suffix.size() || text.compare(0, prefix.size(), prefix) != 0 ||
      text.compare(text.size() - suffix.size(), suffix.size(), suffix) != 0) {
    return {};
  }
  return text.substr(prefix.size(), text.size() - prefix.size() - suffix.size());
}

std::vector<std::string> entries(const std::string& path) {
  std::vector<std::string> names;
  if (DIR* dir = opendir(path.c_str())) {
    while (const dirent* entry = readdir(dir)) names.push_back(entry->d_name);
    closedir(dir);
  }
  return names;
}

// At a normal exit the process's files (staged and retained copies alike) and locks go with it; a
// killed process's go at the next process's prepare(). No lock is waited for: with the directory's
// held by a thread still at work, the files stay for the next process to remove. Unlinking is all
// it does (no CUDA call at exit).
void remove_own_files() {
  Directory& state = directory();
  std::unique_lock<std::mutex> lock(state.mutex, std::try_to_lock);
  if (!lock.owns_lock() || state.process != getpid()) return;  // a forked child leaves its parent's
  const std::string own = "uvm-" + process_tag();
  for (const std::string& path : state.locked) {
    for (const std::string& name : entries(path)) {
      if (name.compare(0, own.size() + 1, own + "-") == 0) unlink((path + "/" + name).c_str());
    }
    unlink((path + "/" + own + ".lock").c_str());
  }
}

// Removes the files of every process whose lock in `path` can be taken (it is no longer alive),
// then takes this process's lock there (kept open for the life of the process).
uvm_status prepare(const Call& call, const std::string& path) {
  Directory& state = directory();
  static std::once_flag at_exit;  // inherited by a forked child, which remove_own_files tells apart
  std::call_once(at_exit, [] { std::atexit(remove_own_files); });
  if (state.process != getpid()) {
    state.process = getpid();
    state.locked.clear();
  }
  if (state.locked.count(path)) return UVM_OK;
  const std::vector<std::string> names = entries(path);
  for (const std::string& name : names) {
    const std::string owner = lock_owner(name.c_str());
    if (owner.empty() || owner == process_tag()) continue;
    const std::string lock_path = path + "/" + name;
    const int fd = open(lock_path.c_str(), O_RDWR | O_CLOEXEC);
    if (fd < 0) continue;
    if (flock(fd, LOCK_EX | LOCK_NB) == 0) {  // its owner is gone
      const std::string prefix = "uvm-" + owner + "-";
      for (const std::string& file : names) {
        if (file.compare(0, prefix.size(), prefix) == 0) unlink((path + "/" + file).c_str());
      }
      unlink(lock_path.c_str());
    }
    close(fd);
  }
  const std::string lock_path = path + "/uvm-" + process_tag() + ".lock";
  const int fd = open(lock_path.c_str(), O_RDWR | O_CREAT | O_CLOEXEC, 0600);
  if (fd < 0) return fail_errno(call, errno, "creating the lock file %s", lock_path.c_str());
  if (flock(fd, LOCK_EX | LOCK_NB) != 0) {
    const int error = errno;
    close(fd);
    return fail_errno(call, error, "locking %s", lock_path.c_str());
  }
  state.locked.insert(path);  // the descriptor stays open, holding the lock, until the process ends
  return UVM_OK;
}

// The directory a new file goes to, checked and prepared.
uvm_status current_directory(const Call& call, std::string* out) {
  Directory& state = directory();
  std::lock_guard<std::mutex> lock(state.mutex);
  if (!state.path.empty()) {
    if (uvm_status s = prepare(call, state.path)) return s;  // a forked child takes its own lock
  } else if (!state.set_by_call) {
    const std::string& from_env = options().disk_backup_dir;
    if (from_env.empty()) {
      return fail(call, UVM_ERROR_INVALID_ARGUMENT,
                  "no disk backup directory: call uvm_set_disk_backup_dir or set UVM_DISK_BACKUP_DIR to a directory "
                  "on a real disk");
    }
    if (uvm_status s = check_directory(call, from_env)) return s;
    if (uvm_status s = prepare(call, from_env)) return s;
    state.path = from_env;
  }
  *out = state.path;
  return UVM_OK;
}

int64_t change_ns(const struct stat& about) {
  return static_cast<int64_t>(about.st_ctim.tv_sec) * 1000000000 + about.st_ctim.tv_nsec;
}

}  // namespace

std::string disk_backup_dir() {
  Directory& state = directory();
  std::lock_guard<std::mutex> lock(state.mutex);
  return state.set_by_call || !state.path.empty() ? state.path : options().disk_backup_dir;
}

uvm_status set_disk_backup_dir(const Call& call, const char* path) {
  if (path == nullptr || *path == '\0') return fail(call, UVM_ERROR_INVALID_ARGUMENT, "path is NULL or empty");
  char resolved[PATH_MAX];
  if (realpath(path, resolved) == nullptr) return refuse_unfollowable(call, path, errno);
  if (uvm_status s = check_directory(call, resolved)) return s;
  Directory& state = directory();
  std::lock_guard<std::mutex> lock(state.mutex);
  if (uvm_status s = prepare(call, resolved)) return s;
  state.path = resolved;
  state.set_by_call = true;
  return UVM_OK;
}

uvm_status BackupFile::create(const Call& call, uint64_t bytes, std::shared_ptr<BackupFile>* out) {
  std::string dir;
  if (uvm_status s = current_directory(call, &dir)) return s;
  static std::atomic<uint64_t> next{1};
  std::shared_ptr<BackupFile> file(new BackupFile());
  file->path_ = dir + "/uvm-" + process_tag() + "-" + std::to_string(next++) + ".backup";
  file->bytes_ = bytes;
  const int flags = O_RDWR | O_CREAT | O_EXCL | O_CLOEXEC;
  file->fd_ = open(file->path_.c_str(), flags | O_DIRECT, 0600);
  file->direct_ = file->fd_ >= 0;
  if (file->fd_ < 0 && errno == EINVAL) file->fd_ = open(file->path_.c_str(), flags, 0600);  // no O_DIRECT here
  if (file->fd_ < 0) {
    const int error = errno;
    file->path_.clear();  // nothing to remove
    if (error == ENOENT) {
      return fail(call, UVM_ERROR_IO, "the disk backup directory %s does not exist any more", dir.c_str());
    }
    return fail_errno(call, error, "creating a disk backup file in %s", dir.c_str());
  }
  int error = posix_fallocate(file->fd_, 0, static_cast<off_t>(bytes));
  if (error == ENOSPC) {  // files removed just before may still be giving their blocks back
    wait_for_closed_files();
    error = posix_fallocate(file->fd_, 0, static_cast<off_t>(bytes));
  }
  if (error != 0) {
    if (error != EOPNOTSUPP && error != EINVAL) {
      return fail_errno(call, error, "allocating %llu bytes for %s", static_cast<unsigned long long>(bytes),
                        file->path_.c_str());
    }
    if (ftruncate(file->fd_, static_cast<off_t>(bytes)) != 0) {  // a file system without fallocate
      return fail_errno(call, errno, "sizing %s to %llu bytes", file->path_.c_str(), static_cast<unsigned long long>(bytes));
    }
  }
  *out = std::move(file);
  return UVM_OK;
}

BackupFile::~BackupFile() {
  if (path_.empty()) {
    if (fd_ >= 0) close(fd_);
    return;
  }
  // The name goes now; the blocks go with the last descriptor, closed on uvm's closing thread
  // (closer.hpp: freeing them here cost a second of a 4 GiB resume). With none to be had, the
  // unlink frees them here, as it always did.
  const int holding = fd_ >= 0 ? fd_ : open(path_.c_str(), O_RDONLY | O_CLOEXEC);
  unlink(path_.c_str());
  if (holding >= 0) close_in_background(holding);
}

uvm_status BackupFile::seal(const Call& call) {
  // Through the page cache, the bytes would hold host memory until written back: write them back
  // and drop them. With O_DIRECT nothing is cached; the file is not kept across a crash, so it
  // needs no flush for durability.
  if (!direct_) {
    if (fdatasync(fd_) != 0) return fail_errno(call, errno, "writing %s back to the disk", path_.c_str());
    posix_fadvise(fd_, 0, 0, POSIX_FADV_DONTNEED);
  }
  struct stat about{};
  if (fstat(fd_, &about) != 0) return fail_errno(call, errno, "fstat(%s)", path_.c_str());
  device_ = about.st_dev;
  inode_ = about.st_ino;
  changed_ns_ = change_ns(about);
  close(fd_);
  fd_ = -1;
  return UVM_OK;
}

uvm_status BackupFile::open_unchanged(const Call& call, int* fd) const {
  const int opened = open(path_.c_str(), O_RDONLY | O_CLOEXEC | (direct_ ? O_DIRECT : 0));
  if (opened < 0) {
    if (errno == ENOENT) {
      return fail(call, UVM_ERROR_IO, "the disk backup file %s was removed while its bytes were offloaded",
                  path_.c_str());
    }
    return fail_errno(call, errno, "opening the disk backup file %s", path_.c_str());
  }
  struct stat about{};
  const char* changed = nullptr;
  if (fstat(opened, &about) != 0) changed = "could not be examined";
  else if (about.st_dev != device_ || about.st_ino != inode_) changed = "was replaced by another file";
  else if (static_cast<uint64_t>(about.st_size) != bytes_) changed = "was truncated or extended";
  else if (change_ns(about) != changed_ns_) changed = "was written or changed";
  if (changed != nullptr) {
    close(opened);
    return fail(call, UVM_ERROR_IO,
                "the disk backup file %s %s while its bytes were offloaded (%llu bytes written, %lld now): it cannot "
                "be trusted, and they stay offloaded",
                path_.c_str(), changed, static_cast<unsigned long long>(bytes_), static_cast<long long>(about.st_size));
  }
  *fd = opened;
  return UVM_OK;
}

bool BackupFile::still_there() const {
  struct stat about{};
  return !path_.empty() && stat(path_.c_str(), &about) == 0 && about.st_dev == device_ && about.st_ino == inode_ &&
         static_cast<uint64_t>(about.st_size) == bytes_;
}

uvm_status BackupFile::reopen(const Call& call) {
  const int opened = open(path_.c_str(), O_WRONLY | O_CLOEXEC | (direct_ ? O_DIRECT : 0));
  if (opened < 0) return fail_errno(call, errno, "opening the retained disk backup file %s to write it again", path_.c_str());
  struct stat about{};
  if (fstat(opened, &about) != 0 || about.st_dev != device_ || about.st_ino != inode_ ||
      static_cast<uint64_t>(about.st_size) != bytes_) {
    close(opened);
    return fail(call, UVM_ERROR_IO, "the retained disk backup file %s was replaced or resized; it is not written again",
                path_.c_str());
  }
  fd_ = opened;
  return UVM_OK;
}

uvm_status write_file(const Call& call, const BackupFile& file, int fd, const char* data, size_t bytes,
                      uint64_t offset) {
  for (size_t done = 0; done < bytes;) {
    const ssize_t n = pwrite(fd, data + done, bytes - done, static_cast<off_t>(offset + done));
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) {
      return fail_errno(call, n < 0 ? errno : ENOSPC, "writing %zu bytes at offset %llu of %s", bytes - done,
                        static_cast<unsigned long long>(offset + done), file.path().c_str());
    }
    done += static_cast<size_t>(n);
  }
  return UVM_OK;
}

uvm_status read_file(const Call& call, const BackupFile& file, int fd, char* data, size_t bytes, uint64_t offset) {
  for (size_t done = 0; done < bytes;) {
    const ssize_t n = pread(fd, data + done, bytes - done, static_cast<off_t>(offset + done));
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) {
      return fail_errno(call, errno, "reading %zu bytes at offset %llu of %s", bytes - done,
                        static_cast<unsigned long long>(offset + done), file.path().c_str());
    }
    if (n == 0) {
      return fail(call, UVM_ERROR_IO, "reading %s: it ends at %llu bytes, before the %llu its offloaded bytes need",
                  file.path().c_str(), static_cast<unsigned long long>(offset + done),
                  static_cast<unsigned long long>(offset + bytes));
    }
    done += static_cast<size_t>(n);
  }
  return UVM_OK;
}

}  // namespace uvm

extern "C" {

uvm_status uvm_set_disk_backup_dir(const char* path) {
  const uvm::Call call = uvm::Call::of("uvm_set_disk_backup_dir");
  return uvm::guarded(call, [&] {
    if (uvm_status s = uvm::check_options(call)) return s;
    return uvm::set_disk_backup_dir(call, path);
  });
}

uvm_status uvm_get_disk_backup_dir(char* path, size_t capacity) {
  const uvm::Call call = uvm::Call::of("uvm_get_disk_backup_dir").with_size(capacity);
  return uvm::guarded(call, [&] {
    if (path == nullptr) return uvm::fail(call, UVM_ERROR_INVALID_ARGUMENT, "path is NULL");
    const std::string dir = uvm::disk_backup_dir();
    if (dir.size() + 1 > capacity) {
      return uvm::fail(call, UVM_ERROR_INVALID_ARGUMENT, "the directory takes %zu bytes with its NUL, more than %zu",
                       dir.size() + 1, capacity);
    }
    std::memcpy(path, dir.c_str(), dir.size() + 1);
    return UVM_OK;
  });
}

}  // extern "C"
