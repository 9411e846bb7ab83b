// The table of options (alloc/options.hpp): one parser, one policy. [env_malformed] runs in its own
// process with UVM_PINNED=pinned (meson test alloc-env-malformed): the options are read once.
#include "../../alloc/limits.hpp"
#include "../../alloc/options.hpp"
#include "fixture.hpp"

#include <unistd.h>

#include <map>
#include <string>

namespace {
constexpr size_t MiB = size_t{1} << 20;
constexpr size_t GiB = size_t{1} << 30;

uvm::Options parsed(const std::map<std::string, std::string>& env) {
  return uvm::parse_options([&](const char* name) -> const char* {
    const auto found = env.find(name);
    return found == env.end() ? nullptr : found->second.c_str();
  });
}

const char* const kNames[] = {"UVM_LIMIT_BYTES",    "UVM_LIMIT_FRACTION", "UVM_DEFAULT_ADVICE",
                              "UVM_SLABS",          "UVM_PINNED",         "UVM_PIN_NUMA",
                              "UVM_ONLOAD_COPY",    "UVM_ONLOAD_CHUNK_MIB", "UVM_ONLOAD_STREAMS",
                              "UVM_TRACE",          "UVM_DISK_BACKUP_DIR",  "UVM_BACKUP_THREADS",
                              "UVM_SETTLE",         "UVM_SHARE_TIMEOUT_S"};
}  // namespace

TEST_CASE("nothing set, or set empty, gives every default", "[options]") {
  std::map<std::string, std::string> empty;
  for (const char* name : kNames) empty[name] = "";
  for (const auto& options : {parsed({}), parsed(empty)}) {
    CHECK(options.error.empty());
    CHECK(options.limit_bytes == 0);
    CHECK(options.limit_fraction == 0);
    CHECK(options.default_advice == UVM_ADVICE_DEVICE);
    CHECK(options.slabs);
    CHECK(options.pinned == uvm::PinnedKind::registered);
    CHECK(options.onload_copy == uvm::OnloadCopy::automatic);
    CHECK(options.onload_chunk_bytes == 64 * MiB);
    CHECK(options.onload_streams == 4);
    CHECK(options.trace_path.empty());
    CHECK(options.settle);
    CHECK(uvm::default_limit(options, 80 * GiB) == 80 * GiB);
  }
}

TEST_CASE("every option reads the values it documents", "[options]") {
  CHECK(parsed({{"UVM_LIMIT_BYTES", "1048576"}}).limit_bytes == MiB);
  CHECK(parsed({{"UVM_LIMIT_BYTES", "64G"}}).limit_bytes == 64 * GiB);
  CHECK(parsed({{"UVM_LIMIT_BYTES", "512MiB"}}).limit_bytes == 512 * MiB);
  CHECK(parsed({{"UVM_LIMIT_BYTES", "2k"}}).limit_bytes == 2048);
  CHECK(uvm::default_limit(parsed({{"UVM_LIMIT_BYTES", "64G"}}), 80 * GiB) == 64 * GiB);
  CHECK(uvm::default_limit(parsed({{"UVM_LIMIT_FRACTION", "0.25"}}), 80 * GiB) == 20 * GiB);
  CHECK(uvm::default_limit(parsed({{"UVM_LIMIT_FRACTION", "1.5"}}), 80 * GiB) == 120 * GiB);  // oversubscribes
  CHECK(uvm::default_limit(parsed({{"UVM_LIMIT_FRACTION", "1e30"}}), 80 * GiB) == SIZE_MAX);
  CHECK(parsed({{"UVM_DEFAULT_ADVICE", "HOST"}}).default_advice == UVM_ADVICE_HOST);
  CHECK(parsed({{"UVM_DEFAULT_ADVICE", "none"}}).default_advice == UVM_ADVICE_NONE);
  CHECK(parsed({{"UVM_DEFAULT_ADVICE", "Device"}}).default_advice == UVM_ADVICE_DEVICE);
  CHECK_FALSE(parsed({{"UVM_SLABS", "0"}}).slabs);
  CHECK(parsed({{"UVM_SLABS", "1"}}).slabs);
  CHECK_FALSE(parsed({{"UVM_SETTLE", "0"}}).settle);
  CHECK(parsed({}).pin_numa);
  CHECK_FALSE(parsed({{"UVM_PIN_NUMA", "0"}}).pin_numa);
  CHECK_THAT(parsed({{"UVM_PIN_NUMA", "yes"}}).error, Has("UVM_PIN_NUMA='yes' is not understood; expected 1 or 0"));
  CHECK(parsed({{"UVM_SETTLE", "1"}}).settle);
  CHECK_THAT(parsed({{"UVM_SETTLE", "off"}}).error, Has("UVM_SETTLE='off' is not understood; expected 1 or 0"));
  CHECK(parsed({}).share_timeout_s == 120);
  CHECK(parsed({{"UVM_SHARE_TIMEOUT_S", "5"}}).share_timeout_s == 5);
  CHECK_THAT(parsed({{"UVM_SHARE_TIMEOUT_S", "0"}}).error, Has("UVM_SHARE_TIMEOUT_S='0' is not understood; expected 1-86400"));
  CHECK(parsed({{"UVM_PINNED", "hostalloc"}}).pinned == uvm::PinnedKind::host_alloc);
  CHECK(parsed({{"UVM_PINNED", "pageable"}}).pinned == uvm::PinnedKind::pageable);
  CHECK(parsed({{"UVM_PINNED", "register"}}).pinned == uvm::PinnedKind::registered);
  CHECK(parsed({{"UVM_ONLOAD_COPY", "sm"}}).onload_copy == uvm::OnloadCopy::sm);
  CHECK(parsed({{"UVM_ONLOAD_COPY", "engine"}}).onload_copy == uvm::OnloadCopy::engine);
  CHECK(parsed({{"UVM_ONLOAD_COPY", "mixed"}}).onload_copy == uvm::OnloadCopy::mixed);
  CHECK(parsed({{"UVM_ONLOAD_COPY", "auto"}}).onload_copy == uvm::OnloadCopy::automatic);
  CHECK(parsed({{"UVM_ONLOAD_CHUNK_MIB", "1"}}).onload_chunk_bytes == MiB);
  CHECK(parsed({{"UVM_ONLOAD_CHUNK_MIB", "4096"}}).onload_chunk_bytes == 4096 * MiB);
  CHECK(parsed({{"UVM_ONLOAD_STREAMS", "1"}}).onload_streams == 1);
  CHECK(parsed({{"UVM_ONLOAD_STREAMS", "8"}}).onload_streams == uvm::kMaxOnloadStreams);
  const uvm::Options traced = parsed({{"UVM_TRACE", "/tmp/t-%p.json"}});
  CHECK(traced.trace_path == "/tmp/t-" + std::to_string(getpid()) + ".json");
  CHECK(traced.raw[9] == "/tmp/t-%p.json");  // UVM_TRACE, tenth in the table
}

TEST_CASE("a value not understood is refused naming the variable, and keeps the default", "[options]") {
  // The last two byte counts overflow 64 bits only through their suffix; wrapped, they would read
  // 1 GiB and 1 TiB.
  const std::pair<const char*, const char*> refused[] = {
      {"UVM_LIMIT_BYTES", "lots"},    {"UVM_LIMIT_BYTES", "-5"},     {"UVM_LIMIT_BYTES", "0"},
      {"UVM_LIMIT_BYTES", "12X"},     {"UVM_LIMIT_BYTES", "64GB!"},  {"UVM_LIMIT_BYTES", "99999999999999999999999"},
      {"UVM_LIMIT_BYTES", "17179869185G"}, {"UVM_LIMIT_BYTES", "16777217T"},
      {"UVM_LIMIT_FRACTION", "0"},    {"UVM_LIMIT_FRACTION", "-1"},  {"UVM_LIMIT_FRACTION", "half"},
      {"UVM_LIMIT_FRACTION", "nan"},  {"UVM_LIMIT_FRACTION", "inf"}, {"UVM_LIMIT_FRACTION", "0.5x"},
      {"UVM_DEFAULT_ADVICE", "gpu"},  {"UVM_SLABS", "off"},          {"UVM_SLABS", "2"},
      {"UVM_PINNED", "bogus"},        {"UVM_PINNED", "registered"},  {"UVM_ONLOAD_COPY", "kernel"},
      {"UVM_ONLOAD_COPY", "auto "},   {"UVM_ONLOAD_COPY", "automatic"}, {"UVM_ONLOAD_CHUNK_MIB", "0"},
      {"UVM_ONLOAD_CHUNK_MIB", "4097"}, {"UVM_ONLOAD_CHUNK_MIB", "12x"}, {"UVM_ONLOAD_STREAMS", "9"},
      {"UVM_ONLOAD_STREAMS", "0"},    {"UVM_ONLOAD_STREAMS", "four"}};
  const uvm::Options defaults = parsed({});
  for (const auto& [name, value] : refused) {
    CAPTURE(name, value);
    const uvm::Options options = parsed({{name, value}});
    CHECK_THAT(options.error, Has(std::string(name) + "='" + value + "' is not understood; expected "));
    CHECK(options.limit_bytes == defaults.limit_bytes);
    CHECK(options.limit_fraction == defaults.limit_fraction);
    CHECK(options.default_advice == defaults.default_advice);
    CHECK(options.slabs == defaults.slabs);
    CHECK(options.pinned == defaults.pinned);
    CHECK(options.onload_copy == defaults.onload_copy);
    CHECK(options.onload_chunk_bytes == defaults.onload_chunk_bytes);
    CHECK(options.onload_streams == defaults.onload_streams);
  }
}

TEST_CASE("the first refused variable is named; the others are still read", "[options]") {
  const uvm::Options options = parsed({{"UVM_PINNED", "x"}, {"UVM_ONLOAD_STREAMS", "99"}, {"UVM_SLABS", "0"}});
  CHECK_THAT(options.error, Has("UVM_PINNED='x'"));
  CHECK_THAT(options.error, !Has("UVM_ONLOAD_STREAMS"));
  CHECK_FALSE(options.slabs);
}

TEST_CASE("the backup threads are auto or 1-16 and the disk directory is taken as written", "[options]") {
  CHECK(parsed({{"UVM_BACKUP_THREADS", "16"}}).backup_threads == 16);
  CHECK(parsed({}).backup_threads == 0);  // auto
  CHECK(parsed({{"UVM_BACKUP_THREADS", "auto"}}).backup_threads == 0);
  CHECK_THAT(parsed({{"UVM_BACKUP_THREADS", "Auto"}}).error, Has("UVM_BACKUP_THREADS='Auto'"));
  CHECK_THAT(parsed({{"UVM_BACKUP_THREADS", "17"}}).error, Has("UVM_BACKUP_THREADS='17' is not understood; expected auto or 1-16"));
  CHECK_THAT(parsed({{"UVM_BACKUP_THREADS", "0"}}).error, Has("UVM_BACKUP_THREADS='0'"));
  CHECK(parsed({{"UVM_DISK_BACKUP_DIR", "/data/backups"}}).disk_backup_dir == "/data/backups");
}

TEST_CASE("both limit variables set is refused", "[options]") {
  const uvm::Options options = parsed({{"UVM_LIMIT_BYTES", "1G"}, {"UVM_LIMIT_FRACTION", "0.5"}});
  CHECK_THAT(options.error, Has("set only one of UVM_LIMIT_BYTES and UVM_LIMIT_FRACTION"));
  CHECK(uvm::default_limit(options, 80 * GiB) == 80 * GiB);
}

TEST_CASE("uvm_get_option lists the table in uvm.h's order", "[options]") {
  REQUIRE(uvm_option_count() == static_cast<int>(sizeof kNames / sizeof kNames[0]));
  for (int i = 0; i < uvm_option_count(); ++i) {
    uvm_option_info info{};
    REQUIRE(uvm_get_option(i, &info) == UVM_OK);
    CHECK(std::string(info.name) == kNames[i]);
    CHECK(info.default_value != nullptr);
    CHECK(std::string(info.meaning).size() > 10);
  }
  uvm_option_info info{};
  CHECK(uvm_get_option(-1, &info) == UVM_ERROR_INVALID_ARGUMENT);
  CHECK_THAT(last_error(), Has("uvm_get_option(): index -1 is not below uvm_option_count() = 14"));
  CHECK(uvm_get_option(uvm_option_count(), &info) == UVM_ERROR_INVALID_ARGUMENT);
  CHECK(uvm_get_option(0, nullptr) == UVM_ERROR_INVALID_ARGUMENT);
  CHECK_THAT(last_error(), Has("info is NULL"));
}

TEST_CASE("an option not understood fails every call that reads options, naming it; nothing is left behind",
          "[scenario][env_malformed]") {
  FakeMachine machine;
  const std::string named = "UVM_PINNED='pinned' is not understood; expected register, hostalloc or pageable";
  CHECK(uvm_check_options() == UVM_ERROR_INVALID_ARGUMENT);
  CHECK_THAT(last_error(), Has("uvm_check_options(): " + named));
  CHECK(uvm_malloc(4096, 0, nullptr) == nullptr);
  CHECK_THAT(last_error(), Has("uvm_malloc(size=4096, device=0): " + named));
  CHECK(uvm_malloc(2 * MiB, 0, nullptr) == nullptr);  // a slab's size too
  CHECK(uvm_malloc_releasable(2 * MiB, 0, nullptr) == nullptr);
  CHECK_THAT(last_error(), Has(named));
  size_t limit = 0;
  CHECK(uvm_set_limit(0, 64 * MiB) == UVM_OK);  // an explicit limit does not hide the refused option
  CHECK(uvm_malloc(4096, 0, nullptr) == nullptr);
  CHECK(uvm_set_limit(0, 0) == UVM_OK);
  CHECK(uvm_get_limit(0, &limit) == UVM_ERROR_INVALID_ARGUMENT);
  CHECK_THAT(last_error(), Has(named));
  uvm_staging_info info{};
  CHECK(uvm_get_staging_info(&info) == UVM_ERROR_INVALID_ARGUMENT);
  CHECK(uvm_reserve_staging(MiB) == UVM_ERROR_INVALID_ARGUMENT);
  char bytes[64];
  const uvm_range range{bytes, sizeof bytes};
  CHECK(uvm_offload_ranges(&range, 1, UVM_STRATEGY_STAGED, nullptr) == UVM_ERROR_INVALID_ARGUMENT);
  CHECK_THAT(last_error(), Has(named));
  CHECK(uvm_onload_ranges(&range, 1, nullptr) == UVM_ERROR_INVALID_ARGUMENT);
  CHECK_THAT(last_error(), Has(named));
  uvm_option_info option{};
  REQUIRE(uvm_get_option(4, &option) == UVM_OK);
  CHECK(std::string(option.name) == "UVM_PINNED");
  CHECK(std::string(option.value) == "pinned");
  CHECK(FakeMachine::ops_named(fake::OpKind::malloc).empty());
  CHECK(cudaPeekAtLastError() == cudaSuccess);
}
