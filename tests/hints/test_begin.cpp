// How every move begins (hints/moves/begin.cpp): one preamble, the kinds' differences in its rules.
#include <atomic>
#include <chrono>
#include <thread>

#include "../../alloc/moves.hpp"
#include "../../hints/moves/begin.hpp"
#include "fixture.hpp"
#include "threads.hpp"

namespace {
constexpr size_t kSize = size_t{1} << 20;
const uvm::Call kCall = uvm::Call::of("test");

struct Two {
  void* on0 = uvm_malloc(kSize, 0, nullptr);
  void* on1 = nullptr;
  Two() {
    fake::set_thread_context(1);
    on1 = uvm_malloc(kSize, 1, nullptr);
    fake::set_thread_context(0);
  }
  ~Two() {
    uvm_free(on0, kSize, 0, nullptr);
    uvm_free(on1, kSize, 1, nullptr);
  }
};
}  // namespace

TEST_CASE("a move with nothing to move takes the lock and stops: no context, no trace, no wait", "[begin]") {
  FakeMachine machine;
  fake::set_thread_context(fake::kNoContext);
  fake::reset_ops();
  const uvm_range empty[] = {{nullptr, 0}, {nullptr, 0}};
  for (const uvm::MoveKind kind : {uvm::MoveKind::prefetch, uvm::MoveKind::discard, uvm::MoveKind::offload,
                                   uvm::MoveKind::onload}) {
    uvm::MoveScope move;
    REQUIRE(uvm::begin_move(kCall, kind, uvm::MoveArgs::of(empty, 2), nullptr, &move) == UVM_OK);
    CHECK(move.ranges.empty());
    CHECK(fake::current_context() == fake::kNoContext);
  }
  uvm::MoveScope one;
  REQUIRE(uvm::begin_move(kCall, uvm::MoveKind::prefetch, uvm::MoveArgs::one(nullptr, 0), nullptr, &one) == UVM_OK);
  CHECK(one.ranges.empty());
  CHECK(fake::ops().empty());
}

TEST_CASE("offload and onload take ranges of one device and run in its context; prefetch and discard in the caller's",
          "[begin][cuda13]") {
  FakeMachine machine;
  Two memory;
  const uvm_range both[] = {{memory.on1, kSize}, {memory.on0, kSize}};
  for (const uvm::MoveKind kind : {uvm::MoveKind::offload, uvm::MoveKind::onload}) {
    uvm::MoveScope move;
    CHECK(uvm::begin_move(kCall, kind, uvm::MoveArgs::of(both, 2), nullptr, &move) == UVM_ERROR_INVALID_ARGUMENT);
    CHECK_THAT(last_error(), Has("the ranges belong to devices 0 and 1"));
  }
  {
    uvm::MoveScope move;  // to the CPU, from both devices: decided by the lowest range's device
    REQUIRE(uvm::begin_move(kCall, uvm::MoveKind::prefetch, uvm::MoveArgs::of(both, 2).to(UVM_LOCATION_CPU), nullptr,
                            &move) == UVM_OK);
    REQUIRE(move.ranges.size() == 2);
    CHECK(move.ranges.front().owner_device != move.ranges.back().owner_device);
    CHECK(move.device == move.ranges.front().owner_device);
    CHECK(fake::current_context() == 0);  // the caller's context was current: it stays
  }
  fake::set_thread_context(0);
  const uvm_range on1{memory.on1, kSize};
  {
    uvm::MoveScope move;
    REQUIRE(uvm::begin_move(kCall, uvm::MoveKind::discard, uvm::MoveArgs::of(&on1, 1), nullptr, &move) == UVM_OK);
    CHECK(move.device == 1);
    CHECK(fake::current_context() == 0);  // the caller's stays: its stream belongs to it
  }
  {
    uvm::MoveScope move;
    REQUIRE(uvm::begin_move(kCall, uvm::MoveKind::onload, uvm::MoveArgs::of(&on1, 1), nullptr, &move) == UVM_OK);
    CHECK(move.device == 1);
    CHECK(fake::current_context() == 1);  // uvm's streams and events of device 1 belong there
  }
  CHECK(fake::current_context() == 0);  // restored when the move ends
}

TEST_CASE("a discard on the legacy stream moves to uvm's ordering stream; the others keep the caller's",
          "[begin][cuda13]") {
  FakeMachine machine;
  void* a = uvm_malloc(kSize, 0, nullptr);
  REQUIRE(a != nullptr);
  const cudaStream_t mine = fake::make_stream();
  {
    uvm::MoveScope move;
    REQUIRE(uvm::begin_move(kCall, uvm::MoveKind::discard, uvm::MoveArgs::one(a, kSize), nullptr, &move) == UVM_OK);
    CHECK(move.stream != nullptr);
  }
  for (const uvm::MoveKind kind : {uvm::MoveKind::prefetch, uvm::MoveKind::discard, uvm::MoveKind::onload}) {
    uvm::MoveScope move;
    REQUIRE(uvm::begin_move(kCall, kind, uvm::MoveArgs::one(a, kSize), mine, &move) == UVM_OK);
    CHECK(move.stream == mine);
  }
  uvm::MoveScope legacy;
  REQUIRE(uvm::begin_move(kCall, uvm::MoveKind::prefetch, uvm::MoveArgs::one(a, kSize), nullptr, &legacy) == UVM_OK);
  CHECK(legacy.stream == nullptr);
  legacy.unlock();
  uvm_free(a, kSize, 0, nullptr);
}

TEST_CASE("a begun move holds the moves lock until it ends or lets go", "[begin][threads]") {
  FakeMachine machine;
  void* a = uvm_malloc(kSize, 0, nullptr);
  REQUIRE(a != nullptr);
  std::atomic<bool> locked{false};
  std::atomic<pid_t> other_id{0};
  std::thread other;
  {
    uvm::MoveScope move;
    REQUIRE(uvm::begin_move(kCall, uvm::MoveKind::prefetch, uvm::MoveArgs::one(a, kSize), nullptr, &move) == UVM_OK);
    other = std::thread([&] {
      other_id = threads::this_id();
      const auto moves = uvm::lock_moves();
      locked = true;
    });
    REQUIRE(threads::wait_until_parked(other_id));  // at the lock: it takes it only once let go
    CHECK_FALSE(locked);
    move.unlock();
    other.join();
    CHECK(locked);
  }
  uvm_free(a, kSize, 0, nullptr);
}

TEST_CASE("a move the stream's capture forbids fails before it waits or issues anything", "[begin][cuda13]") {
  FakeMachine machine;
  void* a = uvm_malloc(kSize, 0, nullptr);
  REQUIRE(a != nullptr);
  const cudaStream_t capturing = fake::make_stream();
  fake::set_capturing(capturing, true);
  fake::reset_ops();
  for (const uvm::MoveKind kind : {uvm::MoveKind::prefetch, uvm::MoveKind::discard, uvm::MoveKind::offload,
                                   uvm::MoveKind::onload}) {
    uvm::MoveScope move;
    CHECK(uvm::begin_move(kCall, kind, uvm::MoveArgs::one(a, kSize), capturing, &move) == UVM_ERROR_CAPTURING);
  }
  CHECK(fake::ops().empty());
  CHECK_FALSE(fake::capture_invalidated());
  fake::set_capturing(capturing, false);
  uvm_free(a, kSize, 0, nullptr);
}
