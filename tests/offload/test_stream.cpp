// uvm_fetch_ranges / uvm_drop_clean_ranges against the fake runtime, which really copies bytes and
// scribbles over discarded ones: a fetch keeps the host copy, a drop lets the device bytes go with
// no copy out, the cycle repeats with the bytes intact, and a drop of bytes without a clean copy is
// refused before anything moves. Random sequences mixing them with everything else:
// test_model.cpp.
#include <cstring>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include "fixture.hpp"

namespace {
constexpr size_t kSize = size_t{4} << 20;

struct Managed {
  explicit Managed(size_t size = kSize, unsigned seed = 5) : size(size), seed(seed) {
    ptr = static_cast<unsigned char*>(uvm_malloc(size, 0, nullptr));
    REQUIRE(ptr != nullptr);
    for (size_t i = 0; i < size; ++i) ptr[i] = expected(i);
  }
  ~Managed() { uvm_free(ptr, size, 0, nullptr); }
  unsigned char expected(size_t i) const { return static_cast<unsigned char>(i * 11 + seed); }
  bool intact() const {
    for (size_t i = 0; i < size; ++i) {
      if (ptr[i] != expected(i)) return false;
    }
    return true;
  }
  uvm_range whole() const { return uvm_range{ptr, size}; }
  unsigned char* ptr;
  size_t size;
  unsigned seed;
};

// Offloads `range` (STAGED), then fetches it: afterwards uvm holds a clean copy of it.
void stage_and_fetch(const uvm_range& range, cudaStream_t stream) {
  REQUIRE(uvm_offload_ranges(&range, 1, UVM_STRATEGY_STAGED, stream) == UVM_OK);
  REQUIRE(uvm_fetch_ranges(&range, 1, stream, nullptr) == UVM_OK);
}

// A fake machine with one managed allocation offloaded and fetched: uvm holds a clean copy of it.
struct Fetched {
  FakeMachine machine;
  Managed weights;
  cudaStream_t stream = fake::make_stream();
  uvm_range range = weights.whole();
  Fetched() { stage_and_fetch(range, stream); }
};

}  // namespace

TEST_CASE_METHOD(Fetched, "a fetch keeps the host copy and a drop lets the device bytes go without copying them out",
                 "[stream][cuda13]") {
  CHECK(weights.intact());
  CHECK(residency().device_bytes == kSize);
  CHECK(kept_copies().retained_bytes == kSize);  // the clean copy

  for (int cycle = 0; cycle < 3; ++cycle) {
    fake::reset_ops();
    REQUIRE(uvm_drop_clean_ranges(&range, 1, stream) == UVM_OK);
    CHECK(FakeMachine::ops_named(fake::OpKind::copy_to_host).empty());  // no copy out
    const auto discards = FakeMachine::ops_named(fake::OpKind::discard);
    REQUIRE(discards.size() == 1);
    CHECK(discards[0].stream == stream);
    CHECK_FALSE(weights.intact());  // discarded: the fake scribbles over it
    CHECK(residency().device_bytes == 0);
    CHECK(residency().staged_bytes == kSize);
    CHECK(kept_copies().retained_bytes == 0);

    REQUIRE(uvm_fetch_ranges(&range, 1, stream, nullptr) == UVM_OK);
    CHECK(weights.intact());
    CHECK(FakeMachine::bytes_of(fake::OpKind::copy_to_device) == kSize);
    CHECK(residency().device_bytes == kSize);
    CHECK(kept_copies().retained_bytes == kSize);
  }
  uvm_move_report report{};
  REQUIRE(uvm_last_move(0, &report) == UVM_OK);
  CHECK(std::string(report.call) == "uvm_fetch_ranges");
  // Freed, the allocation takes its copy with it.
}

TEST_CASE("the arrived event is recorded on the stream once the fetch is issued", "[stream][cuda13]") {
  FakeMachine machine;
  Managed weights;
  cudaStream_t stream = fake::make_stream();
  const uvm_range range = weights.whole();
  REQUIRE(uvm_offload_ranges(&range, 1, UVM_STRATEGY_STAGED, stream) == UVM_OK);
  cudaEvent_t arrived = nullptr;
  REQUIRE(cudaEventCreateWithFlags(&arrived, cudaEventDisableTiming) == cudaSuccess);
  fake::reset_ops();
  REQUIRE(uvm_fetch_ranges(&range, 1, stream, arrived) == UVM_OK);
  const std::vector<fake::Op> ops = fake::ops();
  REQUIRE_FALSE(ops.empty());
  size_t last_copy = 0, recorded = ops.size();
  for (size_t i = 0; i < ops.size(); ++i) {
    if (ops[i].call == fake::OpKind::copy_to_device) last_copy = i;
    if (ops[i].call == fake::OpKind::event_record && ops[i].ptr == arrived) recorded = i;
  }
  REQUIRE(recorded < ops.size());
  CHECK(ops[recorded].stream == stream);
  CHECK(recorded > last_copy);
  REQUIRE(cudaEventDestroy(arrived) == cudaSuccess);
}

TEST_CASE("a drop of bytes without a clean copy is refused, naming them, and moves nothing", "[stream][cuda13]") {
  FakeMachine machine;
  Managed fetched, never(kSize, 9);
  cudaStream_t stream = fake::make_stream();
  stage_and_fetch(fetched.whole(), stream);
  fake::reset_ops();
  const uvm_range both[] = {fetched.whole(), never.whole()};
  CHECK(uvm_drop_clean_ranges(both, 2, stream) == UVM_ERROR_INVALID_ARGUMENT);
  const std::string message = uvm_last_error();
  CHECK(message.find("uvm_drop_clean_ranges") != std::string::npos);
  char at[32];
  std::snprintf(at, sizeof at, "%p", static_cast<void*>(never.ptr));
  CHECK(message.find(at) != std::string::npos);
  CHECK(message.find("no clean host copy") != std::string::npos);
  CHECK(cudaGetLastError() == cudaSuccess);
  CHECK(FakeMachine::ops_named(fake::OpKind::discard).empty());
  CHECK(fetched.intact());
  CHECK(never.intact());
  CHECK(residency().device_bytes == 2 * kSize);
  CHECK(kept_copies().retained_bytes == kSize);

  // Part of a fetched range that a later onload (not a fetch) brought back: the copy went with it.
  Managed onloaded(kSize, 13);
  const uvm_range whole = onloaded.whole();
  REQUIRE(uvm_offload_ranges(&whole, 1, UVM_STRATEGY_STAGED, stream) == UVM_OK);
  REQUIRE(uvm_onload_ranges(&whole, 1, stream) == UVM_OK);
  CHECK(uvm_drop_clean_ranges(&whole, 1, stream) == UVM_ERROR_INVALID_ARGUMENT);
  CHECK(onloaded.intact());
  uvm_clear_last_error();
}

TEST_CASE_METHOD(Fetched, "bytes written after a fetch are offloaded, not dropped: the copy is written again in place",
                 "[stream][cuda13]") {
  const void* copy = nullptr;
  REQUIRE(uvm_get_staged_copy(weights.ptr, kSize, &copy) == UVM_OK);
  REQUIRE(copy != nullptr);
  weights.seed = 77;  // an optimizer step: new weights
  for (size_t i = 0; i < kSize; ++i) weights.ptr[i] = weights.expected(i);
  fake::device_wrote(weights.ptr, kSize);
  fake::reset_ops();
  REQUIRE(uvm_offload_ranges(&range, 1, UVM_STRATEGY_STAGED, stream) == UVM_OK);
  CHECK(FakeMachine::pinnings() == 0);  // into the same host bytes
  const void* again = nullptr;
  REQUIRE(uvm_get_staged_copy(weights.ptr, kSize, &again) == UVM_OK);
  CHECK(again == copy);
  REQUIRE(uvm_fetch_ranges(&range, 1, stream, nullptr) == UVM_OK);
  CHECK(weights.intact());
  REQUIRE(uvm_drop_clean_ranges(&range, 1, stream) == UVM_OK);
  REQUIRE(uvm_fetch_ranges(&range, 1, stream, nullptr) == UVM_OK);
  CHECK(weights.intact());  // the new weights, not the first ones
}

TEST_CASE("a drop skips bytes already offloaded and bytes between the ranges", "[stream][cuda13]") {
  FakeMachine machine;
  Managed weights;
  cudaStream_t stream = fake::make_stream();
  const size_t quarter = kSize / 4;
  const uvm_range first{weights.ptr, quarter}, second{weights.ptr + quarter, quarter};
  const uvm_range last{weights.ptr + 3 * quarter, quarter};
  stage_and_fetch(first, stream);
  stage_and_fetch(last, stream);
  REQUIRE(uvm_offload_ranges(&second, 1, UVM_STRATEGY_STAGED, stream) == UVM_OK);  // away already
  fake::reset_ops();
  const uvm_range ranges[] = {last, second, first};
  REQUIRE(uvm_drop_clean_ranges(ranges, 3, stream) == UVM_OK);
  size_t discarded = 0;
  for (const fake::Op& op : FakeMachine::ops_named(fake::OpKind::discard)) discarded += op.size;
  CHECK(discarded == 2 * quarter);  // first and last; second was away, the third quarter not named
  for (size_t i = 2 * quarter; i < 3 * quarter; ++i) REQUIRE(weights.ptr[i] == weights.expected(i));
  CHECK(residency().device_bytes == quarter);
  const uvm_range all = weights.whole();
  REQUIRE(uvm_onload_ranges(&all, 1, stream) == UVM_OK);
  CHECK(weights.intact());
}

TEST_CASE("a drop gives a releasable allocation's memory back once none of it is on the device",
          "[stream][releasable]") {
  FakeMachine machine;
  Releasable weights;
  cudaStream_t stream = fake::make_stream();
  const uvm_range range = weights.whole();
  stage_and_fetch(range, stream);
  CHECK(fake::mapped_reservations() == 1);
  const uvm_range half = weights.part(0, weights.size / 2);
  REQUIRE(uvm_drop_clean_ranges(&half, 1, stream) == UVM_OK);
  CHECK(fake::mapped_reservations() == 1);  // half of it still holds bytes on the device
  REQUIRE(uvm_drop_clean_ranges(&range, 1, stream) == UVM_OK);
  CHECK(fake::mapped_reservations() == 0);
  CHECK(residency().released_bytes == weights.size);
  CHECK(FakeMachine::ops_named(fake::OpKind::copy_to_host).size() == 1);  // the first offload's only
  REQUIRE(uvm_fetch_ranges(&range, 1, stream, nullptr) == UVM_OK);
  CHECK(fake::mapped_reservations() == 1);
  CHECK(weights.intact());
}

TEST_CASE("a block freed and handed out again has no clean copy to drop", "[stream][blocks][cuda13]") {
  FakeMachine machine;
  REQUIRE(uvm_report_blocks(1) == UVM_OK);
  Managed segment;
  uvm_report_blocks(0);
  cudaStream_t stream = fake::make_stream();
  const uvm_range block{segment.ptr, kSize / 2};
  REQUIRE(uvm_block_allocated(block.ptr, block.size) == UVM_OK);
  stage_and_fetch(block, stream);
  REQUIRE(uvm_block_freed(block.ptr, block.size) == UVM_OK);
  REQUIRE(uvm_block_allocated(block.ptr, block.size) == UVM_OK);  // the caching allocator reuses it
  std::memset(segment.ptr, 0x3c, block.size);                      // the new tensor's bytes
  fake::device_wrote(segment.ptr, block.size);
  CHECK(uvm_drop_clean_ranges(&block, 1, stream) == UVM_ERROR_INVALID_ARGUMENT);
  uvm_clear_last_error();
  for (size_t i = 0; i < block.size; ++i) REQUIRE(segment.ptr[i] == 0x3c);
}

TEST_CASE("drops and fetches of the same bytes on two threads serialize: the bytes come back whole",
          "[stream][threads][cuda13]") {
  FakeMachine machine;
  Managed weights;
  const uvm_range range = weights.whole();
  stage_and_fetch(range, fake::make_stream());
  std::vector<std::string> failures(2);
  auto cycle = [&](int who) {
    fake::set_thread_context(0);
    cudaStream_t stream = fake::make_stream();
    for (int i = 0; i < 50; ++i) {
      // Either order is fine; each call must succeed, whatever the other thread did before it.
      if (uvm_drop_clean_ranges(&range, 1, stream) != UVM_OK) failures[who] = std::string("drop: ") + uvm_last_error();
      if (uvm_fetch_ranges(&range, 1, stream, nullptr) != UVM_OK) failures[who] = std::string("fetch: ") + uvm_last_error();
    }
  };
  std::thread other(cycle, 1);
  cycle(0);
  other.join();
  CHECK(failures[0].empty());
  CHECK(failures[1].empty());
  const uvm_range r = range;
  REQUIRE(uvm_fetch_ranges(&r, 1, fake::make_stream(), nullptr) == UVM_OK);
  CHECK(weights.intact());
}

TEST_CASE("a fetch copies on one stream, in chunks of at least 256 MiB, where an onload uses several",
          "[stream][releasable]") {
  FakeMachine machine;
  Releasable a(4 << 20, 0, 3), b(4 << 20, 0, 5), c(4 << 20, 0, 7);
  cudaStream_t stream = fake::make_stream();
  const uvm_range all[] = {a.whole(), b.whole(), c.whole()};
  const auto copy_streams = [] {
    std::set<cudaStream_t> streams;
    for (const fake::OpKind kind : {fake::OpKind::copy_to_device, fake::OpKind::sm_copy}) {
      for (const fake::Op& op : FakeMachine::ops_named(kind)) streams.insert(op.stream);
    }
    return streams;
  };
  REQUIRE(uvm_offload_ranges(all, 3, UVM_STRATEGY_STAGED, stream) == UVM_OK);
  fake::reset_ops();
  REQUIRE(uvm_onload_ranges(all, 3, stream) == UVM_OK);  // a chunk per allocation, a worker each
  CHECK(copy_streams().size() == 3);
  REQUIRE(uvm_offload_ranges(all, 3, UVM_STRATEGY_STAGED, stream) == UVM_OK);
  fake::reset_ops();
  REQUIRE(uvm_fetch_ranges(all, 3, stream, nullptr) == UVM_OK);
  CHECK(copy_streams().size() == 1);
  CHECK(a.intact());
  CHECK(b.intact());
  CHECK(c.intact());
}
