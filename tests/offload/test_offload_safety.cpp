// Nothing is lost: offload, onload and discard change no byte they were not asked to move, whatever
// the layout (tensors of 1 B to 3 MiB, exactly 512 B and multiples, views at odd offsets), whatever
// runs beside them on other threads (the same ranges, frees, release_staging), and whichever CUDA
// call fails half-way. The fake runtime really copies bytes and scribbles 0xDD over discarded ones.
#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstring>
#include <random>
#include <functional>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include "../../offload/media/pinned.hpp"
#include "fixture.hpp"

namespace {

constexpr uvm_strategy kStrategies[] = {UVM_STRATEGY_AUTO, UVM_STRATEGY_MIGRATE, UVM_STRATEGY_STAGED,
                                        UVM_STRATEGY_MMAP, UVM_STRATEGY_DISK};

unsigned char pattern(size_t i, unsigned seed) { return static_cast<unsigned char>(i * 131 + seed * 17 + 1); }

// One uvm allocation cut into pieces; every other piece is "moved", the rest are "kept".
struct Layout {
  unsigned char* base = nullptr;
  size_t size = 0;
  std::vector<uvm_range> moved, kept;

  Layout(const std::vector<size_t>& piece_sizes, size_t alignment) {
    for (size_t piece : piece_sizes) size += (piece + alignment - 1) / alignment * alignment;
    base = static_cast<unsigned char*>(uvm_malloc(size, 0, nullptr));
    REQUIRE(base != nullptr);
    size_t at = 0;
    for (size_t i = 0; i < piece_sizes.size(); ++i) {
      (i % 2 == 0 ? moved : kept).push_back(uvm_range{base + at, piece_sizes[i]});
      at += (piece_sizes[i] + alignment - 1) / alignment * alignment;
    }
    fill(0);
  }
  ~Layout() { uvm_free(base, size, 0, nullptr); }
  void fill(unsigned seed) {
    for (size_t i = 0; i < size; ++i) base[i] = pattern(i, seed);
  }
  void write(const std::vector<uvm_range>& ranges, unsigned seed) {
    for (const uvm_range& r : ranges) {
      auto* p = static_cast<unsigned char*>(const_cast<void*>(r.ptr));
      for (size_t i = 0; i < r.size; ++i) p[i] = pattern(static_cast<size_t>(p - base) + i, seed);
    }
  }
  // The first range whose bytes do not hold `seed`'s pattern, or -1.
  long first_wrong(const std::vector<uvm_range>& ranges, unsigned seed) const {
    for (size_t k = 0; k < ranges.size(); ++k) {
      auto* p = static_cast<const unsigned char*>(ranges[k].ptr);
      for (size_t i = 0; i < ranges[k].size; ++i) {
        if (p[i] != pattern(static_cast<size_t>(p - base) + i, seed)) return static_cast<long>(k);
      }
    }
    return -1;
  }
};

size_t staged_bytes() {
  size_t staged = 0;
  REQUIRE(uvm_get_staging(nullptr, &staged) == UVM_OK);
  return staged;
}

// After everything was onloaded, discarded or freed, no pinned block may stay held.
void check_no_staging_left() {
  CHECK(staged_bytes() == 0);
  REQUIRE(uvm_release_staging() == UVM_OK);
  size_t capacity = 1;
  REQUIRE(uvm_get_staging(&capacity, nullptr) == UVM_OK);
  CHECK(capacity == 0);
  CHECK(fake::pinned_blocks() == 0);
}

}  // namespace

TEST_CASE("kept tensors next to offloaded ones keep the values written meanwhile", "[offload][safety][cuda13]") {
  // 512 B is the case a real GPU run lost: a 512-byte gap holds a whole PyTorch block.
  const std::vector<std::pair<const char*, std::vector<size_t>>> layouts = {
      {"64 x 512 B", std::vector<size_t>(64, 512)},
      {"32 x 1024 B", std::vector<size_t>(32, 1024)},
      {"1 B .. 3 MiB", {1, 7, 100, 511, 512, 513, 1000, 1024, 4096, 100000, 3 << 20, 3, 512, 2048}},
      {"odd sizes", {3, 5, 9, 17, 33, 65, 129, 257, 511, 513, 1023, 1025}},
  };
  test_disk_dir();
  for (const auto& [name, sizes] : layouts) {
    for (const size_t alignment : {size_t{512}, size_t{1}}) {  // PyTorch blocks; views packed end to end
      for (const uvm_strategy strategy : kStrategies) {
        CAPTURE(name, alignment, static_cast<int>(strategy));
        FakeMachine machine;
        Layout layout(sizes, alignment);
        cudaStream_t stream = fake::make_stream();
        REQUIRE(uvm_offload_ranges(layout.moved.data(), layout.moved.size(), strategy, stream) == UVM_OK);
        layout.write(layout.kept, 1);  // the program goes on using the tensors that stayed
        REQUIRE(uvm_onload_ranges(layout.moved.data(), layout.moved.size(), stream) == UVM_OK);
        CHECK(layout.first_wrong(layout.kept, 1) == -1);
        CHECK(layout.first_wrong(layout.moved, 0) == -1);
        uvm_residency r{};
        REQUIRE(uvm_get_residency(0, nullptr, &r) == UVM_OK);
        CHECK(r.device_bytes == r.live_bytes);
      }
    }
  }
  check_no_staging_left();
}

TEST_CASE("onload populates no byte that another offload moved off the device", "[offload][safety][cuda13]") {
  // Only the copied bytes are prefetched: a neighbour staged by another call, or a kept one, sits
  // between the pieces and is never populated with them (on an H200 that once lost data).
  FakeMachine machine;
  Layout layout({512, 512, 512, 512, 512}, 512);  // moved: pieces 0, 2, 4; kept: 1, 3
  const uvm_range neighbour = layout.kept[0];
  REQUIRE(uvm_offload_ranges(&neighbour, 1, UVM_STRATEGY_STAGED, nullptr) == UVM_OK);
  REQUIRE(uvm_offload_ranges(layout.moved.data(), layout.moved.size(), UVM_STRATEGY_STAGED, nullptr) == UVM_OK);
  fake::reset_ops();
  REQUIRE(uvm_onload_ranges(layout.moved.data(), layout.moved.size(), nullptr) == UVM_OK);
  const auto begin = reinterpret_cast<uintptr_t>(neighbour.ptr);
  for (const fake::Op& op : FakeMachine::ops_named(fake::OpKind::prefetch)) {
    const auto at = reinterpret_cast<uintptr_t>(op.ptr);
    CHECK((at + op.size <= begin || at >= begin + neighbour.size));
  }
  CHECK(FakeMachine::ops_named(fake::OpKind::prefetch).size() == 6);  // each of the 3 pieces: before and after
  REQUIRE(uvm_onload_ranges(&neighbour, 1, nullptr) == UVM_OK);
  CHECK(layout.first_wrong(layout.moved, 0) == -1);
  CHECK(layout.first_wrong(layout.kept, 0) == -1);
}

TEST_CASE("discard drops exactly the ranges named", "[discard][safety][cuda13]") {
  FakeMachine machine;
  Layout layout(std::vector<size_t>(64, 512), 512);
  REQUIRE(uvm_discard_ranges(layout.moved.data(), layout.moved.size(), fake::make_stream()) == UVM_OK);
  CHECK(layout.first_wrong(layout.kept, 0) == -1);
  uvm_residency r{};
  REQUIRE(uvm_get_residency(0, nullptr, &r) == UVM_OK);
  CHECK(r.discarded_bytes == 32 * 512);
}

TEST_CASE("ranges merge only when they overlap or touch", "[ranges][safety]") {
  // Driver calls are what the merge rule decides; a gap of any size keeps two calls.
  FakeMachine machine;
  char* base = static_cast<char*>(uvm_malloc(1 << 16, 0, nullptr));
  REQUIRE(base != nullptr);
  for (const size_t gap : {size_t{0}, size_t{1}, size_t{511}, size_t{512}, size_t{513}}) {
    CAPTURE(gap);
    fake::reset_ops();
    const uvm_range ranges[] = {{base, 512}, {base + 512 + gap, 512}, {base + 100, 50}};
    REQUIRE(uvm_prefetch_ranges(ranges, 3, UVM_LOCATION_CPU, nullptr) == UVM_OK);
    CHECK(FakeMachine::ops_named(fake::OpKind::prefetch).size() == (gap == 0 ? 1u : 2u));
  }
  uvm_free(base, 1 << 16, 0, nullptr);
}

TEST_CASE("staged offload keeps host copies only of uvm's own allocations", "[offload][safety][cuda13]") {
  // A host copy must die with the memory it describes; uvm cannot see a cudaFree of memory it did
  // not allocate, so such memory is migrated, never staged.
  FakeMachine machine;
  void* foreign = nullptr;
  REQUIRE(cudaMallocManaged(&foreign, 4096, cudaMemAttachGlobal) == cudaSuccess);
  std::memset(foreign, 0x5A, 4096);
  const uvm_range r{foreign, 4096};
  CHECK(uvm_offload_ranges(&r, 1, UVM_STRATEGY_STAGED, nullptr) == UVM_ERROR_INVALID_ARGUMENT);
  CHECK_THAT(last_error(), Has("not allocated by uvm"));
  CHECK(FakeMachine::ops_named(fake::OpKind::copy_to_host).empty());
  REQUIRE(uvm_offload_ranges(&r, 1, UVM_STRATEGY_AUTO, nullptr) == UVM_OK);
  CHECK(FakeMachine::ops_named(fake::OpKind::discard).empty());
  CHECK(FakeMachine::ops_named(fake::OpKind::prefetch).size() == 1);
  CHECK(staged_bytes() == 0);
  REQUIRE(cudaFree(foreign) == cudaSuccess);
}

TEST_CASE("a new allocation never inherits a staged copy of an old one", "[offload][safety][cuda13]") {
  FakeMachine machine;
  for (int round = 0; round < 20; ++round) {
    auto* a = static_cast<unsigned char*>(uvm_malloc(8192, 0, nullptr));
    REQUIRE(a != nullptr);
    std::memset(a, 1, 8192);
    const uvm_range r{a, 8192};
    REQUIRE(uvm_offload_ranges(&r, 1, UVM_STRATEGY_STAGED, nullptr) == UVM_OK);
    uvm_free(a, 8192, 0, nullptr);  // freed while staged
    auto* b = static_cast<unsigned char*>(uvm_malloc(8192, 0, nullptr));
    REQUIRE(b != nullptr);
    std::memset(b, 2, 8192);
    const uvm_range rb{b, 8192};
    REQUIRE(uvm_offload_ranges(&rb, 1, UVM_STRATEGY_STAGED, nullptr) == UVM_OK);
    REQUIRE(uvm_onload_ranges(&rb, 1, nullptr) == UVM_OK);
    CHECK(b[0] == 2);
    CHECK(b[8191] == 2);
    uvm_free(b, 8192, 0, nullptr);
  }
  check_no_staging_left();
}

TEST_CASE("two threads offloading and onloading the same ranges lose nothing", "[offload][safety][threads][cuda13]") {
  FakeMachine machine;
  Layout layout(std::vector<size_t>(16, 4096), 512);
  std::atomic<int> failures{0};
  auto cycle = [&](uvm_strategy strategy) {
    cudaStream_t stream = fake::make_stream();
    for (int i = 0; i < 200; ++i) {
      if (uvm_offload_ranges(layout.moved.data(), layout.moved.size(), strategy, stream) != UVM_OK) ++failures;
      if (uvm_onload_ranges(layout.moved.data(), layout.moved.size(), stream) != UVM_OK) ++failures;
    }
  };
  std::thread a(cycle, UVM_STRATEGY_STAGED), b(cycle, UVM_STRATEGY_STAGED), c(cycle, UVM_STRATEGY_AUTO),
      d(cycle, UVM_STRATEGY_MIGRATE);
  a.join();
  b.join();
  c.join();
  d.join();
  CHECK(failures == 0);
  REQUIRE(uvm_onload_ranges(layout.moved.data(), layout.moved.size(), nullptr) == UVM_OK);
  CHECK(layout.first_wrong(layout.moved, 0) == -1);
  CHECK(layout.first_wrong(layout.kept, 0) == -1);
  check_no_staging_left();
}

TEST_CASE("overlapping offload, onload and discard on three threads keep the books straight", "[offload][safety][threads][cuda13]") {
  FakeMachine machine;
  Layout layout(std::vector<size_t>(8, 8192), 512);
  const std::vector<uvm_range> all = {uvm_range{layout.base, layout.size}};
  const std::vector<uvm_range> half = {uvm_range{layout.base + 4096, layout.size / 2}};
  std::atomic<bool> stop{false};
  std::atomic<int> failures{0};
  std::thread offloader([&] {
    while (!stop) failures += uvm_offload_ranges(all.data(), 1, UVM_STRATEGY_STAGED, fake::make_stream()) != UVM_OK;
  });
  std::thread onloader([&] {
    while (!stop) failures += uvm_onload_ranges(half.data(), 1, fake::make_stream()) != UVM_OK;
  });
  std::thread discarder([&] {
    for (int i = 0; i < 300; ++i) failures += uvm_discard_ranges(layout.kept.data(), layout.kept.size(), fake::make_stream()) != UVM_OK;
    stop = true;
  });
  offloader.join();
  onloader.join();
  discarder.join();
  CHECK(failures == 0);
  uvm_residency r{};
  REQUIRE(uvm_get_residency(0, nullptr, &r) == UVM_OK);
  CHECK(r.staged_bytes == staged_bytes());  // the registry and the staging store agree
  REQUIRE(uvm_onload_ranges(all.data(), 1, nullptr) == UVM_OK);
  REQUIRE(uvm_discard_ranges(all.data(), 1, fake::make_stream()) == UVM_OK);
  check_no_staging_left();
}

TEST_CASE("free racing an offload of the same allocation leaves nothing staged", "[offload][safety][threads][cuda13]") {
  FakeMachine machine;
  for (int round = 0; round < 300; ++round) {
    constexpr size_t kSize = 64 << 10;
    void* p = uvm_malloc(kSize, 0, nullptr);
    REQUIRE(p != nullptr);
    const uvm_range r{p, kSize};
    std::thread offloader([&] { (void)uvm_offload_ranges(&r, 1, UVM_STRATEGY_STAGED, fake::make_stream()); });
    std::thread freer([&] { uvm_free(p, kSize, 0, nullptr); });
    offloader.join();
    freer.join();
  }
  check_no_staging_left();
}

TEST_CASE("release_staging racing offload and onload loses nothing", "[offload][safety][threads][cuda13]") {
  FakeMachine machine;
  Layout layout(std::vector<size_t>(8, 65536), 512);
  std::atomic<bool> stop{false};
  std::atomic<int> failures{0};
  std::thread releaser([&] {
    while (!stop) failures += uvm_release_staging() != UVM_OK;
  });
  for (int i = 0; i < 200; ++i) {
    REQUIRE(uvm_offload_ranges(layout.moved.data(), layout.moved.size(), UVM_STRATEGY_STAGED, nullptr) == UVM_OK);
    layout.write(layout.kept, static_cast<unsigned>(i));
    REQUIRE(uvm_onload_ranges(layout.moved.data(), layout.moved.size(), nullptr) == UVM_OK);
    REQUIRE(layout.first_wrong(layout.moved, 0) == -1);
    REQUIRE(layout.first_wrong(layout.kept, static_cast<unsigned>(i)) == -1);
  }
  stop = true;
  releaser.join();
  CHECK(failures == 0);
  check_no_staging_left();
}

TEST_CASE("a thread's tag changes while another offloads by tag", "[offload][safety][threads][tags][cuda13]") {
  FakeMachine machine;
  std::atomic<bool> stop{false};
  std::atomic<int> failures{0};
  std::thread tagger([&] {  // Catch2 assertions are not thread-safe: count, check after the join
    for (int i = 0; !stop; ++i) {
      failures += uvm_set_thread_tag(i % 2 ? "race-a" : "race-b") != UVM_OK;
      void* p = uvm_malloc(4096, 0, nullptr);
      failures += p == nullptr;
      uvm_free(p, 4096, 0, nullptr);
    }
    uvm_set_thread_tag(nullptr);
  });
  REQUIRE(uvm_set_thread_tag("race-a") == UVM_OK);
  auto* mine = static_cast<unsigned char*>(uvm_malloc(4096, 0, nullptr));
  REQUIRE(uvm_set_thread_tag(nullptr) == UVM_OK);
  std::memset(mine, 9, 4096);
  for (int i = 0; i < 200; ++i) {
    std::vector<uvm_range> ranges(8);
    size_t count = 0;
    REQUIRE(uvm_allocation_ranges(0, "race-a", ranges.data(), ranges.size(), &count) == UVM_OK);
    ranges.resize(std::min(count, ranges.size()));
    // A listed allocation may be freed (or its address reused) before the offload: an error that
    // names the offload, never a corruption of the allocation that stayed.
    if (uvm_offload_ranges(ranges.data(), ranges.size(), UVM_STRATEGY_STAGED, nullptr) != UVM_OK) {
      CHECK_THAT(last_error(), Has("uvm_offload_ranges(count="));
    }
    const uvm_range r{mine, 4096};
    REQUIRE(uvm_onload_ranges(&r, 1, nullptr) == UVM_OK);
    REQUIRE(mine[0] == 9);
    REQUIRE(mine[4095] == 9);
  }
  stop = true;
  tagger.join();
  CHECK(failures == 0);
  uvm_free(mine, 4096, 0, nullptr);
  check_no_staging_left();
}

TEST_CASE("set_limit while other threads allocate keeps the books exact", "[limits][safety][threads]") {
  FakeMachine machine;
  std::atomic<bool> stop{false};
  std::thread limiter([&] {
    for (int i = 0; !stop; ++i) uvm_set_limit(0, i % 2 ? (size_t{1} << 20) : 0);
  });
  std::vector<std::thread> workers;
  std::atomic<int> allocated{0}, wrong_errors{0};
  for (int t = 0; t < 3; ++t) {
    workers.emplace_back([&] {
      for (int i = 0; i < 2000; ++i) {
        void* p = uvm_malloc(4096, 0, nullptr);
        if (p == nullptr) {
          wrong_errors += uvm_last_status() != UVM_ERROR_LIMIT_EXCEEDED;
          continue;
        }
        ++allocated;
        uvm_free(p, 4096, 0, nullptr);
      }
    });
  }
  for (auto& w : workers) w.join();
  stop = true;
  limiter.join();
  uvm_set_limit(0, 0);
  uvm_stats stats{};
  REQUIRE(uvm_get_stats(0, &stats) == UVM_OK);
  CHECK(stats.live_bytes == 0);
  CHECK(allocated > 0);
  CHECK(wrong_errors == 0);
}

namespace {
// The body of the rollback test; its layout is freed before the test counts the events left.
void check_rollbacks() {
  Layout layout(std::vector<size_t>(8, 65536), 512);
  cudaStream_t stream = fake::make_stream();
  const auto offload = [&] {
    return uvm_offload_ranges(layout.moved.data(), layout.moved.size(), UVM_STRATEGY_STAGED, stream);
  };
  const auto onload = [&] { return uvm_onload_ranges(layout.moved.data(), layout.moved.size(), stream); };

  SECTION("offload: the copy out, the discard, the host allocation") {
    // Pinning fails only when registering and then cudaHostAlloc both fail.
    const std::vector<std::vector<const char*>> failing = {
        {"cudaMemcpyAsync"}, {"cudaMemDiscardBatchAsync"}, {"cudaHostRegister", "cudaHostAlloc"}};
    for (const auto& calls : failing) {
      CAPTURE(calls.back());
      REQUIRE(uvm_release_staging() == UVM_OK);
      for (const char* call : calls) fake::fail_next(call, cudaErrorLaunchFailure);
      CHECK(offload() != UVM_OK);
      CHECK_THAT(last_error(), Has(calls.back()));
      CHECK(cudaPeekAtLastError() == cudaSuccess);
      CHECK(staged_bytes() == 0);
      CHECK(layout.first_wrong(layout.moved, 0) == -1);  // still on the device, untouched
      check_no_staging_left();  // nothing reserved is left behind
    }
  }
  SECTION("offload: no event can be made, so it waits for the stream instead") {
    fake::fail_next("cudaEventCreateWithFlags", cudaErrorMemoryAllocation);
    REQUIRE(offload() == UVM_OK);
    CHECK(cudaPeekAtLastError() == cudaSuccess);
    CHECK(FakeMachine::ops_named(fake::OpKind::stream_sync).size() == 1);
    REQUIRE(onload() == UVM_OK);
    CHECK(layout.first_wrong(layout.moved, 0) == -1);
    check_no_staging_left();
  }
  SECTION("offload: the event record fails, then so does the synchronize that replaces it") {
    fake::fail_next("cudaEventRecord", cudaErrorLaunchFailure);
    fake::fail_next("cudaStreamSynchronize", cudaErrorLaunchFailure);
    CHECK(offload() == UVM_ERROR_CUDA);
    CHECK_THAT(last_error(), Has("cudaStreamSynchronize"));
    // The copies and the discard were issued in stream order: the host copy is the data, so it is
    // kept as staged, and onload brings it back.
    REQUIRE(onload() == UVM_OK);
    CHECK(layout.first_wrong(layout.moved, 0) == -1);
    check_no_staging_left();
  }
  SECTION("onload: a copy back, a populate, the join") {
    for (const char* call : {"cudaMemcpyAsync", "cudaMemPrefetchAsync", "cudaStreamWaitEvent", "cudaEventRecord"}) {
      CAPTURE(call);
      REQUIRE(offload() == UVM_OK);
      layout.write(layout.kept, 3);
      fake::fail_next(call, cudaErrorLaunchFailure);
      CHECK(onload() != UVM_OK);
      CHECK(cudaPeekAtLastError() == cudaSuccess);
      REQUIRE(onload() == UVM_OK);  // what is still staged comes back on the next try
      CHECK(layout.first_wrong(layout.moved, 0) == -1);
      CHECK(layout.first_wrong(layout.kept, 3) == -1);
      layout.write(layout.kept, 0);
    }
    check_no_staging_left();
  }
  SECTION("release_staging: waiting for a copy still reading a block fails") {
    REQUIRE(offload() == UVM_OK);
    REQUIRE(onload() == UVM_OK);
    fake::fail_next("cudaEventSynchronize", cudaErrorLaunchFailure);
    CHECK(uvm_release_staging() == UVM_ERROR_CUDA);
    CHECK(cudaPeekAtLastError() == cudaSuccess);
    check_no_staging_left();  // the next release frees it
  }
}
}  // namespace

TEST_CASE("every failed CUDA call in an offload or onload rolls back cleanly", "[offload][safety][rollback][cuda13]") {
  FakeMachine machine;
  // Counted so that it does not depend on what earlier tests left: a move first (the device's clock
  // epoch, an event kept for the process's life, is made at the first move: run alone, the test
  // found one more event at its end than at its start), and no staging block held before or after
  // (blocks keep the events of the copies that used them until they are freed).
  {
    Layout warm(std::vector<size_t>(2, 65536), 512);
    cudaStream_t stream = fake::make_stream();
    REQUIRE(uvm_offload_ranges(warm.moved.data(), warm.moved.size(), UVM_STRATEGY_STAGED, stream) == UVM_OK);
    REQUIRE(uvm_onload_ranges(warm.moved.data(), warm.moved.size(), stream) == UVM_OK);
  }
  REQUIRE(uvm_release_staging() == UVM_OK);
  const size_t events_before = fake::live_events();
  check_rollbacks();
  REQUIRE(uvm_release_staging() == UVM_OK);
  CHECK(fake::live_events() == events_before);  // no event outlives the memory it ordered
}

// Run with UVM_PINNED unset (tests/meson.build: offload-pinned-in-steps): the staging block is
// pinned in 256 MiB steps, and the offload copies into each step as it is done, in rounds that let
// go of the moves lock between them.
TEST_CASE("an offload in rounds, cut at pinning steps, keeps kept neighbours and survives an onload between rounds",
          "[scenario][steps][steps_race][safety][cuda13]") {
  FakeMachine machine;
  REQUIRE(uvm_release_staging() == UVM_OK);  // nothing pinned: the offload pins in steps
  const size_t mib = size_t{1} << 20;
  // Moved pieces of 200, 200 and 150 MiB around kept ones of 1 MiB and 512 B: the staged bytes
  // span three steps, cut inside the first two pieces.
  Layout layout({200 * mib, mib, 200 * mib, 512, 150 * mib}, 512);
  cudaStream_t stream = fake::make_stream();
  auto copied_out = [] { return FakeMachine::bytes_of(fake::OpKind::copy_to_host); };
  fake::hold_next("cudaHostRegister", 1);  // the second step waits
  uvm_status offloaded = UVM_ERROR_INTERNAL;
  TestThread offload([&] {
    fake::set_thread_context(0);
    offloaded = uvm_offload_ranges(layout.moved.data(), layout.moved.size(), UVM_STRATEGY_STAGED, stream);
  });
  REQUIRE(fake::wait_until_held());
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(10);
  while (copied_out() < 256 * mib && std::chrono::steady_clock::now() < deadline) {
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
  CHECK(copied_out() == 256 * mib);  // the first step's round is done; the offload waits, holding no lock
  // An onload of the same ranges on this thread runs between the rounds (the offload may stage
  // what it brought back once more: the offload was asked for all of it); meanwhile the program
  // writes the kept neighbours.
  REQUIRE(uvm_onload_ranges(layout.moved.data(), layout.moved.size(), stream) == UVM_OK);
  layout.write(layout.kept, 1);
  fake::release_held();
  offload.join();
  REQUIRE(offloaded == UVM_OK);
  CHECK(staged_bytes() == 550 * mib);  // in the end all of it, whatever the onload took back between
  REQUIRE(uvm_onload_ranges(layout.moved.data(), layout.moved.size(), stream) == UVM_OK);
  CHECK(layout.first_wrong(layout.kept, 1) == -1);
  CHECK(layout.first_wrong(layout.moved, 0) == -1);
  check_no_staging_left();
}

namespace {
constexpr size_t kMiB = size_t{1} << 20;

// `count` releasable allocations of `size` bytes on device 0, in address order (the order staging
// places them in), the i-th filled with i + 1 as if by the GPU; freed when it goes.
struct ReleasableSet {
  std::vector<uvm_range> ranges;
  std::vector<unsigned char> fills;  // the byte each holds
  ReleasableSet(int count, size_t size) {
    for (int i = 0; i < count; ++i) {
      void* base = uvm_malloc_releasable(size, 0, nullptr);
      REQUIRE(base != nullptr);
      ranges.push_back(uvm_range{base, size});
    }
    std::sort(ranges.begin(), ranges.end(), [](const uvm_range& a, const uvm_range& b) { return a.ptr < b.ptr; });
    fills.resize(ranges.size());
    for (size_t i = 0; i < ranges.size(); ++i) fill(i, static_cast<unsigned char>(i + 1));
  }
  ReleasableSet(const ReleasableSet&) = delete;
  ReleasableSet& operator=(const ReleasableSet&) = delete;
  ~ReleasableSet() { free(); }
  void free() {
    for (const uvm_range& range : ranges) uvm_free(const_cast<void*>(range.ptr), range.size, 0, nullptr);
    ranges.clear();
  }
  // Offloads all of it, staged, on a thread of its own, as a program's pause beside the test.
  // A failure's message (uvm_last_error is the thread's) goes to `error` when given.
  TestThread offload_on_a_thread(cudaStream_t stream, uvm_status* status, std::string* error = nullptr) const {
    return TestThread([this, stream, status, error] {
      fake::set_thread_context(0);
      *status = uvm_offload_ranges(ranges.data(), ranges.size(), UVM_STRATEGY_STAGED, stream);
      if (error != nullptr && *status != UVM_OK) *error = uvm_last_error();
    });
  }
  // The same, the registration of pinning step `step` (0: the first) held until fake::release_held.
  TestThread offload_with_step_held(cudaStream_t stream, int step, uvm_status* status,
                                     std::string* error = nullptr) const {
    fake::hold_next("cudaHostRegister", step);
    TestThread offload = offload_on_a_thread(stream, status, error);
    REQUIRE(fake::wait_until_held());
    return offload;
  }
  // Writes `value` over the i-th as if by the GPU: what it holds from now on.
  void fill(size_t i, unsigned char value) {
    std::memset(const_cast<void*>(ranges[i].ptr), value, ranges[i].size);
    fake::device_wrote(ranges[i].ptr, ranges[i].size);
    fills[i] = value;
  }
  // Brings it all back on `stream`, checks every byte, frees it and checks no staging is left.
  void onload_check_and_free(cudaStream_t stream) {
    REQUIRE(uvm_onload_ranges(ranges.data(), ranges.size(), stream) == UVM_OK);
    CHECK(wrong_bytes() == 0);
    free();
    check_no_staging_left();
  }
  // The bytes that no longer hold what they were filled with.
  size_t wrong_bytes() const {
    size_t wrong = 0;
    for (size_t i = 0; i < ranges.size(); ++i) {
      const auto* bytes = static_cast<const unsigned char*>(ranges[i].ptr);
      for (size_t k = 0; k < ranges[i].size; ++k) wrong += bytes[k] != fills[i];
    }
    return wrong;
  }
};

// A set of `count` releasable allocations with no staging pinned, so that its offload pins in steps.
ReleasableSet with_nothing_pinned(int count, size_t size) {
  REQUIRE(uvm_release_staging() == UVM_OK);
  return ReleasableSet(count, size);
}

// Polls `done` until it holds or `ms` have passed.
void wait_until(const std::function<bool()>& done, int ms) {
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::milliseconds(ms);
  while (!done() && std::chrono::steady_clock::now() < deadline) std::this_thread::sleep_for(std::chrono::milliseconds(1));
}

// Waits until the offload on `offload`'s thread has issued `copied_bytes` of copies, begun its next
// round (the round's wait, on `stream`, for the moves before it is in the log after them) and
// sleeps there: waiting, with no lock held, for a held step of its pinning. A held step alone says
// nothing of the rounds done: the pinning thread waits only so long for the copies into the steps
// before it (kPaceWaitMs), so on a slow host it reaches the held step before the offload's rounds.
bool wait_for_round_waiting(const TestThread& offload, cudaStream_t stream, size_t copied_bytes) {
  auto round_began = [&] {
    size_t copied = 0;
    for (const fake::Op& op : fake::ops()) {
      if (op.call == fake::OpKind::copy_to_host) copied += op.size;
      if (op.call == fake::OpKind::wait_event && op.stream == stream && copied >= copied_bytes) return true;
    }
    return false;
  };
  wait_until(round_began, fake::kHeldWithinMs);
  return round_began() && threads::wait_until_parked(offload.id(), fake::kHeldWithinMs);
}
}  // namespace

// The driver holds a release behind the registrations of a pinning in progress (1–17 ms each, H100),
// and the offload waited there instead of copying the steps pinned meanwhile: the memory a round
// empties goes back in a later round, while no step registers, or in the last, and none is lost.
TEST_CASE("an offload in rounds gives no releasable memory back while a step of its staging registers",
          "[scenario][steps][steps_race][cuda13]") {
  FakeMachine machine;
  // Two of 200 MiB: the one at the lower address lies wholly in the first 256 MiB step (the staged
  // pieces go in address order), the other spans the first two.
  ReleasableSet set = with_nothing_pinned(2, 200 * kMiB);
  cudaStream_t stream = fake::make_stream();
  uvm_status offloaded = UVM_ERROR_INTERNAL;
  TestThread offload = set.offload_with_step_held(stream, 1, &offloaded);  // the second step waits
  wait_until([&] { return FakeMachine::bytes_of(fake::OpKind::copy_to_host) >= 256 * kMiB; }, fake::kHeldWithinMs);
  // Parked: waiting for the held step, with whatever it would release before that released.
  REQUIRE(threads::wait_until_parked(offload.id()));
  CHECK(FakeMachine::bytes_of(fake::OpKind::copy_to_host) == 256 * kMiB);  // the first step's round: all of one allocation
  CHECK(FakeMachine::ops_named(fake::OpKind::vmm_release).empty());  // and kept its memory while the step registers
  fake::release_held();
  offload.join();
  REQUIRE(offloaded == UVM_OK);
  CHECK(FakeMachine::bytes_of(fake::OpKind::vmm_release) == 400 * kMiB);  // all of it once the pinning ended
  CHECK(fake::mapped_reservations() == 0);
  set.onload_check_and_free(stream);
}

// A pause into fresh staging copies one step a round, so a release left to the last round gave all of
// its memory back in one burst at its end, and the driver was still taking it back when the program's
// next allocation came (docs/measurements.md). A round gives back, before its copies (the pinning
// thread waits for them meanwhile, so no registration runs beside), what earlier rounds emptied.
TEST_CASE("an offload in rounds gives back the memory earlier rounds emptied before its own copies",
          "[scenario][steps][cuda13]") {
  FakeMachine machine;
  // Six of 100 MiB over three steps (256, 256, 88 MiB): the first two lie wholly in the first step.
  ReleasableSet set = with_nothing_pinned(6, 100 * kMiB);
  cudaStream_t stream = fake::make_stream();
  uvm_status offloaded = UVM_ERROR_INTERNAL;
  // The third step waits: at least two rounds come before it.
  TestThread offload = set.offload_with_step_held(stream, 2, &offloaded);
  fake::release_held();
  offload.join();
  REQUIRE(offloaded == UVM_OK);
  // In the log: each unmap after every copy out of its allocation, and some before the last copy.
  size_t copied = 0, released_early = 0, unmapped = 0;
  const size_t total = 600 * kMiB;
  for (const fake::Op& op : fake::ops()) {
    if (op.call == fake::OpKind::copy_to_host) copied += op.size;
    if (op.call != fake::OpKind::vmm_unmap) continue;
    const size_t index = std::find_if(set.ranges.begin(), set.ranges.end(),
                                      [&](const uvm_range& r) { return r.ptr == op.ptr; }) - set.ranges.begin();
    REQUIRE(index < set.ranges.size());
    CAPTURE(index, copied);
    CHECK(copied >= (index + 1) * 100 * kMiB);  // staged in address order: its bytes all copied
    released_early += copied < total;
    ++unmapped;
  }
  CHECK(copied == total);
  CHECK(unmapped == 6);
  CHECK(released_early >= 2);
  CHECK(fake::mapped_reservations() == 0);
  set.onload_check_and_free(stream);
}

TEST_CASE("an offload whose release between rounds fails says so, and every byte comes back",
          "[scenario][steps][cuda13]") {
  FakeMachine machine;
  ReleasableSet set = with_nothing_pinned(6, 100 * kMiB);
  cudaStream_t stream = fake::make_stream();
  fake::fail_next("cuMemUnmap", cudaErrorInvalidValue);  // the first release: the second round's
  uvm_status offloaded = UVM_OK;
  std::string error;
  TestThread offload = set.offload_with_step_held(stream, 2, &offloaded, &error);
  fake::release_held();
  offload.join();
  CHECK(offloaded == UVM_ERROR_CUDA);
  CAPTURE(error);
  CHECK(error.find("cuMemUnmap") != std::string::npos);
  CHECK(cudaPeekAtLastError() == cudaSuccess);
  CHECK(FakeMachine::bytes_of(fake::OpKind::copy_to_host) == 256 * kMiB);  // its copies were never issued
  CHECK(FakeMachine::ops_named(fake::OpKind::vmm_unmap).empty());
  set.onload_check_and_free(stream);  // staged or still on the device, every byte comes back
}

// An offload in rounds knows where its own copies out of each releasable allocation end. If, between
// its rounds, the allocation came back and another call moved it off again (its copies still
// running), that knowledge is stale: the offload must wait for the other move too before it gives
// the allocation's memory back, or the other copies read memory no longer mapped.
TEST_CASE("an offload in rounds waits for another call's move of an allocation before releasing it",
          "[scenario][steps][steps_race][cuda13]") {
  FakeMachine machine;
  ReleasableSet set = with_nothing_pinned(6, 100 * kMiB);
  const uvm_range first = set.ranges.front();
  cudaStream_t stream = fake::make_stream(), other = fake::make_stream();
  uvm_status offloaded = UVM_ERROR_INTERNAL;
  TestThread offload = set.offload_with_step_held(stream, 2, &offloaded);
  REQUIRE(wait_for_round_waiting(offload, stream, 512 * kMiB));  // two rounds done, the third waits
  // Meanwhile another call brings the first allocation back and moves it off again (into memory
  // mapped for it: the staging is the pinning offload's); its move's last event has not been
  // reached (events stay pending), and its release fails, so the memory stays mapped.
  REQUIRE(uvm_onload_ranges(&first, 1, other) == UVM_OK);
  fake::set_events_pending(true);
  const size_t before_other = fake::ops().size();
  fake::fail_next("cuMemUnmap", cudaErrorInvalidValue);
  CHECK(uvm_offload_ranges(&first, 1, UVM_STRATEGY_MMAP, other) == UVM_ERROR_CUDA);
  const std::vector<fake::Op> after_other = fake::ops();
  const void* other_move = nullptr;  // where the other call's move ends: its last event
  for (size_t i = before_other; i < after_other.size(); ++i) {
    if (after_other[i].call == fake::OpKind::event_record) other_move = after_other[i].ptr;
  }
  REQUIRE(other_move != nullptr);
  REQUIRE(fake::event_pending(static_cast<cudaEvent_t>(const_cast<void*>(other_move))));
  fake::release_held();
  offload.join();
  REQUIRE(offloaded == UVM_OK);
  // Before the offload unmaps that allocation: a wait for the other move, by its event or by this
  // offload's stream once the stream waits for it.
  bool waited = false, stream_waits = false, unmapped = false;
  const std::vector<fake::Op> log = fake::ops();
  for (size_t i = after_other.size(); i < log.size() && !unmapped; ++i) {
    const fake::Op& op = log[i];
    if (op.call == fake::OpKind::event_sync && op.ptr == other_move) waited = true;
    if (op.call == fake::OpKind::wait_event && op.ptr == other_move && op.stream == stream) stream_waits = true;
    if (op.call == fake::OpKind::stream_sync && op.stream == stream && stream_waits) waited = true;
    unmapped = op.call == fake::OpKind::vmm_unmap && op.ptr == first.ptr;
  }
  CHECK(unmapped);
  CHECK(waited);
  fake::set_events_pending(false);
  set.onload_check_and_free(stream);
}

// Between an offload's rounds the program may free an allocation the offload has moved and get a new
// one at its address (the driver hands freed ranges out again). The offload's next round moves what
// the address holds now, the new allocation's bytes; where the old one's copies ended must neither
// give the new one's memory back before its own copies nor stand for them.
TEST_CASE("an offload in rounds moves a new allocation made at a freed one's address between its rounds",
          "[scenario][steps][steps_race][safety][cuda13]") {
  for (const bool copies_running : {false, true}) {
    CAPTURE(copies_running);  // false: the freed one's memory went back early; true: still copying
    FakeMachine machine;
    ReleasableSet set = with_nothing_pinned(6, 100 * kMiB);
    const uvm_range second = set.ranges[1];  // wholly in the first step: copied in the first round
    cudaStream_t stream = fake::make_stream();
    fake::set_events_pending(copies_running);
    uvm_status offloaded = UVM_ERROR_INTERNAL;
    TestThread offload = set.offload_with_step_held(stream, 2, &offloaded);
    // The free comes once the third round waits: it found the ranges whole and waits, holding no
    // lock, for the held step; had it begun between the free and the new allocation, it would have
    // failed on the freed range instead (UVM_ERROR_INVALID_ARGUMENT, as it should).
    REQUIRE(wait_for_round_waiting(offload, stream, 512 * kMiB));  // two rounds done, the third waits
    uvm_free(const_cast<void*>(second.ptr), second.size, 0, nullptr);
    fake::reserve_next_at(second.ptr);
    void* again = uvm_malloc_releasable(second.size, 0, nullptr);
    REQUIRE(again == second.ptr);
    set.fill(1, 0x5A);  // the program's new data there
    const size_t made_again = fake::ops().size();
    fake::release_held();
    offload.join();
    REQUIRE(offloaded == UVM_OK);
    CHECK(residency().staged_bytes == 600 * kMiB);  // the new allocation's bytes too
    // Its memory goes back only after every byte of it is copied out and, while copies run, a wait
    // for its last copy: on its stream, or on an event recorded there after it.
    size_t copied = 0;
    cudaStream_t copied_on = nullptr;
    std::set<const void*> events_after_copy;
    bool waited = false, unmapped = false;
    const std::vector<fake::Op> log = fake::ops();
    for (size_t i = made_again; i < log.size() && !unmapped; ++i) {
      const fake::Op& op = log[i];
      const bool inside = op.ptr >= second.ptr && op.ptr < static_cast<const char*>(second.ptr) + second.size;
      if (op.call == fake::OpKind::copy_to_host && inside) {
        copied += op.size;
        copied_on = op.stream;
        events_after_copy.clear();
        waited = false;
      }
      const bool on_copy_stream = copied > 0 && op.stream == copied_on;
      if (op.call == fake::OpKind::event_record && on_copy_stream) events_after_copy.insert(op.ptr);
      if (op.call == fake::OpKind::event_sync && events_after_copy.count(op.ptr)) waited = true;
      if (op.call == fake::OpKind::stream_sync && on_copy_stream) waited = true;
      if (op.call == fake::OpKind::vmm_unmap && op.ptr == second.ptr) {
        unmapped = true;
        CHECK(copied == second.size);
        if (copies_running) CHECK(waited);  // else a query may have found them done: no wait in the log
      }
    }
    CHECK(unmapped);
    fake::set_events_pending(false);
    set.onload_check_and_free(stream);
  }
}

// On the H200 the driver issued an offload's copies slowly while the pinning thread registered the
// next step (docs/measurements.md, "A pause without retained memory: the wall"). The pinning thread
// registers a step only once the copies into the steps pinned before it are issued.
TEST_CASE("an offload in rounds issues the copies into a pinned step before the next step is registered",
          "[scenario][steps][steps_race][cuda13]") {
  FakeMachine machine;
  // Three of 200 MiB: 600 MiB staged in address order over three steps (256, 256, 88 MiB).
  ReleasableSet set = with_nothing_pinned(3, 200 * kMiB);
  cudaStream_t stream = fake::make_stream();
  auto registrations = [] { return FakeMachine::ops_named(fake::OpKind::host_register).size(); };
  fake::hold_next("cudaMemcpyAsync");  // the first copy into the first step waits
  const uint64_t parked_before = uvm::pinning_parked_count();
  uvm_status offloaded = UVM_ERROR_INTERNAL;
  TestThread offload = set.offload_on_a_thread(stream, &offloaded);
  REQUIRE(fake::wait_until_held());
  // The second step's pages were being faulted in meanwhile: unpaced, it would register now; paced,
  // the pinning thread parks until the held copy is issued (no time given: a slow host waits longer).
  wait_until([&] { return registrations() >= 2 || uvm::pinning_parked_count() > parked_before; }, fake::kHeldWithinMs);
  CHECK(registrations() == 1);
  fake::release_held();
  offload.join();
  REQUIRE(offloaded == UVM_OK);
  // In the log, each step's registration comes after the copies into the steps before it.
  size_t copied = 0, steps = 0;
  for (const fake::Op& op : fake::ops()) {
    if (op.call == fake::OpKind::copy_to_host) copied += op.size;
    if (op.call != fake::OpKind::host_register) continue;
    CAPTURE(steps);
    CHECK(copied == steps * 256 * kMiB);
    ++steps;
  }
  CHECK(steps == 3);
  set.onload_check_and_free(stream);
}

TEST_CASE("bytes written again after a discard survive an offload or prefetch that migrates them",
          "[offload][safety][cuda13]") {
  // The driver counts discarded pages written again (by a copy, measured with
  // bench/probes/transfer_probe.cu hazard; a kernel is assumed alike) as discarded until a prefetch to the
  // device follows the write, and a prefetch to the CPU drops them. Found by the model
  // (test_model.cpp, seed 52): a block handed out over staged pages, written, then migrated.
  constexpr size_t kSize = size_t{1} << 20;
  for (const char* how : {"discard", "staged offload and a new block", "prefetch to the CPU"}) {
    CAPTURE(how);
    FakeMachine machine;
    auto* p = static_cast<unsigned char*>(uvm_malloc(kSize, 0, nullptr));
    REQUIRE(p != nullptr);
    const uvm_range r{p, kSize};
    if (std::string(how) == "staged offload and a new block") {
      REQUIRE(uvm_offload_ranges(&r, 1, UVM_STRATEGY_STAGED, nullptr) == UVM_OK);
      REQUIRE(uvm_block_freed(p, kSize) == UVM_OK);
      REQUIRE(uvm_block_allocated(p, kSize) == UVM_OK);
    } else {
      REQUIRE(uvm_discard_ranges(&r, 1, nullptr) == UVM_OK);
    }
    std::memset(p, 0x3C, kSize);  // the program writes its new data
    fake::device_wrote(p, kSize);
    if (std::string(how) == "prefetch to the CPU") {
      REQUIRE(uvm_prefetch(p, kSize, UVM_LOCATION_CPU, nullptr) == UVM_OK);
    } else {
      REQUIRE(uvm_offload_ranges(&r, 1, UVM_STRATEGY_MIGRATE, nullptr) == UVM_OK);
    }
    REQUIRE(uvm_onload_ranges(&r, 1, nullptr) == UVM_OK);
    size_t wrong = 0;
    for (size_t i = 0; i < kSize; ++i) wrong += p[i] != 0x3C;
    CHECK(wrong == 0);
    uvm_free(p, kSize, 0, nullptr);
  }
}
