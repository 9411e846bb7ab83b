// Offload, onload and discard of releasable allocations against the fake driver, whose unmapped
// memory faults and whose fresh physical memory is filled with kFreshPhysical: the physical memory
// goes back only when every byte is off the device, comes back before the copies, and no byte is
// lost on the way — neighbours, partial moves and failures included.
#include <algorithm>
#include <atomic>
#include <string>
#include <thread>
#include <vector>

#include "fixture.hpp"

namespace {
constexpr size_t kSize = size_t{1} << 20;
}  // namespace

TEST_CASE("offloading all of a releasable allocation gives its memory back; onload restores it", "[release]") {
  FakeMachine machine;
  Releasable a;
  cudaStream_t stream = fake::make_stream();
  const uvm_range whole = a.whole();
  fake::reset_ops();
  REQUIRE(uvm_offload_ranges(&whole, 1, UVM_STRATEGY_AUTO, stream) == UVM_OK);
  CHECK(FakeMachine::ops_named(fake::OpKind::copy_to_host).size() == 1);
  CHECK(FakeMachine::ops_named(fake::OpKind::discard).empty());  // no driver discard: the memory is released
  CHECK(FakeMachine::ops_named(fake::OpKind::prefetch).empty());
  // The copies out ran on `stream`: an event recorded there after them is waited for before the unmap.
  const auto ops = fake::ops();
  size_t copy_at = ops.size(), record_at = ops.size(), sync_at = ops.size(), unmap_at = ops.size();
  const void* event = nullptr;
  for (size_t i = 0; i < ops.size(); ++i) {
    if (ops[i].call == fake::OpKind::copy_to_host) copy_at = i;
    if (ops[i].call == fake::OpKind::event_record && ops[i].stream == stream && i > copy_at && record_at == ops.size()) {
      record_at = i;
      event = ops[i].ptr;
    }
    if (ops[i].call == fake::OpKind::event_sync && ops[i].ptr == event && event != nullptr) sync_at = i;
    if (ops[i].call == fake::OpKind::vmm_unmap) unmap_at = i;
  }
  CHECK(copy_at < record_at);
  CHECK(record_at < sync_at);
  CHECK(sync_at < unmap_at);
  CHECK(unmap_at < ops.size());
  CHECK(fake::mapped_reservations() == 0);
  const uvm_residency off = residency();
  CHECK(off.released_bytes == kSize);
  CHECK(off.staged_bytes == kSize);
  CHECK(off.device_bytes == 0);

  fake::reset_ops();
  REQUIRE(uvm_onload_ranges(&whole, 1, stream) == UVM_OK);
  CHECK(FakeMachine::ops_named(fake::OpKind::vmm_map).size() == 1);
  CHECK(FakeMachine::ops_named(fake::OpKind::prefetch).empty());  // device memory: nothing to populate
  CHECK(a.intact());
  const uvm_residency on = residency();
  CHECK(on.released_bytes == 0);
  CHECK(on.device_bytes == kSize);
  CHECK(on.staged_bytes == 0);

  // The cycle repeats, reusing the staging memory.
  REQUIRE(uvm_offload_ranges(&whole, 1, UVM_STRATEGY_STAGED, stream) == UVM_OK);
  CHECK(fake::mapped_reservations() == 0);
  REQUIRE(uvm_onload_ranges(&whole, 1, stream) == UVM_OK);
  CHECK(a.intact());
}

TEST_CASE("a partly offloaded releasable allocation keeps its memory and every other byte", "[release]") {
  FakeMachine machine;
  Releasable a;
  cudaStream_t stream = fake::make_stream();
  const uvm_range first = a.part(0, 4096), middle = a.part(8192, 12288);
  REQUIRE(uvm_offload_ranges(&first, 1, UVM_STRATEGY_AUTO, stream) == UVM_OK);
  REQUIRE(uvm_offload_ranges(&middle, 1, UVM_STRATEGY_AUTO, stream) == UVM_OK);
  CHECK(fake::mapped_reservations() == 1);
  CHECK(a.intact(4096, 8192));  // the gap between the two was never touched
  CHECK(a.intact(12288));
  CHECK(residency().released_bytes == 0);

  // Offloading the rest (overlapping what is staged) releases it: every byte is off now.
  const std::vector<uvm_range> rest = {a.part(0, 8192), a.part(12288, kSize)};
  REQUIRE(uvm_offload_ranges(rest.data(), rest.size(), UVM_STRATEGY_AUTO, stream) == UVM_OK);
  CHECK(fake::mapped_reservations() == 0);
  const uvm_range whole = a.whole();
  REQUIRE(uvm_onload_ranges(&whole, 1, stream) == UVM_OK);
  CHECK(a.intact());
}

TEST_CASE("when the copies' event cannot be waited for, the stream is waited for instead", "[release]") {
  FakeMachine machine;
  Releasable a;
  cudaStream_t stream = fake::make_stream();
  const uvm_range whole = a.whole();
  fake::fail_next("cudaEventSynchronize", cudaErrorLaunchFailure);
  fake::reset_ops();
  REQUIRE(uvm_offload_ranges(&whole, 1, UVM_STRATEGY_AUTO, stream) == UVM_OK);
  CHECK(cudaPeekAtLastError() == cudaSuccess);
  bool synced = false;
  for (const fake::Op& op : fake::ops()) {
    if (op.call == fake::OpKind::stream_sync && op.stream == stream) synced = true;
    if (op.call == fake::OpKind::vmm_unmap) CHECK(synced);
  }
  CHECK(fake::mapped_reservations() == 0);
  REQUIRE(uvm_onload_ranges(&whole, 1, stream) == UVM_OK);
  CHECK(a.intact());
}

TEST_CASE("onload maps each released allocation just before its copies", "[release]") {
  FakeMachine machine;
  Releasable a(kSize, 0, 1), b(kSize, 0, 2);
  cudaStream_t stream = fake::make_stream();
  const std::vector<uvm_range> both = {a.whole(), b.whole()};
  REQUIRE(uvm_offload_ranges(both.data(), both.size(), UVM_STRATEGY_AUTO, stream) == UVM_OK);
  fake::reset_ops();
  REQUIRE(uvm_onload_ranges(both.data(), both.size(), stream) == UVM_OK);
  std::vector<fake::OpKind> order;  // a copy by the engine or by uvm's kernel (UVM_ONLOAD_COPY) counts the same
  for (const fake::Op& op : fake::ops()) {
    if (op.call == fake::OpKind::vmm_map) order.push_back(op.call);
    if (op.call == fake::OpKind::copy_to_device || op.call == fake::OpKind::sm_copy) {
      order.push_back(fake::OpKind::copy_to_device);
    }
  }
  // a's map, a's copies, then b's map: b is mapped while a's copies may still run.
  REQUIRE(order.size() >= 4);
  CHECK(order.front() == fake::OpKind::vmm_map);
  CHECK(order[1] == fake::OpKind::copy_to_device);
  CHECK(std::count(order.begin(), order.end(), fake::OpKind::vmm_map) == 2);
  CHECK(a.intact());
  CHECK(b.intact());
}

TEST_CASE("onload of part of a released allocation maps it all and keeps the rest staged", "[release]") {
  FakeMachine machine;
  Releasable a;
  cudaStream_t stream = fake::make_stream();
  const uvm_range whole = a.whole(), head = a.part(0, 65536);
  REQUIRE(uvm_offload_ranges(&whole, 1, UVM_STRATEGY_AUTO, stream) == UVM_OK);
  REQUIRE(uvm_onload_ranges(&head, 1, stream) == UVM_OK);
  CHECK(fake::mapped_reservations() == 1);
  CHECK(a.intact(0, 65536));
  CHECK(a.ptr[65536] == fake::kFreshPhysical);  // not onloaded yet: new memory, undefined bytes
  CHECK(residency().staged_bytes == kSize - 65536);
  // Offloading the head again releases the memory again, the rest's host copy untouched.
  REQUIRE(uvm_offload_ranges(&head, 1, UVM_STRATEGY_AUTO, stream) == UVM_OK);
  CHECK(fake::mapped_reservations() == 0);
  REQUIRE(uvm_onload_ranges(&whole, 1, stream) == UVM_OK);
  CHECK(a.intact());
}

TEST_CASE("releasing one allocation leaves its neighbours mapped and intact", "[release]") {
  FakeMachine machine;
  Releasable before(kSize, 0, 5), a(kSize, 0, 3), after(kSize, 0, 9);
  cudaStream_t stream = fake::make_stream();
  const uvm_range whole = a.whole();
  REQUIRE(uvm_offload_ranges(&whole, 1, UVM_STRATEGY_AUTO, stream) == UVM_OK);
  CHECK(fake::mapped_reservations() == 2);
  CHECK(before.intact());
  CHECK(after.intact());
  REQUIRE(uvm_onload_ranges(&whole, 1, stream) == UVM_OK);
  CHECK(a.intact());
}

TEST_CASE("discarding a releasable allocation releases it without a copy; onload maps it undefined", "[release]") {
  FakeMachine machine;
  Releasable a;
  cudaStream_t stream = fake::make_stream();
  const uvm_range whole = a.whole();
  fake::reset_ops();
  REQUIRE(uvm_discard_ranges(&whole, 1, stream) == UVM_OK);
  CHECK(FakeMachine::ops_named(fake::OpKind::discard).empty());
  CHECK(FakeMachine::ops_named(fake::OpKind::copy_to_host).empty());
  CHECK(fake::mapped_reservations() == 0);
  CHECK(residency().discarded_bytes == kSize);
  fake::reset_ops();
  REQUIRE(uvm_onload_ranges(&whole, 1, stream) == UVM_OK);
  CHECK(FakeMachine::ops_named(fake::OpKind::vmm_map).size() == 1);
  CHECK(FakeMachine::ops_named(fake::OpKind::copy_to_device).empty());
  CHECK(a.ptr[0] == fake::kFreshPhysical);
  CHECK(residency().device_bytes == kSize);
  // Partly discarded: the memory stays.
  a.fill();
  const uvm_range head = a.part(0, 4096);
  REQUIRE(uvm_discard_ranges(&head, 1, stream) == UVM_OK);
  CHECK(fake::mapped_reservations() == 1);
  CHECK(a.intact(4096));
}

TEST_CASE("releasable memory cannot migrate; managed and releasable ranges move in one call", "[release][cuda13]") {
  FakeMachine machine;
  Releasable a;
  cudaStream_t stream = fake::make_stream();
  const uvm_range whole = a.whole();
  fake::reset_ops();
  CHECK(uvm_offload_ranges(&whole, 1, UVM_STRATEGY_MIGRATE, stream) == UVM_ERROR_INVALID_ARGUMENT);
  CHECK(std::string(uvm_last_error()).find("UVM_STRATEGY_AUTO") != std::string::npos);
  CHECK(fake::ops().empty());
  CHECK(fake::mapped_reservations() == 1);

  auto* managed = static_cast<unsigned char*>(uvm_malloc(kSize, 0, nullptr));
  REQUIRE(managed != nullptr);
  for (size_t i = 0; i < kSize; ++i) managed[i] = static_cast<unsigned char>(i);
  const std::vector<uvm_range> both = {whole, uvm_range{managed, kSize}};
  REQUIRE(uvm_offload_ranges(both.data(), both.size(), UVM_STRATEGY_AUTO, stream) == UVM_OK);
  const auto discards = FakeMachine::ops_named(fake::OpKind::discard);
  REQUIRE(discards.size() == 1);  // the managed one only
  CHECK(discards[0].ptr == managed);
  CHECK(fake::mapped_reservations() == 0);
  REQUIRE(uvm_onload_ranges(both.data(), both.size(), stream) == UVM_OK);
  CHECK(a.intact());
  bool managed_intact = true;
  for (size_t i = 0; i < kSize; ++i) managed_intact = managed_intact && managed[i] == static_cast<unsigned char>(i);
  CHECK(managed_intact);
  uvm_free(managed, kSize, 0, nullptr);
}

TEST_CASE("an onload that cannot get memory back fails cleanly and can be retried", "[release]") {
  FakeMachine machine;
  Releasable a;
  cudaStream_t stream = fake::make_stream();
  const uvm_range whole = a.whole();
  REQUIRE(uvm_offload_ranges(&whole, 1, UVM_STRATEGY_AUTO, stream) == UVM_OK);
  fake::fail_next("cuMemCreate", cudaErrorMemoryAllocation);
  CHECK(uvm_onload_ranges(&whole, 1, stream) == UVM_ERROR_OUT_OF_MEMORY);
  CHECK(std::string(uvm_last_error()).find("cuMemCreate") != std::string::npos);
  CHECK(cudaPeekAtLastError() == cudaSuccess);
  CHECK(fake::mapped_reservations() == 0);
  CHECK(residency().staged_bytes == kSize);  // the host copy is still all there is, and kept
  REQUIRE(uvm_onload_ranges(&whole, 1, stream) == UVM_OK);
  CHECK(a.intact());
}

TEST_CASE("an offload whose stream cannot be waited for keeps the memory mapped and the data staged", "[release]") {
  FakeMachine machine;
  Releasable a;
  cudaStream_t stream = fake::make_stream();
  const uvm_range whole = a.whole();
  // The wait for the copies before the unmap: their event, and when that fails the stream.
  fake::fail_next("cudaEventSynchronize", cudaErrorLaunchFailure);
  fake::fail_next("cudaStreamSynchronize", cudaErrorLaunchFailure);
  CHECK(uvm_offload_ranges(&whole, 1, UVM_STRATEGY_AUTO, stream) == UVM_ERROR_CUDA);
  CHECK(std::string(uvm_last_error()).find("before releasing") != std::string::npos);
  CHECK(cudaPeekAtLastError() == cudaSuccess);
  CHECK(fake::mapped_reservations() == 1);
  CHECK(a.intact());
  // A second offload finds everything staged and releases it now.
  REQUIRE(uvm_offload_ranges(&whole, 1, UVM_STRATEGY_AUTO, stream) == UVM_OK);
  CHECK(fake::mapped_reservations() == 0);
  REQUIRE(uvm_onload_ranges(&whole, 1, stream) == UVM_OK);
  CHECK(a.intact());
}

TEST_CASE("freeing a released allocation frees its address range and host copy", "[release]") {
  FakeMachine machine;
  size_t staged_before = 0;
  REQUIRE(uvm_get_staging(nullptr, &staged_before) == UVM_OK);
  {
    Releasable a;
    const uvm_range whole = a.whole();
    REQUIRE(uvm_offload_ranges(&whole, 1, UVM_STRATEGY_AUTO, fake::make_stream()) == UVM_OK);
  }
  CHECK(fake::live_reservations() == 0);
  size_t staged_after = 0;
  REQUIRE(uvm_get_staging(nullptr, &staged_after) == UVM_OK);
  CHECK(staged_after == staged_before);
}

TEST_CASE("with a CUDA 12 driver releasable memory still offloads and comes back", "[cuda12][scenario]") {
  FakeMachine machine;
  Releasable a;
  cudaStream_t stream = fake::make_stream();
  const uvm_range whole = a.whole();
  REQUIRE(uvm_offload_ranges(&whole, 1, UVM_STRATEGY_STAGED, stream) == UVM_OK);
  CHECK(fake::mapped_reservations() == 0);
  REQUIRE(uvm_onload_ranges(&whole, 1, stream) == UVM_OK);
  CHECK(a.intact());
  REQUIRE(uvm_discard_ranges(&whole, 1, stream) == UVM_OK);
  CHECK(fake::mapped_reservations() == 0);
}

TEST_CASE("uvm_mem_get_info: released memory is free at once, offloaded managed memory is reclaimable", "[release][cuda13]") {
  FakeMachine machine;
  size_t free0 = 0, total = 0, reclaimable = 99;
  REQUIRE(uvm_mem_get_info(0, &free0, &total, &reclaimable) == UVM_OK);
  CHECK(total == (size_t{1} << 30));
  CHECK(reclaimable == 0);
  Releasable a;
  auto* managed = static_cast<unsigned char*>(uvm_malloc(kSize, 0, nullptr));
  REQUIRE(managed != nullptr);
  size_t free1 = 0;
  REQUIRE(uvm_mem_get_info(0, &free1, nullptr, nullptr) == UVM_OK);
  CHECK(free0 - free1 == 2 * kSize);

  const std::vector<uvm_range> both = {a.whole(), uvm_range{managed, kSize}};
  REQUIRE(uvm_offload_ranges(both.data(), both.size(), UVM_STRATEGY_AUTO, fake::make_stream()) == UVM_OK);
  size_t free2 = 0;
  REQUIRE(uvm_mem_get_info(0, &free2, nullptr, &reclaimable) == UVM_OK);
  CHECK(free2 - free1 == kSize);  // the releasable one, given back
  CHECK(reclaimable == kSize);    // the managed one, until the driver takes it back
  CHECK(uvm_mem_get_info(7, nullptr, nullptr, nullptr) == UVM_ERROR_INVALID_ARGUMENT);
  uvm_free(managed, kSize, 0, nullptr);
}

TEST_CASE("uvm_get_staged_copy hands out the host copy of staged bytes only", "[release]") {
  FakeMachine machine;
  Releasable a;
  const void* host = reinterpret_cast<const void*>(1);
  REQUIRE(uvm_get_staged_copy(a.ptr + 100, 50, &host) == UVM_OK);
  CHECK(host == nullptr);  // not offloaded
  const uvm_range whole = a.whole();
  REQUIRE(uvm_offload_ranges(&whole, 1, UVM_STRATEGY_AUTO, fake::make_stream()) == UVM_OK);
  REQUIRE(uvm_get_staged_copy(a.ptr + 100, 50, &host) == UVM_OK);
  REQUIRE(host != nullptr);
  const auto* bytes = static_cast<const unsigned char*>(host);
  bool same = true;
  for (size_t i = 0; i < 50; ++i) same = same && bytes[i] == a.expected(100 + i);
  CHECK(same);
  CHECK(uvm_get_staged_copy(a.ptr, 0, &host) == UVM_ERROR_INVALID_ARGUMENT);
  CHECK(uvm_get_staged_copy(a.ptr, kSize + 1, &host) == UVM_ERROR_INVALID_ARGUMENT);
  REQUIRE(uvm_onload_ranges(&whole, 1, fake::make_stream()) == UVM_OK);
  REQUIRE(uvm_get_staged_copy(a.ptr + 100, 50, &host) == UVM_OK);
  CHECK(host == nullptr);  // back on the device: no copy held
}

TEST_CASE("threads offloading, onloading and freeing releasable memory at once lose nothing", "[release][threads]") {
  FakeMachine machine;
  Releasable kept(kSize, 0, 5), a(kSize, 0, 3);
  const uvm_range whole = a.whole();
  std::atomic<int> failures{0};
  auto cycle = [&] {
    cudaStream_t stream = fake::make_stream();
    for (int i = 0; i < 200; ++i) {
      if (uvm_offload_ranges(&whole, 1, UVM_STRATEGY_AUTO, stream) != UVM_OK) ++failures;
      if (uvm_onload_ranges(&whole, 1, stream) != UVM_OK) ++failures;
    }
  };
  // A third thread allocates, releases and frees allocations of its own meanwhile.
  auto churn = [&] {
    for (int i = 0; i < 100; ++i) {
      Releasable other(64 << 10, 0, 7);
      const uvm_range mine = other.whole();
      if (uvm_offload_ranges(&mine, 1, UVM_STRATEGY_AUTO, fake::make_stream()) != UVM_OK) ++failures;
    }
  };
  std::thread t1(cycle), t2(cycle), t3(churn);
  t1.join();
  t2.join();
  t3.join();
  CHECK(failures == 0);
  REQUIRE(uvm_onload_ranges(&whole, 1, fake::make_stream()) == UVM_OK);
  CHECK(a.intact());
  CHECK(kept.intact());
  CHECK(fake::mapped_reservations() == 2);
}

TEST_CASE("an offload of a releasable allocation paused without a copy moves nothing and reads no unmapped byte",
          "[release]") {
  // Found by the model (test_model.cpp, seed 0): memory_saver's pause without a CPU backup discards
  // and gives the memory back; an offload after it copied from the unmapped addresses (on a GPU, a
  // read of unmapped memory; here cudaErrorInvalidValue).
  FakeMachine machine;
  Releasable a;
  const uvm_range whole = a.whole(), part = a.part(4096, 8192);
  REQUIRE(uvm_discard_ranges(&whole, 1, nullptr) == UVM_OK);
  CHECK(fake::mapped_reservations() == 0);
  fake::reset_ops();
  CHECK(uvm_offload_ranges(&whole, 1, UVM_STRATEGY_AUTO, nullptr) == UVM_OK);
  CHECK(uvm_offload_ranges(&part, 1, UVM_STRATEGY_STAGED, nullptr) == UVM_OK);
  CHECK(FakeMachine::ops_named(fake::OpKind::copy_to_host).empty());
  CHECK(residency().staged_bytes == 0);
  REQUIRE(uvm_onload_ranges(&whole, 1, nullptr) == UVM_OK);  // resume: mapped again, contents undefined
  CHECK(fake::mapped_reservations() == 1);
  a.fill();
  CHECK(a.intact());
}
