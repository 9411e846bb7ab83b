// The staging store (offload/media/staging.cpp): pinned memory lent by leases, allocated and freed with
// no lock held that other calls need.
#include <atomic>
#include <chrono>
#include <cstring>
#include <future>
#include <thread>
#include <vector>

#include "../../alloc/moves.hpp"
#include "../../offload/media/staging.hpp"
#include "fixture.hpp"
#include "threads.hpp"

namespace {
constexpr size_t kMiB = size_t{1} << 20;
const uvm::Call kCall = uvm::Call::of("test");

uvm::Span span_at(uintptr_t begin, size_t size) { return uvm::Span{begin, begin + size}; }

// Runs `body` on another thread and says whether it finished within `seconds`; waits for it
// either way, after `unblock` (which lets a held call go on). A call that waits for the held one
// never finishes before `unblock`, so any bound tells the two apart: a generous one, so that a
// loaded machine (TSan builds, CI) cannot fail a call that does not wait.
template <typename Body, typename Unblock>
bool finishes_in_time(Body body, Unblock unblock, int seconds = 30) {
  auto done = std::async(std::launch::async, body);
  const bool in_time = done.wait_for(std::chrono::seconds(seconds)) == std::future_status::ready;
  unblock();
  done.wait();
  return in_time;
}
// The reservation's parts in the caller's vectors (leases replaced, waits added to `reads`).
void reserve_into(uvm::Staging& store, const std::vector<uvm::Span>& spans, std::vector<uvm::Span>* placed,
                  std::vector<std::shared_ptr<char>>* leases, std::vector<uvm::EventRef>* reads) {
  leases->clear();  // a lease dropped here gives its bytes back before the reservation
  uvm::Reservation reserved = store.reserve_prefix(spans);
  *placed = reserved.spans;
  *leases = reserved.leases;
  reads->insert(reads->end(), reserved.reused.begin(), reserved.reused.end());
}
}  // namespace

TEST_CASE("the store lends only pinned room, gives bytes back with the last lease, frees only empty blocks", "[staging]") {
  FakeMachine machine;
  uvm::Staging store;
  const std::vector<uvm::Span> spans = {span_at(0x10000000, 100 * kMiB), span_at(0x40000000, 100 * kMiB)};
  std::vector<uvm::Span> placed;
  std::vector<std::shared_ptr<char>> leases;
  std::vector<uvm::EventRef> reads;
  reserve_into(store, spans, &placed, &leases, &reads);
  CHECK(placed.empty());  // no room yet: nothing lent, nothing allocated
  CHECK(store.capacity_bytes() == 0);
  REQUIRE(store.ensure_capacity(kCall, spans) == UVM_OK);
  CHECK(store.capacity_bytes() == 256 * kMiB);  // the smallest block
  reserve_into(store, spans, &placed, &leases, &reads);
  REQUIRE(placed.size() == 2);
  REQUIRE(leases.size() == 2);
  char* first = leases[0].get();
  char* second = leases[1].get();
  CHECK((second >= first + 100 * kMiB || first >= second + 100 * kMiB));  // disjoint

  // A block with a lease out is kept, and does not rewind: the next reservation gets other bytes.
  const size_t capacity = store.capacity_bytes();
  REQUIRE(store.free_unused(kCall) == UVM_OK);
  CHECK(store.capacity_bytes() == capacity);
  std::shared_ptr<char> kept = leases[0];  // a piece still staged in the first lease
  leases.clear();
  std::vector<uvm::Span> again;
  std::vector<std::shared_ptr<char>> later;
  reserve_into(store, {span_at(0x70000000, kMiB)}, &again, &later, &reads);
  REQUIRE(later.size() == 1);
  CHECK(later[0].get() != first);
  later.clear();

  // Once the last lease is dropped the block holds nothing: it rewinds, and free_unused frees it.
  kept.reset();
  reserve_into(store, {span_at(0x70000000, kMiB)}, &again, &later, &reads);
  REQUIRE(later.size() == 1);
  CHECK(later[0].get() == std::min(first, second));
  later.clear();
  REQUIRE(store.free_unused(kCall) == UVM_OK);
  CHECK(store.capacity_bytes() == 0);
}

TEST_CASE("a rewound block makes its next writer wait for every use noted on it", "[staging]") {
  FakeMachine machine;
  uvm::Staging store;
  const std::vector<uvm::Span> spans = {span_at(0x10000000, 200 * kMiB)};
  REQUIRE(store.ensure_capacity(kCall, spans) == UVM_OK);
  std::vector<uvm::Span> placed;
  std::vector<std::shared_ptr<char>> first, second;
  std::vector<uvm::EventRef> reads;
  reserve_into(store, spans, &placed, &first, &reads);
  REQUIRE(first.size() == 1);
  CHECK(reads.empty());
  reserve_into(store, spans, &placed, &second, &reads);
  CHECK(second.empty());  // 256 MiB hold one 200 MiB span, not two
  fake::set_events_pending(true);  // the copy is still running
  const uvm::EventRef copy = uvm::try_record(fake::make_stream());
  fake::set_events_pending(false);
  REQUIRE(copy);
  store.note_use({first[0].get()}, copy);  // a copy into the bytes, still running when they go back
  char* bytes = first[0].get();
  first.clear();
  reserve_into(store, spans, &placed, &second, &reads);
  REQUIRE(second.size() == 1);
  CHECK(second[0].get() == bytes);  // the block rewound: the same bytes again...
  REQUIRE(reads.size() == 1);
  CHECK(reads[0] == copy);  // ...once the copy that used them is done
  second.clear();
  REQUIRE(cudaEventSynchronize(copy->handle) == cudaSuccess);
  REQUIRE(store.free_unused(kCall) == UVM_OK);
}

TEST_CASE("freeing pinned staging memory holds up no free on another thread", "[staging][threads]") {
  FakeMachine machine;
  REQUIRE(uvm_release_staging() == UVM_OK);
  REQUIRE(uvm_reserve_staging(kMiB) == UVM_OK);  // a block that holds nothing
  void* other = uvm_malloc(kMiB, 0, nullptr);
  REQUIRE(other != nullptr);
  fake::hold_next("cudaFreeHost");
  uvm_status released = UVM_ERROR_INTERNAL;  // Catch2 assertions are not thread-safe: checked after the join
  TestThread releaser([&] { released = uvm_release_staging(); });
  const bool held = fake::wait_until_held();
  const bool in_time = finishes_in_time([&] { uvm_free(other, kMiB, 0, nullptr); }, [] { fake::release_held(); });
  releaser.join();
  CHECK(released == UVM_OK);
  CHECK(held);
  CHECK(in_time);
  CHECK(fake::pinned_blocks() == 0);
}

TEST_CASE("offloads that need room pin it with no lock held, one block each when one cannot hold both",
          "[staging][threads][cuda13]") {
  FakeMachine machine;
  REQUIRE(uvm_release_staging() == UVM_OK);
  const size_t size = 200 * kMiB;  // one 256 MiB block holds one of them, not two
  auto* a = static_cast<unsigned char*>(uvm_malloc(size, 0, nullptr));
  auto* b = static_cast<unsigned char*>(uvm_malloc(size, 0, nullptr));
  void* other = uvm_malloc(kMiB, 0, nullptr);
  REQUIRE((a && b && other));
  std::memset(a, 0x11, size);
  std::memset(b, 0x22, size);
  const uvm_range range_a{a, size}, range_b{b, size};
  const cudaStream_t stream_a = fake::make_stream(), stream_b = fake::make_stream();

  // The first offload to find no room lets go of the moves lock and pins a block: held there, a
  // free on another thread still goes through. The other offload finds that block too small for
  // both and pins one of its own, after the first (growers take turns).
  const size_t blocks_before = fake::pinned_blocks();
  fake::hold_next("cudaHostAlloc");
  uvm_status offloaded_a = UVM_ERROR_INTERNAL, offloaded_b = UVM_ERROR_INTERNAL;  // checked after the joins
  TestThread offload_a([&] { offloaded_a = uvm_offload_ranges(&range_a, 1, UVM_STRATEGY_STAGED, stream_a); });
  TestThread offload_b([&] { offloaded_b = uvm_offload_ranges(&range_b, 1, UVM_STRATEGY_STAGED, stream_b); });
  const bool held = fake::wait_until_held();
  const bool in_time = finishes_in_time([&] { uvm_free(other, kMiB, 0, nullptr); }, [] { fake::release_held(); });
  offload_a.join();
  offload_b.join();
  CHECK(offloaded_a == UVM_OK);
  CHECK(offloaded_b == UVM_OK);
  CHECK(held);
  CHECK(in_time);
  CHECK(fake::pinned_blocks() == blocks_before + 2);
  REQUIRE(uvm_onload_ranges(&range_a, 1, stream_a) == UVM_OK);
  REQUIRE(uvm_onload_ranges(&range_b, 1, stream_b) == UVM_OK);
  size_t wrong = 0;
  for (size_t i = 0; i < size; ++i) wrong += (a[i] != 0x11) + (b[i] != 0x22);
  CHECK(wrong == 0);
  uvm_free(a, size, 0, nullptr);
  uvm_free(b, size, 0, nullptr);
  CHECK(uvm_release_staging() == UVM_OK);
}

TEST_CASE("release_staging does not take the room an offload made before the offload reserves it",
          "[staging][threads][cuda13]") {
  FakeMachine machine;
  REQUIRE(uvm_release_staging() == UVM_OK);
  const size_t blocks_before = fake::pinned_blocks();
  auto* a = static_cast<unsigned char*>(uvm_malloc(kMiB, 0, nullptr));
  REQUIRE(a != nullptr);
  std::memset(a, 0x33, kMiB);
  const uvm_range range{a, kMiB};
  fake::reset_ops();
  // The offload pins its block with the moves lock let go; the test takes the lock meanwhile, so
  // that the offload, its block pinned, waits for the lock before it reserves the room.
  fake::hold_next("cudaHostAlloc");
  uvm_status offloaded = UVM_ERROR_INTERNAL;  // Catch2 assertions are not thread-safe: checked after the join
  std::atomic<pid_t> offload_id{0};
  TestThread offload([&] {
    offload_id = threads::this_id();
    offloaded = uvm_offload_ranges(&range, 1, UVM_STRATEGY_STAGED, nullptr);
  });
  REQUIRE(fake::wait_until_held());
  auto moves = uvm::lock_moves();
  fake::release_held();
  for (int i = 0; i < 500 && fake::pinned_blocks() == blocks_before; ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  const bool parked = threads::wait_until_parked(offload_id);  // at the moves lock the test holds
  const bool grew = fake::pinned_blocks() == blocks_before + 1;
  CHECK(uvm_release_staging() == UVM_OK);  // before the offload could reserve: frees nothing
  const size_t blocks_after_release = fake::pinned_blocks();
  moves.unlock();
  offload.join();
  CHECK(offloaded == UVM_OK);
  CHECK(parked);
  CHECK(grew);
  CHECK(blocks_after_release == blocks_before + 1);
  CHECK(FakeMachine::pinnings() == 1);  // no second pinning: the room it made was there to reserve
  REQUIRE(uvm_onload_ranges(&range, 1, nullptr) == UVM_OK);
  size_t wrong = 0;
  for (size_t i = 0; i < kMiB; ++i) wrong += a[i] != 0x33;
  CHECK(wrong == 0);
  uvm_free(a, kMiB, 0, nullptr);
  CHECK(uvm_release_staging() == UVM_OK);
  CHECK(fake::pinned_blocks() == blocks_before);
}

TEST_CASE("uvm_release_staging_async returns while uvm's thread frees; a block emptied meanwhile goes too",
          "[staging][threads]") {
  FakeMachine machine;
  REQUIRE(uvm_release_staging() == UVM_OK);
  uvm_staging_info info{};
  REQUIRE(uvm_get_staging_info(&info) == UVM_OK);
  const char* unpin = info.configured_kind == UVM_PINNED_HOST_ALLOC ? "cudaFreeHost" : "cudaHostUnregister";
  REQUIRE(uvm_reserve_staging(kMiB) == UVM_OK);  // a block that holds nothing
  REQUIRE(fake::pinned_blocks() == 1);
  fake::hold_next(unpin);
  // Returns with the free held in the driver on uvm's thread.
  CHECK(finishes_in_time([] { CHECK(uvm_release_staging_async() == UVM_OK); }, [] {}));
  REQUIRE(fake::wait_until_held());
  CHECK(fake::pinned_blocks() == 1);
  REQUIRE(uvm_reserve_staging(2 * kMiB) == UVM_OK);  // a second empty block, made while the first is freed
  CHECK(uvm_release_staging_async() == UVM_OK);      // asks the running thread for one more round
  fake::release_held();
  bool freed = false;
  for (int i = 0; i < 500 && !freed; ++i) {  // without a uvm_release_staging, which would free it itself
    freed = fake::pinned_blocks() == 0;
    if (!freed) std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  CHECK(freed);
  CHECK(uvm_release_staging() == UVM_OK);  // waits for the thread, if it still ran
  CHECK(cudaPeekAtLastError() == cudaSuccess);
}
