#include "options.hpp"

#include <strings.h>
#include <unistd.h>

#include <cerrno>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <limits>

namespace uvm {
namespace {

// A row's parser: reads `text` (set, not empty) into `into`; false, leaving `into` as it was, when
// it is not understood.
using Parse = bool (*)(const char* text, Options* into);

// An unsigned count with an optional binary suffix: "68719476736", "64G", "512MiB", "2k".
bool parse_bytes(const char* text, size_t* bytes) {
  errno = 0;
  char* end = nullptr;
  const unsigned long long value = std::strtoull(text, &end, 10);
  if (end == text || errno == ERANGE || *text == '-') return false;
  unsigned shift = 0;
  switch (*end) {
    case '\0': break;
    case 'K': case 'k': shift = 10; ++end; break;
    case 'M': case 'm': shift = 20; ++end; break;
    case 'G': case 'g': shift = 30; ++end; break;
    case 'T': case 't': shift = 40; ++end; break;
    default: return false;
  }
  if (*end == 'i' && shift) ++end;  // "GiB" as well as "G"
  if ((*end == 'B' || *end == 'b') && shift) ++end;
  if (*end != '\0' || value == 0) return false;
  if (value > (std::numeric_limits<size_t>::max() >> shift)) return false;
  *bytes = static_cast<size_t>(value) << shift;
  return true;
}

bool parse_int_in(const char* text, long low, long high, long* out) {
  errno = 0;
  char* end = nullptr;
  const long value = std::strtol(text, &end, 10);
  if (end == text || *end != '\0' || errno == ERANGE || value < low || value > high) return false;
  *out = value;
  return true;
}

// `text` as one of `names` (case-insensitive), its index in *out.
template <size_t N>
bool parse_name(const char* text, const char* const (&names)[N], size_t* out) {
  for (size_t i = 0; i < N; ++i) {
    if (strcasecmp(text, names[i]) == 0) {
      *out = i;
      return true;
    }
  }
  return false;
}

bool parse_limit_bytes(const char* text, Options* into) { return parse_bytes(text, &into->limit_bytes); }

bool parse_limit_fraction(const char* text, Options* into) {
  char* end = nullptr;
  const double fraction = std::strtod(text, &end);
  if (end == text || *end != '\0' || !(fraction > 0) || !std::isfinite(fraction)) return false;
  into->limit_fraction = fraction;
  return true;
}

bool parse_default_advice(const char* text, Options* into) {
  static const char* const names[] = {"device", "host", "none"};
  static const uvm_advice_mode modes[] = {UVM_ADVICE_DEVICE, UVM_ADVICE_HOST, UVM_ADVICE_NONE};
  size_t index = 0;
  if (!parse_name(text, names, &index)) return false;
  into->default_advice = modes[index];
  return true;
}

// "1" or "0" into `*on`.
bool parse_switch(const char* text, bool* on) {
  static const char* const names[] = {"0", "1"};
  size_t index = 0;
  if (!parse_name(text, names, &index)) return false;
  *on = index == 1;
  return true;
}

bool parse_slabs(const char* text, Options* into) { return parse_switch(text, &into->slabs); }

bool parse_settle(const char* text, Options* into) { return parse_switch(text, &into->settle); }

bool parse_pin_numa(const char* text, Options* into) { return parse_switch(text, &into->pin_numa); }

bool parse_share_timeout(const char* text, Options* into) {
  long seconds = 0;
  if (!parse_int_in(text, 1, 86400, &seconds)) return false;
  into->share_timeout_s = static_cast<int>(seconds);
  return true;
}

bool parse_pinned(const char* text, Options* into) {
  static const char* const names[] = {"register", "hostalloc", "pageable"};
  static const PinnedKind kinds[] = {PinnedKind::registered, PinnedKind::host_alloc, PinnedKind::pageable};
  size_t index = 0;
  if (!parse_name(text, names, &index)) return false;
  into->pinned = kinds[index];
  return true;
}

bool parse_onload_copy(const char* text, Options* into) {
  static const char* const names[] = {"auto", "engine", "sm", "mixed"};
  static const OnloadCopy ways[] = {OnloadCopy::automatic, OnloadCopy::engine, OnloadCopy::sm, OnloadCopy::mixed};
  size_t index = 0;
  if (!parse_name(text, names, &index)) return false;
  into->onload_copy = ways[index];
  return true;
}

bool parse_chunk_mib(const char* text, Options* into) {
  long mib = 0;
  if (!parse_int_in(text, 1, 4096, &mib)) return false;
  into->onload_chunk_bytes = static_cast<size_t>(mib) << 20;
  return true;
}

bool parse_streams(const char* text, Options* into) {
  long streams = 0;
  if (!parse_int_in(text, 1, kMaxOnloadStreams, &streams)) return false;
  into->onload_streams = static_cast<int>(streams);
  return true;
}

bool parse_trace(const char* text, Options* into) {
  std::string path = text;
  const size_t pid_at = path.find("%p");  // one file per process of a job
  if (pid_at != std::string::npos) path.replace(pid_at, 2, std::to_string(getpid()));
  into->trace_path = path;
  return true;
}

bool parse_disk_backup_dir(const char* text, Options* into) {
  into->disk_backup_dir = text;  // checked where it is used (offload/media/disk.cpp), naming the reason
  return true;
}

bool parse_backup_threads(const char* text, Options* into) {
  long threads = 0;
  if (std::strcmp(text, "auto") == 0) {
    into->backup_threads = 0;
    return true;
  }
  if (!parse_int_in(text, 1, kMaxBackupThreads, &threads)) return false;
  into->backup_threads = static_cast<int>(threads);
  return true;
}

// One row of the table, as uvm_get_option hands it out, and its parser.
struct OptionRow {
  const char* name;
  const char* default_value;
  const char* meaning;
};
struct Row {
  OptionRow shown;
  Parse parse;
};

// The defaults' reasons are measured and written up in docs/performance.md.
const Row kRows[] = {
    {{"UVM_LIMIT_BYTES", "the device's memory",
      "most managed bytes uvm_malloc hands out per device: a count, or with K, M, G or T (binary) as in 64G"},
     parse_limit_bytes},
    {{"UVM_LIMIT_FRACTION", "1",
      "the same limit as a fraction of the device's memory, a number > 0 (above 1 oversubscribes); not with "
      "UVM_LIMIT_BYTES"},
     parse_limit_fraction},
    {{"UVM_DEFAULT_ADVICE", "device",
      "device, host or none: the advice uvm_malloc gives new memory (uvm_set_default_advice overrides)"},
     parse_default_advice},
    {{"UVM_SLABS", "1", "1 or 0: serve PyTorch's 2 MiB segments from shared slabs (0: one driver allocation each)"},
     parse_slabs},
    {{"UVM_PINNED", "register",
      "register, hostalloc or pageable: how staging memory is pinned (mapped and registered, cudaHostAlloc, or "
      "never pinned)"},
     parse_pinned},
    {{"UVM_PIN_NUMA", "1",
      "1 or 0: on a host with more than one NUMA node, pinned staging memory is placed on the node of the GPU "
      "whose copies it serves (0: wherever the kernel puts it)"},
     parse_pin_numa},
    {{"UVM_ONLOAD_COPY", "auto",
      "auto, engine, sm or mixed: what copies staged bytes back into releasable memory (a uvm kernel, the copy "
      "engines, both)"},
     parse_onload_copy},
    // Populating a piece and copying it right after kept the copies at speed in every case measured;
    // four streams beat two, and smaller chunks on more streams did not beat these
    // (docs/measurements.md, "Where the onload time goes").
    {{"UVM_ONLOAD_CHUNK_MIB", "64", "1-4096: MiB an onload populates and copies back in one step"}, parse_chunk_mib},
    {{"UVM_ONLOAD_STREAMS", "4", "1-8: streams an onload copies on"}, parse_streams},
    {{"UVM_TRACE", "", "a file: every move's phases as Chrome trace events (%p becomes the process id)"},
     parse_trace},
    {{"UVM_DISK_BACKUP_DIR", "", "a directory on a real disk for UVM_STRATEGY_DISK's files (uvm_set_disk_backup_dir "
      "overrides)"},
     parse_disk_backup_dir},
    // mmap copies are CPU work (page faults, memcpy): 16 threads kept up with the pinned backup, 8
    // did not; 16 paused to disk slower than 8 (docs/measurements.md, "Backups in mmap'ed memory").
    {{"UVM_BACKUP_THREADS", "auto",
      "auto or 1-16: threads (each with a pinned buffer, 16 MiB or 64 MiB for disk reads) that move mmap and "
      "disk copies; auto: 8 for disk writes, 4 for disk reads, for mmap copies one per CPU uvm may run on, 8 to 16"},
     parse_backup_threads},
    {{"UVM_SETTLE", "1",
      "1 or 0: after a wake made new device memory, a thread of uvm's pays the driver's deferred work on it "
      "(0: the next call that makes or gives back memory pays it)"},
     parse_settle},
    // An import is answered under the exporter's moves lock, so it waits behind a pause there (seconds
    // for GiBs); an exporter that never answers must not hang the importer.
    {{"UVM_SHARE_TIMEOUT_S", "120",
      "1-86400: seconds uvm_share_import and uvm_share_close wait for the exporting process's answer"},
     parse_share_timeout},
};
constexpr size_t kRowCount = sizeof kRows / sizeof kRows[0];
static_assert(kMaxOnloadStreams == 8, "UVM_ONLOAD_STREAMS's meaning says 1-8");
static_assert(kMaxBackupThreads == 16, "UVM_BACKUP_THREADS's meaning says 1-16");

}  // namespace

Options parse_options(const std::function<const char*(const char* name)>& lookup) {
  Options options;
  options.raw.resize(kRowCount);
  for (size_t i = 0; i < kRowCount; ++i) {
    const char* text = lookup(kRows[i].shown.name);
    if (text == nullptr || *text == '\0') continue;
    options.raw[i] = text;
    if (!kRows[i].parse(text, &options) && options.error.empty()) {
      options.error = std::string(kRows[i].shown.name) + "='" + text + "' is not understood; expected " +
                      kRows[i].shown.meaning;
    }
  }
  if (options.limit_bytes != 0 && options.limit_fraction != 0) {
    if (options.error.empty()) options.error = "set only one of UVM_LIMIT_BYTES and UVM_LIMIT_FRACTION";
    options.limit_bytes = 0;
    options.limit_fraction = 0;
  }
  return options;
}

const Options& options() {
  // Never destroyed: libuvm runs no code from static destructors.
  static const Options* read = new Options(parse_options([](const char* name) { return std::getenv(name); }));
  return *read;
}

uvm_status check_options(const Call& call) {
  const Options& in_force = options();
  if (in_force.error.empty()) return UVM_OK;
  return fail(call, UVM_ERROR_INVALID_ARGUMENT, "%s", in_force.error.c_str());
}

}  // namespace uvm

extern "C" {

int uvm_option_count(void) { return static_cast<int>(uvm::kRowCount); }

uvm_status uvm_get_option(int index, uvm_option_info* info) {
  const uvm::Call call = uvm::Call::of("uvm_get_option");
  return uvm::guarded(call, [&] {
    if (info == nullptr) return uvm::fail(call, UVM_ERROR_INVALID_ARGUMENT, "info is NULL");
    if (index < 0 || static_cast<size_t>(index) >= uvm::kRowCount) {
      return uvm::fail(call, UVM_ERROR_INVALID_ARGUMENT, "index %d is not below uvm_option_count() = %zu", index,
                       uvm::kRowCount);
    }
    const uvm::OptionRow& row = uvm::kRows[index].shown;
    const std::string& raw = uvm::options().raw[static_cast<size_t>(index)];
    *info = uvm_option_info{row.name, raw.empty() ? nullptr : raw.c_str(), row.default_value, row.meaning};
    return UVM_OK;
  });
}

uvm_status uvm_check_options(void) {
  const uvm::Call call = uvm::Call::of("uvm_check_options");
  return uvm::guarded(call, [&] { return uvm::check_options(call); });
}

}  // extern "C"
