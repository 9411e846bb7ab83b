// Every environment variable libuvm reads, in one table with one parser and one policy: read once,
// at the first call that needs an option; unset or empty means the default; a value that is not
// understood fails every call that checks options (uvm_malloc first), naming the variable, instead
// of passing silently for the default. uvm.h's "Options" section lists the table for users.
#pragma once

#include <cstddef>
#include <functional>
#include <string>
#include <vector>

#include "errors.hpp"

namespace uvm {

// How staging memory is pinned (UVM_PINNED).
enum class PinnedKind {
  registered = UVM_PINNED_REGISTERED,
  host_alloc = UVM_PINNED_HOST_ALLOC,
  pageable = UVM_PINNED_PAGEABLE
};

// How an onload copies staged bytes into releasable memory (UVM_ONLOAD_COPY).
enum class OnloadCopy { engine, sm, mixed, automatic };

constexpr int kMaxOnloadStreams = 8;
constexpr int kMaxBackupThreads = 16;

struct Options {
  size_t limit_bytes = 0;       // UVM_LIMIT_BYTES; 0: not set
  double limit_fraction = 0;    // UVM_LIMIT_FRACTION, of the device's memory; 0: not set
  uvm_advice_mode default_advice = UVM_ADVICE_DEVICE;  // UVM_DEFAULT_ADVICE
  bool slabs = true;            // UVM_SLABS
  PinnedKind pinned = PinnedKind::registered;           // UVM_PINNED
  bool pin_numa = true;         // UVM_PIN_NUMA: staging memory on its GPU's NUMA node (numa.hpp)
  OnloadCopy onload_copy = OnloadCopy::automatic;       // UVM_ONLOAD_COPY
  size_t onload_chunk_bytes = size_t{64} << 20;         // UVM_ONLOAD_CHUNK_MIB
  int onload_streams = 4;                               // UVM_ONLOAD_STREAMS (1–kMaxOnloadStreams)
  std::string trace_path;       // UVM_TRACE, "%p" replaced by the process id; empty: no trace
  std::string disk_backup_dir;  // UVM_DISK_BACKUP_DIR; empty: none until uvm_set_disk_backup_dir
  int backup_threads = 0;       // UVM_BACKUP_THREADS (1–kMaxBackupThreads; 0: auto, by the copies' kind)
  bool settle = true;           // UVM_SETTLE: settle the driver after a wake (settle.hpp)
  int share_timeout_s = 120;    // UVM_SHARE_TIMEOUT_S: how long an importer waits for the exporter's answer
  std::vector<std::string> raw;  // each row's value as found in the environment, "" when unset
  // Why the environment was refused ("UVM_PINNED='pinned' is not one of …"); empty when every
  // variable was understood. A refused variable leaves its field at the default.
  std::string error;
};

// Parses the options from `lookup(name)` (the environment's value, or null when unset).
Options parse_options(const std::function<const char*(const char* name)>& lookup);

// The process's options, read from the environment at the first call.
const Options& options();

// UVM_OK, or fails `call` with UVM_ERROR_INVALID_ARGUMENT and the options' error.
uvm_status check_options(const Call& call);

}  // namespace uvm
