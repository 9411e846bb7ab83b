// uvm_last_move and UVM_TRACE against the fake runtime, whose timing events read a virtual clock
// on which copies run at 10 GB/s and prefetches at 20 GB/s (fake_cuda.hpp): each move reports the
// phases it ran with their bytes and times, per thread and device, and a failure to time one never
// fails the move.
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <sstream>
#include <string>
#include <thread>

#include "fixture.hpp"

namespace {
constexpr size_t kSize = 16 << 20;

struct Managed {
  explicit Managed(size_t size = kSize, int device = 0) : size(size), device(device) {
    ptr = uvm_malloc(size, device, nullptr);
    REQUIRE(ptr != nullptr);
    std::memset(ptr, 7, size);
  }
  ~Managed() { uvm_free(ptr, size, device, nullptr); }
  uvm_range whole() const { return uvm_range{ptr, size}; }
  void* ptr;
  size_t size;
  int device;
};

uvm_move_report last_move(int device = 0) {
  uvm_move_report report;
  std::memset(&report, 0xFF, sizeof report);  // every field must be written
  REQUIRE(uvm_last_move(device, &report) == UVM_OK);
  return report;
}

// The phase named `name`, or nullptr.
const uvm_move_phase* phase(const uvm_move_report& report, const char* name) {
  for (size_t i = 0; i < report.phase_count; ++i) {
    if (std::strcmp(report.phases[i].name, name) == 0) return &report.phases[i];
  }
  return nullptr;
}

double gbps(const uvm_move_phase& p) { return p.bytes / p.seconds / 1e9; }

// Whether the report lists its phases in order of start, as uvm.h says.
bool in_order_of_start(const uvm_move_report& report) {
  for (size_t i = 1; i < report.phase_count; ++i) {
    if (report.phases[i].start < report.phases[i - 1].start) return false;
  }
  return true;
}

}  // namespace

TEST_CASE("a staged offload reports pinning, copies and the discard, with their bytes and speeds", "[trace][cuda13]") {
  FakeMachine machine;
  REQUIRE(uvm_release_staging() == UVM_OK);  // so that this offload pins
  Managed m;
  const uvm_range whole = m.whole();
  cudaStream_t stream = fake::make_stream();
  REQUIRE(uvm_offload_ranges(&whole, 1, UVM_STRATEGY_STAGED, stream) == UVM_OK);

  const uvm_move_report report = last_move();
  CHECK(std::string(report.call) == "uvm_offload_ranges");
  CHECK(report.device == 0);
  CHECK(report.status == UVM_OK);
  CHECK(report.bytes == kSize);
  REQUIRE(report.phase_count == 3);
  const uvm_move_phase* pin = phase(report, "pin");
  const uvm_move_phase* copy = phase(report, "copy");
  const uvm_move_phase* discard = phase(report, "discard");
  REQUIRE((pin && copy && discard));
  CHECK(pin->bytes >= kSize);
  CHECK(pin->operations == 1);
  CHECK(copy->bytes == kSize);
  CHECK(copy->operations == 1);
  CHECK(gbps(*copy) == Approx(10.0).epsilon(0.01));  // the fake's copy speed, read off its clock
  CHECK(discard->bytes == kSize);
  CHECK(discard->start >= copy->start + copy->seconds - 1e-6);  // issued after the copies, in stream order
  CHECK(report.seconds >= report.host_seconds);
  CHECK(report.seconds >= copy->start + copy->seconds - 1e-6);
  CHECK(cudaPeekAtLastError() == cudaSuccess);

  SECTION("the onload reports page population and copies back") {
    REQUIRE(uvm_onload_ranges(&whole, 1, stream) == UVM_OK);
    const uvm_move_report back = last_move();
    CHECK(std::string(back.call) == "uvm_onload_ranges");
    CHECK(back.bytes == kSize);
    CHECK(phase(back, "pin") == nullptr);  // staging memory is only read
    const uvm_move_phase* populate = phase(back, "populate");
    const uvm_move_phase* copied = phase(back, "copy");
    REQUIRE((populate && copied));
    CHECK(populate->bytes == kSize);
    CHECK(populate->operations == 2);  // before the copy, and after it (undoing the discard)
    CHECK(copied->bytes == kSize);
    CHECK(gbps(*copied) == Approx(10.0).epsilon(0.01));
    CHECK(populate->start <= copied->start);
  }
}

TEST_CASE("a prefetch reports its migration; a discard its discard", "[trace][cuda13]") {
  FakeMachine machine;
  Managed m;
  const uvm_range whole = m.whole();
  cudaStream_t stream = fake::make_stream();
  REQUIRE(uvm_prefetch_ranges(&whole, 1, UVM_LOCATION_CPU, stream) == UVM_OK);
  uvm_move_report report = last_move();
  CHECK(std::string(report.call) == "uvm_prefetch_ranges");
  REQUIRE(report.phase_count == 1);
  CHECK(std::string(report.phases[0].name) == "migrate");
  CHECK(report.phases[0].bytes == kSize);
  CHECK(gbps(report.phases[0]) == Approx(20.0).epsilon(0.01));

  REQUIRE(uvm_discard(m.ptr, kSize / 2, stream) == UVM_OK);
  report = last_move();
  CHECK(std::string(report.call) == "uvm_discard");
  CHECK(report.bytes == kSize / 2);
  REQUIRE(report.phase_count == 1);
  CHECK(std::string(report.phases[0].name) == "discard");
  CHECK(report.phases[0].bytes == kSize / 2);
}

TEST_CASE("releasable memory reports the wait for its copies, its release, and its mapping back", "[trace]") {
  FakeMachine machine;
  void* ptr = uvm_malloc_releasable(kSize, 0, nullptr);
  REQUIRE(ptr != nullptr);
  const uvm_range whole{ptr, kSize};
  cudaStream_t stream = fake::make_stream();
  REQUIRE(uvm_offload_ranges(&whole, 1, UVM_STRATEGY_AUTO, stream) == UVM_OK);
  uvm_move_report report = last_move();
  REQUIRE(phase(report, "copy") != nullptr);
  REQUIRE(phase(report, "wait") != nullptr);
  REQUIRE(phase(report, "release") != nullptr);
  CHECK(phase(report, "release")->bytes == kSize);
  CHECK(phase(report, "discard") == nullptr);  // the memory is released, not discarded
  CHECK(in_order_of_start(report));  // the copies, then the wait for them, then the release

  REQUIRE(uvm_onload_ranges(&whole, 1, stream) == UVM_OK);
  report = last_move();
  REQUIRE(phase(report, "map") != nullptr);
  CHECK(phase(report, "map")->bytes == kSize);
  REQUIRE(phase(report, "copy") != nullptr);
  CHECK(phase(report, "copy")->bytes == kSize);
  CHECK(phase(report, "populate") == nullptr);  // device memory needs no population
  CHECK(in_order_of_start(report));
  uvm_free(ptr, kSize, 0, nullptr);
}

TEST_CASE("the last move is kept per thread and device", "[trace][cuda13]") {
  FakeMachine machine;
  Managed on0(kSize, 0), on1(kSize / 4, 1);
  const uvm_range r0 = on0.whole(), r1 = on1.whole();
  REQUIRE(uvm_prefetch_ranges(&r0, 1, UVM_LOCATION_CPU, nullptr) == UVM_OK);
  REQUIRE(uvm_prefetch_ranges(&r1, 1, UVM_LOCATION_CPU, nullptr) == UVM_OK);
  CHECK(last_move(0).bytes == kSize);
  CHECK(last_move(1).bytes == kSize / 4);
  CHECK(last_move(1).device == 1);
  CHECK(last_move(UVM_ANY_DEVICE).device == 1);  // the latest, wherever it ran

  uvm_status other_status = UVM_ERROR_INTERNAL;
  uvm_move_report other_report{};
  std::thread other([&] {  // Catch2 assertions are not thread-safe: checked after the join
    fake::set_thread_context(0);
    other_status = uvm_last_move(UVM_ANY_DEVICE, &other_report);
  });
  other.join();
  CHECK(other_status == UVM_OK);
  CHECK(other_report.call == nullptr);  // that thread has moved nothing
  CHECK(other_report.phase_count == 0);
  CHECK(last_move(2).call == nullptr);  // nothing moved there

  SECTION("a move that fails before reaching a device leaves the last one in place") {
    int not_uvm = 0;
    const uvm_range bad{&not_uvm, sizeof not_uvm};
    CHECK(uvm_prefetch_ranges(&bad, 1, UVM_LOCATION_CPU, nullptr) != UVM_OK);
    CHECK(last_move(0).bytes == kSize);
    uvm_clear_last_error();
  }
  SECTION("a move that fails on the device is reported with its status") {
    fake::fail_next("cudaMemPrefetchAsync", cudaErrorLaunchFailure);
    CHECK(uvm_prefetch_ranges(&r0, 1, 0, nullptr) == UVM_ERROR_CUDA);
    const uvm_move_report report = last_move(0);
    CHECK(std::string(report.call) == "uvm_prefetch_ranges");
    CHECK(report.status == UVM_ERROR_CUDA);
    CHECK(phase(report, "migrate") == nullptr);  // it ended before its end was marked
    uvm_clear_last_error();
  }
}

TEST_CASE("a timing mark or reading that fails drops its phase, never the move", "[trace][cuda13]") {
  FakeMachine machine;
  Managed m;
  const uvm_range whole = m.whole();
  cudaStream_t stream = fake::make_stream();
  REQUIRE(uvm_onload_ranges(&whole, 1, stream) == UVM_OK);  // nothing offloaded: nothing to report

  SECTION("reading the time") {
    fake::fail_next("cudaEventElapsedTime", cudaErrorInvalidResourceHandle);  // the copies' reading
    REQUIRE(uvm_offload_ranges(&whole, 1, UVM_STRATEGY_STAGED, stream) == UVM_OK);
  }
  SECTION("recording a mark") {
    fake::fail_next("cudaEventRecord(timing)", cudaErrorLaunchFailure);  // the epoch's or the copies' start
    REQUIRE(uvm_offload_ranges(&whole, 1, UVM_STRATEGY_STAGED, stream) == UVM_OK);
  }
  SECTION("creating a mark") {
    fake::fail_next("cudaEventCreate", cudaErrorMemoryAllocation);
    REQUIRE(uvm_offload_ranges(&whole, 1, UVM_STRATEGY_STAGED, stream) == UVM_OK);
  }
  CHECK(cudaPeekAtLastError() == cudaSuccess);
  CHECK(std::string(uvm_last_error()).empty());
  const uvm_move_report report = last_move();
  CHECK(report.status == UVM_OK);
  CHECK(phase(report, "copy") == nullptr);
  REQUIRE(uvm_onload_ranges(&whole, 1, stream) == UVM_OK);  // the data is all there
  CHECK(static_cast<unsigned char*>(m.ptr)[kSize - 1] == 7);
}

TEST_CASE("uvm_last_move refuses a null report and a device that is no selection", "[trace][errors]") {
  FakeMachine machine;
  CHECK(uvm_last_move(0, nullptr) == UVM_ERROR_INVALID_ARGUMENT);
  CHECK(std::string(uvm_last_error()).find("uvm_last_move(device=0)") != std::string::npos);
  CHECK(std::string(uvm_last_error()).find("report is NULL") != std::string::npos);
  uvm_move_report report;
  CHECK(uvm_last_move(-3, &report) == UVM_ERROR_INVALID_ARGUMENT);
  CHECK(std::string(uvm_last_error()).find("-3") != std::string::npos);
}

TEST_CASE("threads moving at once each see their own last move", "[trace][threads][cuda13]") {
  FakeMachine machine;
  auto mover = [](int device, size_t size, bool* ok) {
    fake::set_thread_context(device);
    Managed m(size, device);
    const uvm_range whole = m.whole();
    for (int round = 0; round < 50; ++round) {
      if (uvm_prefetch_ranges(&whole, 1, round % 2 ? device : UVM_LOCATION_CPU, nullptr) != UVM_OK) return;
      uvm_move_report report;
      if (uvm_last_move(UVM_ANY_DEVICE, &report) != UVM_OK || report.bytes != size || report.device != device) return;
    }
    *ok = true;
  };
  bool first = false, second = false;
  std::thread a(mover, 0, size_t{1} << 20, &first), b(mover, 1, size_t{3} << 20, &second);
  a.join();
  b.join();
  CHECK(first);
  CHECK(second);
}

// Run with UVM_TRACE set (tests/meson.build: hints-trace-file).
TEST_CASE("UVM_TRACE holds every move as a Chrome trace, valid JSON after each write", "[scenario][trace_file][cuda13]") {
  const char* configured = std::getenv("UVM_TRACE");
  REQUIRE(configured != nullptr);
  std::string path = configured;
  path.replace(path.find("%p"), 2, std::to_string(getpid()));
  FakeMachine machine;
  Managed m;
  const uvm_range whole = m.whole();
  cudaStream_t stream = fake::make_stream();
  auto read_trace = [&] {
    REQUIRE(uvm_trace_flush() == UVM_OK);
    std::ifstream in(path);
    REQUIRE(in.good());
    std::stringstream text;
    text << in.rdbuf();
    return text.str();
  };
  auto count = [](const std::string& text, const std::string& what) {
    size_t n = 0;
    for (size_t at = text.find(what); at != std::string::npos; at = text.find(what, at + 1)) ++n;
    return n;
  };
  REQUIRE(uvm_offload_ranges(&whole, 1, UVM_STRATEGY_STAGED, stream) == UVM_OK);
  const std::string first = read_trace();
  CHECK(first.rfind("[{", 0) == 0);
  CHECK(first.size() >= 3);
  CHECK(first.substr(first.size() - 3) == "\n]\n");
  CHECK(count(first, "\"name\":\"uvm_offload_ranges\"") == 1);
  CHECK(count(first, "\"name\":\"copy\"") == 1);
  CHECK(count(first, "\"name\":\"discard\"") == 1);
  CHECK(count(first, "\"bytes\":" + std::to_string(kSize)) >= 3);  // the call, its copy and its discard
  CHECK(count(first, "\"name\":\"thread_name\"") == 2);  // the host thread and the caller's stream

  REQUIRE(uvm_onload_ranges(&whole, 1, stream) == UVM_OK);
  const std::string second = read_trace();
  CHECK(count(second, "[") == 1);  // still one array: the new events went in before its end
  CHECK(count(second, "]") == 1);
  CHECK(second.substr(second.size() - 3) == "\n]\n");
  CHECK(count(second, "\"name\":\"uvm_onload_ranges\"") == 1);
  CHECK(count(second, "\"name\":\"populate\"") == 2);
  CHECK(count(second, "uvm worker stream 1") == 1);  // the onload's worker has its own lane
  char address[64];
  std::snprintf(address, sizeof address, "\"address\":\"0x%llx\"",
                static_cast<unsigned long long>(reinterpret_cast<uintptr_t>(m.ptr)));
  CHECK(count(second, address) == 4);  // the copy out, and the chunk's populate, copy and populate
  CHECK(count(second, "},\n{") + 1 == count(second, "\"ph\":"));  // one event a line, comma-separated
  std::remove(path.c_str());
}

TEST_CASE("timing a move never invalidates a capture running on another stream", "[trace][capture][trace_capture]") {
  // On the driver, an event query while any stream captures in the global mode invalidates that
  // capture, unless the querying thread's mode is relaxed; a prefetch on the legacy stream beside
  // a non-blocking stream's capture is legal, and its timing must not break the capture.
  FakeMachine machine;
  Managed m;
  const uvm_range whole = m.whole();
  cudaStream_t captured = fake::make_stream();
  fake::set_capturing(captured, true);
  REQUIRE(uvm_prefetch_ranges(&whole, 1, UVM_LOCATION_CPU, nullptr) == UVM_OK);
  CHECK_FALSE(fake::capture_invalidated());
  uvm_move_report report;
  REQUIRE(uvm_last_move(0, &report) == UVM_OK);
  CHECK_FALSE(fake::capture_invalidated());
  CHECK(std::string(report.call) == "uvm_prefetch_ranges");
  fake::set_capturing(captured, false);
}

TEST_CASE("a group of moves is one move per device, published when the group ends", "[trace][group][cuda13]") {
  FakeMachine machine;
  Managed a, b, on1(kSize / 8, 1);
  const uvm_range ra = a.whole(), rb = b.whole(), r1 = on1.whole();
  cudaStream_t stream = fake::make_stream();
  const uvm_range half1{on1.ptr, kSize / 16};
  REQUIRE(uvm_prefetch_ranges(&half1, 1, UVM_LOCATION_CPU, nullptr) == UVM_OK);  // device 1's move before
  REQUIRE(uvm_prefetch_ranges(&rb, 1, UVM_LOCATION_CPU, stream) == UVM_OK);  // the move before the group
  REQUIRE(uvm_onload_ranges(&rb, 1, stream) == UVM_OK);

  REQUIRE(uvm_begin_moves(0) == UVM_OK);
  REQUIRE(uvm_offload_ranges(&ra, 1, UVM_STRATEGY_STAGED, stream) == UVM_OK);
  CHECK(last_move(0).bytes == kSize);  // the group is not published yet: the last move is the one before
  CHECK(std::string(last_move(0).call) == "uvm_onload_ranges");
  REQUIRE(uvm_begin_moves(0) == UVM_OK);  // nested: only the outermost end publishes
  REQUIRE(uvm_prefetch_ranges(&r1, 1, UVM_LOCATION_CPU, nullptr) == UVM_OK);
  REQUIRE(uvm_end_moves() == UVM_OK);
  REQUIRE(uvm_offload_ranges(&rb, 1, UVM_STRATEGY_STAGED, stream) == UVM_OK);
  CHECK(last_move(1).bytes == kSize / 16);  // nor on device 1
  REQUIRE(uvm_end_moves() == UVM_OK);

  const uvm_move_report report = last_move(0);
  CHECK(std::string(report.call) == "uvm_offload_ranges");
  CHECK(report.status == UVM_OK);
  CHECK(report.bytes == 2 * kSize);  // both offloads
  const uvm_move_phase* copy = phase(report, "copy");
  REQUIRE(copy != nullptr);
  CHECK(copy->bytes == 2 * kSize);
  CHECK(copy->operations == 2);
  CHECK(copy->seconds >= 2 * kSize / 10e9 - 1e-6);  // timed on one clock: both copies at the fake's 10 GB/s
  CHECK(copy->seconds < 3 * kSize / 10e9);
  REQUIRE(phase(report, "discard") != nullptr);
  CHECK(phase(report, "discard")->bytes == 2 * kSize);
  CHECK(report.seconds >= copy->start + copy->seconds - 1e-6);
  const uvm_move_report other = last_move(1);
  CHECK(std::string(other.call) == "uvm_prefetch_ranges");  // its own device, its own move
  CHECK(other.bytes == kSize / 8);

  SECTION("a call of the group that fails gives the group its status; the calls after it still move") {
    REQUIRE(uvm_onload_ranges(&ra, 1, stream) == UVM_OK);
    REQUIRE(uvm_onload_ranges(&rb, 1, stream) == UVM_OK);
    REQUIRE(uvm_begin_moves(0) == UVM_OK);
    REQUIRE(uvm_offload_ranges(&ra, 1, UVM_STRATEGY_STAGED, stream) == UVM_OK);
    fake::fail_next("cudaMemcpyAsync", cudaErrorLaunchFailure);
    CHECK(uvm_offload_ranges(&rb, 1, UVM_STRATEGY_STAGED, stream) == UVM_ERROR_CUDA);
    uvm_clear_last_error();
    REQUIRE(uvm_prefetch_ranges(&rb, 1, UVM_LOCATION_CPU, stream) == UVM_OK);
    REQUIRE(uvm_end_moves() == UVM_OK);
    const uvm_move_report failed = last_move(0);
    CHECK(std::string(failed.call) == "uvm_offload_ranges");
    CHECK(failed.status == UVM_ERROR_CUDA);  // the first failure
    CHECK(failed.bytes == 3 * kSize);  // b's failed offload counts what it set out to move, as alone
    REQUIRE(phase(failed, "migrate") != nullptr);
    CHECK(phase(failed, "migrate")->bytes == kSize);
    REQUIRE(uvm_onload_ranges(&ra, 1, stream) == UVM_OK);
    REQUIRE(uvm_onload_ranges(&rb, 1, stream) == UVM_OK);
    CHECK(static_cast<unsigned char*>(a.ptr)[kSize - 1] == 7);
    CHECK(static_cast<unsigned char*>(b.ptr)[0] == 7);
  }
  SECTION("ending a group that is not open is an error that names the call") {
    CHECK(uvm_end_moves() == UVM_ERROR_INVALID_ARGUMENT);
    CHECK(std::string(uvm_last_error()).find("uvm_end_moves") != std::string::npos);
    CHECK(std::string(uvm_last_error()).find("no uvm_begin_moves is open on this thread") != std::string::npos);
    uvm_clear_last_error();
    uvm_status begun = UVM_ERROR_INTERNAL, ended = UVM_ERROR_INTERNAL, ended_again = UVM_OK;
    std::thread other_thread([&] {  // a group is the calling thread's: another thread's end finds none
      begun = uvm_begin_moves(0);
      ended = uvm_end_moves();
      ended_again = uvm_end_moves();
      uvm_clear_last_error();
    });
    other_thread.join();
    CHECK(begun == UVM_OK);
    CHECK(ended == UVM_OK);
    CHECK(ended_again == UVM_ERROR_INVALID_ARGUMENT);
  }
  CHECK(cudaPeekAtLastError() == cudaSuccess);
}
