// The soak on the CUDA test double: many sleep/wake cycles of an RL-shaped workload in one process
// (weights kept in pinned memory, in mmap'ed memory and on disk, a KV cache with no backup, a
// training step claiming the freed memory between pause and resume), every byte checked every
// cycle, and nothing growing: the driver's mapped memory, pinned memory, RSS, open descriptors,
// threads and backup files stay flat after the first cycles. The GPU version with torch:
// bench/soak_bench.py. UVM_SOAK_CYCLES sets the cycles (default 200).
#include <dirent.h>
#include <stdlib.h>

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "../../offload/media/staging.hpp"
#include "fixture.hpp"

namespace {
constexpr size_t kMiB = size_t{1} << 20;

size_t entries_in(const char* dir) {
  size_t count = 0;
  if (DIR* d = opendir(dir)) {
    while (const dirent* entry = readdir(d)) count += entry->d_name[0] != '.';
    closedir(d);
  }
  return count;
}

size_t resident_kib() {
  std::ifstream status("/proc/self/status");
  std::string line;
  while (std::getline(status, line)) {
    if (line.rfind("VmRSS:", 0) == 0) return std::strtoull(line.c_str() + 6, nullptr, 10);
  }
  return 0;
}

// The pinned bytes uvm holds once a resume's asynchronous give-back has run (waited for, not guessed).
size_t settled_pinned_bytes() {
  uvm::staging().wait_for_background_free();
  uvm_staging_info staging{};
  REQUIRE(uvm_get_staging_info(&staging) == UVM_OK);
  return staging.capacity_bytes;
}

struct Sample {
  double mapped, pinned, rss_kib, descriptors, threads, files;
};

// Least-squares slope per cycle, and max - min, of one measure over the samples.
struct Trend {
  double slope, spread;
};
template <class Field>
Trend trend_of(const std::vector<Sample>& samples, Field field) {
  const double n = static_cast<double>(samples.size());
  double sx = 0, sy = 0, sxx = 0, sxy = 0, low = field(samples[0]), high = low;
  for (size_t i = 0; i < samples.size(); ++i) {
    const double x = static_cast<double>(i), y = field(samples[i]);
    sx += x, sy += y, sxx += x * x, sxy += x * y;
    low = std::min(low, y), high = std::max(high, y);
  }
  return Trend{(n * sxy - sx * sy) / (n * sxx - sx * sx), high - low};
}

}  // namespace

TEST_CASE("a soak of sleep/wake cycles keeps every byte and grows nothing", "[soak][cuda13]") {
  const char* text = std::getenv("UVM_SOAK_CYCLES");
  const int cycles = text != nullptr && *text ? std::atoi(text) : 200;
  REQUIRE(cycles >= 40);
  const int warmup = 20;
  const std::string& dir = test_disk_dir();
  FakeMachine machine;
  std::vector<std::unique_ptr<Releasable>> weights;
  for (unsigned i = 0; i < 3; ++i) {
    weights.push_back(releasable_under("weights-pinned", UVM_BACKUP_HOST, 10 + i, 2 * kMiB));
    weights.push_back(releasable_under("weights-mmap", UVM_BACKUP_MMAP, 20 + i, kMiB));
    weights.push_back(releasable_under("weights-disk", UVM_BACKUP_DISK, 30 + i, kMiB));
  }
  auto kv = releasable_under("kv-cache", UVM_BACKUP_NONE, 40, 4 * kMiB);
  Releasable neighbour(kMiB, 0, 50);  // untagged, never paused: its bytes must not move
  std::vector<Sample> samples[2];  // by the cycle's retain setting: a retaining one ends holding its copies
  const char* tags[] = {"weights-pinned", "weights-mmap", "weights-disk", "kv-cache"};
  for (int cycle = 0; cycle < cycles; ++cycle) {
    CAPTURE(cycle);
    // Every other cycle retains the host copies at resume, as memory_saver's retain_cpu_backup.
    REQUIRE(uvm_set_retain_backups(cycle % 2) == UVM_OK);
    for (const char* tag : tags) REQUIRE(uvm_pause(0, tag) == UVM_OK);
    REQUIRE(backup_files(dir).size() == 3);
    // The training step: the freed memory, claimed and let go.
    void* step = uvm_malloc_releasable(16 * kMiB, 0, nullptr);
    REQUIRE(step != nullptr);
    std::memset(step, 0x5a, 16 * kMiB);
    uvm_free(step, 16 * kMiB, 0, nullptr);
    for (const char* tag : tags) REQUIRE(uvm_resume(0, tag) == UVM_OK);
    for (const auto& memory : weights) REQUIRE(memory->intact());
    REQUIRE(neighbour.intact());
    kv->fill();  // its bytes came back undefined: the engine writes the cache again
    REQUIRE(cudaPeekAtLastError() == cudaSuccess);
    fake::reset_ops();  // the test double's log of calls, not uvm's memory
    if (cycle >= warmup) {
      const size_t pinned = settled_pinned_bytes();
      samples[cycle % 2].push_back(Sample{static_cast<double>(fake::mapped_reservations()),
                               static_cast<double>(pinned), static_cast<double>(resident_kib()),
                               static_cast<double>(entries_in("/proc/self/fd")),
                               static_cast<double>(entries_in("/proc/self/task")),
                               static_cast<double>(entries_in(dir.c_str()))});
    }
  }
  REQUIRE(uvm_set_retain_backups(0) == UVM_OK);
  for (const std::vector<Sample>& measured : samples) {
    const double over = static_cast<double>(measured.size());
    const struct {
      const char* name;
      Trend trend;
      double allowed;  // the most it may move over the measured cycles, max - min and slope × cycles
    } measures[] = {
        {"mapped reservations", trend_of(measured, [](const Sample& s) { return s.mapped; }), 0},
        {"pinned bytes", trend_of(measured, [](const Sample& s) { return s.pinned; }), 0},
        {"RSS KiB", trend_of(measured, [](const Sample& s) { return s.rss_kib; }), 16 * 1024},
        {"open descriptors", trend_of(measured, [](const Sample& s) { return s.descriptors; }), 2},
        {"threads", trend_of(measured, [](const Sample& s) { return s.threads; }), 2},
        {"files in the backup directory", trend_of(measured, [](const Sample& s) { return s.files; }), 0},
    };
    for (const auto& measure : measures) {
      CAPTURE(&measured == &samples[1], measure.name, measure.trend.slope, measure.trend.spread);
      CHECK(measure.trend.spread <= measure.allowed);
      CHECK(std::abs(measure.trend.slope) * over <= measure.allowed + 1e-9);
    }
  }
  weights.clear();
  kv.reset();
  CHECK(backup_files(dir).empty());
}
