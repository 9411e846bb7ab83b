// Ordering moves across streams (hints/order.cpp): a move waits on its stream for the last move of
// the same allocation, whatever stream that ran on, and for nothing else.
#include <vector>

#include "fixture.hpp"

namespace {
constexpr size_t kSize = 1 << 20;

// The events `stream` was made to wait for, in order.
std::vector<const void*> waits_on(cudaStream_t stream) {
  std::vector<const void*> events;
  for (const fake::Op& op : fake::ops()) {
    if (op.call == fake::OpKind::wait_event && op.stream == stream) events.push_back(op.ptr);
  }
  return events;
}

// The last event recorded on `stream`.
const void* last_recorded_on(cudaStream_t stream) {
  const void* event = nullptr;
  for (const fake::Op& op : fake::ops()) {
    if (op.call == fake::OpKind::event_record && op.stream == stream) event = op.ptr;
  }
  return event;
}
}  // namespace

TEST_CASE("a move on another stream waits for the last move of the same allocation, and only that", "[order][cuda13]") {
  FakeMachine machine;
  void* a = uvm_malloc(kSize, 0, nullptr);
  void* b = uvm_malloc(kSize, 0, nullptr);
  REQUIRE((a && b));
  const cudaStream_t first = fake::make_stream(), second = fake::make_stream();
  const uvm_range range_a{a, kSize};
  REQUIRE(uvm_offload_ranges(&range_a, 1, UVM_STRATEGY_STAGED, first) == UVM_OK);
  const void* offload_done = last_recorded_on(first);
  REQUIRE(offload_done != nullptr);

  fake::reset_ops();
  REQUIRE(uvm_prefetch(b, kSize, UVM_LOCATION_CPU, second) == UVM_OK);
  CHECK(waits_on(second).empty());  // b was never moved: nothing to wait for

  fake::reset_ops();
  REQUIRE(uvm_onload_ranges(&range_a, 1, second) == UVM_OK);
  const auto waited = waits_on(second);
  REQUIRE(!waited.empty());
  CHECK(waited.front() == offload_done);  // before anything else on `second`
  const auto ops = fake::ops();
  for (const fake::Op& op : ops) {
    if (op.call == fake::OpKind::wait_event && op.ptr == offload_done) break;
    CHECK(op.stream != second);  // nothing issued on `second` before the wait
  }

  // The onload's end is now a's last move: a discard on the first stream waits for it.
  const void* onload_done = last_recorded_on(second);
  fake::reset_ops();
  REQUIRE(uvm_discard_ranges(&range_a, 1, first) == UVM_OK);
  CHECK(waits_on(first) == std::vector<const void*>{onload_done});
  uvm_free(a, kSize, 0, nullptr);
  uvm_free(b, kSize, 0, nullptr);
}
