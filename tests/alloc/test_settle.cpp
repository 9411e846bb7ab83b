// Settling the driver after a wake (alloc/settle.*): after a wake made new physical memory, uvm's
// thread makes and gives back the smallest allocation on that device now and then, until its window
// ends or a release on that device comes; nothing else starts it, and nothing it makes stays. The
// settling clock moves only when a test moves it (one millisecond at a time), so the polls are
// counted exactly and no test waits for time to pass or depends on how fast the host is.
#include <chrono>
#include <memory>
#include <thread>

#include "fixture.hpp"

namespace {
using std::chrono::milliseconds;
constexpr size_t kGranule = size_t{64} << 10;  // the fake driver's granularity: a poll's size
constexpr size_t kSize = size_t{1} << 20;      // an allocation's: never a poll's

// The polls' makes and gives-back in the ops so far, on `device`.
struct Polls {
  size_t made = 0, given_back = 0, elsewhere = 0;
};

Polls polls_on(int device) {
  Polls p;
  for (const fake::Op& op : fake::ops()) {
    if (op.call == fake::OpKind::vmm_create && op.size == kGranule) ++(op.location == device ? p.made : p.elsewhere);
    if (op.call == fake::OpKind::vmm_release && op.size == kGranule) ++p.given_back;
  }
  return p;
}

// A releasable allocation on `device` under `tag`, dropped by a pause (no host backup).
std::unique_ptr<Releasable> dropped_by_pause(const char* tag, int device) {
  REQUIRE(uvm_set_thread_tag(tag) == UVM_OK);
  auto memory = std::make_unique<Releasable>(kSize, device, 5);
  REQUIRE(uvm_set_thread_tag(nullptr) == UVM_OK);
  return memory;
}

// Timing for the scope, on the test's clock; no polls again after (as every test begins).
struct Timing {
  explicit Timing(uvm::SettleTiming timing) {
    uvm::set_settle_clock_for_test(true);
    uvm::set_settle_timing_for_test(timing);
  }
  ~Timing() {
    uvm::set_settle_clock_for_test(false);
    FakeMachine::quiet_settling();
  }
};

// Moves the settling clock on `total`, a millisecond at a time, each poll due run before the next.
void elapse(milliseconds total) {
  for (milliseconds at{0}; at < total; ++at) uvm::advance_settle_clock_for_test(milliseconds(1));
}

// Moves the settling clock on until no poll is pending; how far it moved.
milliseconds until_settled() {
  milliseconds moved{0};
  uvm::advance_settle_clock_for_test(milliseconds(0));
  while (uvm::settling()) {
    REQUIRE(moved < milliseconds(10000));
    uvm::advance_settle_clock_for_test(milliseconds(1));
    ++moved;
  }
  return moved;
}
}  // namespace

TEST_CASE("after a resume made new memory, uvm's thread makes and gives back the smallest allocation on that device "
          "until the window ends", "[settle][threads]") {
  FakeMachine machine;
  Timing timing({milliseconds(10), milliseconds(10), milliseconds(150)});
  auto kv = dropped_by_pause("kv_cache", 1);
  REQUIRE(uvm_pause(1, "kv_cache") == UVM_OK);
  const size_t handles_paused = fake::physical_handles();
  fake::reset_ops();
  REQUIRE(uvm_resume(1, "kv_cache") == UVM_OK);
  CHECK(FakeMachine::ops_named(fake::OpKind::vmm_create).size() == 1);  // the resume's own, at once
  elapse(milliseconds(9));
  CHECK(polls_on(1).made == 0);  // the first comes a whole delay after the wake
  elapse(milliseconds(1));
  CHECK(polls_on(1).made == 1);
  CHECK(until_settled() == milliseconds(140));  // the window, not the first poll, ends it
  const Polls p = polls_on(1);
  CHECK(p.made == 15);  // at 10, 20, ... 150 ms
  CHECK(p.given_back == p.made);
  CHECK(p.elsewhere == 0);
  CHECK(fake::physical_handles() == handles_paused + 1);  // the resumed memory; nothing of the polls
  CHECK(cudaPeekAtLastError() == cudaSuccess);
  CHECK(kv->ptr[0] == fake::kFreshPhysical);  // dropped by the pause, mapped again as new memory
}

TEST_CASE("a release on the device ends its polls; another device's polls go on", "[settle][threads]") {
  FakeMachine machine;
  Timing timing({milliseconds(30), milliseconds(10), milliseconds(400)});
  auto on0 = dropped_by_pause("a", 0);
  auto on1 = dropped_by_pause("b", 1);
  REQUIRE(uvm_pause(UVM_ANY_DEVICE, nullptr) == UVM_OK);
  REQUIRE(uvm_resume(UVM_ANY_DEVICE, nullptr) == UVM_OK);
  fake::reset_ops();
  // Device 0 gives memory back before its first poll: none comes; device 1's window goes on.
  REQUIRE(uvm_pause(0, "a") == UVM_OK);
  CHECK(until_settled() == milliseconds(400));
  CHECK(polls_on(0).made == 0);
  CHECK(polls_on(1).made == 38);  // at 30, 40, ... 400 ms
  // A wake starts device 0's window again; a release while its polls run ends them there and then.
  fake::reset_ops();
  REQUIRE(uvm_resume(0, "a") == UVM_OK);
  elapse(milliseconds(80));
  CHECK(polls_on(0).made == 6);  // at 30, 40, ... 80 ms
  REQUIRE(uvm_pause(0, "a") == UVM_OK);
  CHECK(until_settled() == milliseconds(0));  // not the 400 ms window: no time passes
  CHECK(polls_on(0).made == 6);
  CHECK(polls_on(1).made == 0);
  CHECK(cudaPeekAtLastError() == cudaSuccess);
}

TEST_CASE("a map of spare memory and a new allocation make nothing new at a wake: no polls", "[settle][threads]") {
  FakeMachine machine;
  Timing timing({milliseconds(1), milliseconds(1), milliseconds(100)});
  auto kept = dropped_by_pause("kept", 0);
  REQUIRE(uvm_set_spare_limit(0, kSize) == UVM_OK);
  REQUIRE(uvm_pause(0, "kept") == UVM_OK);  // its memory kept as spare
  fake::reset_ops();
  REQUIRE(uvm_resume(0, "kept") == UVM_OK);
  Releasable fresh(kSize, 0, 9);  // made by vmm_allocate: a new allocation, not a wake
  CHECK_FALSE(uvm::settling());
  elapse(milliseconds(100));
  CHECK(FakeMachine::ops_named(fake::OpKind::vmm_create).size() == 1);  // the new allocation's own
  CHECK(polls_on(0).made == 0);
  CHECK(FakeMachine::ops_named(fake::OpKind::vmm_map).size() == 2);  // the spare memory's, the new allocation's
}

TEST_CASE("an onload's new memory starts the polls too", "[settle][threads]") {
  FakeMachine machine;
  Timing timing({milliseconds(5), milliseconds(5), milliseconds(60)});
  Releasable weights(kSize, 1, 7);
  const uvm_range all = weights.whole();
  REQUIRE(uvm_offload_ranges(&all, 1, UVM_STRATEGY_STAGED, nullptr) == UVM_OK);
  fake::reset_ops();
  REQUIRE(uvm_onload_ranges(&all, 1, nullptr) == UVM_OK);
  CHECK(until_settled() == milliseconds(60));
  CHECK(polls_on(1).made == 12);  // at 5, 10, ... 60 ms
  CHECK(polls_on(1).elsewhere == 0);
  CHECK(weights.intact());
}

TEST_CASE("a wake while a poll waits in the driver puts the next poll a whole delay after it", "[settle][threads]") {
  FakeMachine machine;
  Timing timing({milliseconds(5), milliseconds(5), milliseconds(1000)});
  auto a = dropped_by_pause("a", 0);
  auto b = dropped_by_pause("b", 0);
  REQUIRE(uvm_pause(0, nullptr) == UVM_OK);
  REQUIRE(uvm_resume(0, "a") == UVM_OK);
  fake::hold_next("cuMemCreate");  // the first poll's
  std::thread first_poll([] { uvm::advance_settle_clock_for_test(milliseconds(5)); });  // returns once it ran
  REQUIRE(fake::wait_until_held());
  uvm::set_settle_timing_for_test({milliseconds(200), milliseconds(5), milliseconds(1000)});
  REQUIRE(uvm_resume(0, "b") == UVM_OK);  // its own map passes: the gate holds one call
  fake::reset_ops();
  fake::release_held();
  first_poll.join();
  elapse(milliseconds(199));
  CHECK(polls_on(0).made == 1);  // the held poll's own; none 5 ms after it
  elapse(milliseconds(1));
  CHECK(polls_on(0).made == 2);  // 200 ms after the wake
}

TEST_CASE("a wake whose map fails made nothing new: no polls", "[settle][threads]") {
  FakeMachine machine;
  Timing timing({milliseconds(1), milliseconds(1), milliseconds(100)});
  auto kv = dropped_by_pause("kv_cache", 0);
  REQUIRE(uvm_pause(0, "kv_cache") == UVM_OK);
  fake::fail_next("cuMemMap", cudaErrorMemoryAllocation);
  fake::reset_ops();
  CHECK(uvm_resume(0, "kv_cache") != UVM_OK);  // its new memory given back at once, nothing mapped
  CHECK_FALSE(uvm::settling());
  elapse(milliseconds(100));
  CHECK(polls_on(0).made == 0);
  CHECK(fake::mapped_reservations() == 0);
  REQUIRE(uvm_resume(0, "kv_cache") == UVM_OK);  // tried again, it maps
}

TEST_CASE("a poll the driver refuses is dropped and the next one comes", "[settle][threads]") {
  FakeMachine machine;
  Timing timing({milliseconds(5), milliseconds(10), milliseconds(120)});
  auto kv = dropped_by_pause("kv_cache", 0);
  REQUIRE(uvm_pause(0, "kv_cache") == UVM_OK);
  REQUIRE(uvm_resume(0, "kv_cache") == UVM_OK);
  fake::fail_next("cuMemCreate", cudaErrorMemoryAllocation);
  fake::reset_ops();
  CHECK(until_settled() == milliseconds(115));  // the last at 115 ms: 125 is past the window
  CHECK(polls_on(0).made == 11);  // at 5, 15, ... 115 ms, but for the first, refused
  CHECK(polls_on(0).given_back == polls_on(0).made);
  CHECK(cudaPeekAtLastError() == cudaSuccess);
  CHECK(uvm_last_status() == UVM_OK);  // the polls' thread records nothing on the caller's
}

TEST_CASE("UVM_SETTLE=0: no polls after any wake", "[settle_off]") {
  FakeMachine machine;
  Timing timing({milliseconds(1), milliseconds(1), milliseconds(100)});
  auto kv = dropped_by_pause("kv_cache", 0);
  REQUIRE(uvm_pause(0, "kv_cache") == UVM_OK);
  fake::reset_ops();
  REQUIRE(uvm_resume(0, "kv_cache") == UVM_OK);
  CHECK_FALSE(uvm::settling());
  elapse(milliseconds(100));
  CHECK(FakeMachine::ops_named(fake::OpKind::vmm_create).size() == 1);
  CHECK(polls_on(0).made == 0);
}
