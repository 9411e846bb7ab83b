// Disk backups: the directory offloaded bytes are written to, and the files that hold them. One
// file per allocation an offload moves, created owner-only, removed with the last staged piece
// holding it (onloaded, discarded or freed), so a file never outlives the bytes it describes. Its
// name goes at once; its blocks are given back on uvm's closing thread (closer.hpp), which a disk
// offload that finds the disk full waits for before it fails.
//
// A process removes its files when it exits normally; one killed while paused cannot, and the
// next process that uses the directory does. Each process holds an exclusive lock on uvm-<pid>.lock there while it lives (the kernel
// drops it when the process dies, whatever the reason), so a lock that can be taken names files
// nobody owns. This holds across pid reuse, where checking the pid alone would not.
#pragma once

#include <sys/types.h>

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>

#include "../../alloc/errors.hpp"

namespace uvm {

// The alignment of every file offset and length uvm reads or writes: O_DIRECT takes the logical
// block size, and 4 KiB is a multiple of every one in use.
constexpr size_t kDiskAlign = 4096;

// The directory disk offloads go to ("" when none is set): uvm_set_disk_backup_dir's, else env
// UVM_DISK_BACKUP_DIR's.
std::string disk_backup_dir();

// Checks `path` (exists, a directory, writable, owned by this user, not a tmpfs or ramfs), takes
// this process's lock there, removes what dead processes left, and makes it the directory.
uvm_status set_disk_backup_dir(const Call& call, const char* path);

// A file of offloaded bytes.
class BackupFile {
 public:
  // A new file of `bytes` (a multiple of kDiskAlign) in the backup directory, its blocks allocated
  // up front so that a full disk fails here and not half-way through the copies.
  static uvm_status create(const Call& call, uint64_t bytes, std::shared_ptr<BackupFile>* out);
  ~BackupFile();  // removes the name now and gives the blocks back on uvm's closing thread
  BackupFile(const BackupFile&) = delete;
  BackupFile& operator=(const BackupFile&) = delete;

  const std::string& path() const { return path_; }
  uint64_t bytes() const { return bytes_; }
  // The descriptor an offload writes through: open from create() until seal().
  int fd() const { return fd_; }
  // After the last write: flushes it to the disk, records what the file is (so that a change while
  // its bytes are offloaded is caught) and closes it, since a process may hold thousands of files
  // and no more descriptors than its limit (1,024 by default).
  uvm_status seal(const Call& call);
  // Opens it again to read it back into `fd` (the caller closes it); fails naming the path if the
  // file was removed, replaced, truncated or written since it was sealed.
  uvm_status open_unchanged(const Call& call, int* fd) const;
  // A sealed file that a retained copy holds (uvm_set_retain_backups): whether its name still
  // leads to it, at its size, so that the next pause may write it again in place; and reopen(),
  // which opens it for those writes (fd() until seal() again), failing naming the path if it
  // was removed or replaced meanwhile.
  bool still_there() const;
  uvm_status reopen(const Call& call);

 private:
  BackupFile() = default;
  std::string path_;
  uint64_t bytes_ = 0;
  int fd_ = -1;
  // Whether reads and writes bypass the page cache (O_DIRECT); else the file is written back and
  // its cached pages dropped once sealed, so a disk copy holds no host memory either way.
  bool direct_ = false;
  dev_t device_ = 0;
  ino_t inode_ = 0;
  int64_t changed_ns_ = 0;  // st_ctim when sealed: any write, truncation or chmod moves it
};

// Writes or reads all `bytes` at `offset` of `file` through `fd` (retrying short transfers and
// EINTR); a failure names the file, the offset and the errno.
uvm_status write_file(const Call& call, const BackupFile& file, int fd, const char* data, size_t bytes, uint64_t offset);
uvm_status read_file(const Call& call, const BackupFile& file, int fd, char* data, size_t bytes, uint64_t offset);

}  // namespace uvm
