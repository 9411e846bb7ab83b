// uvm_offload_ranges / uvm_onload_ranges against the fake runtime, which really copies bytes and
// scribbles over discarded ones: data survives every strategy, calls are coalesced, staging memory
// is reused, and failures are clean.
#include <atomic>
#include <chrono>
#include <cstring>
#include <memory>
#include <numeric>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include "../../offload/media/staging.hpp"
#include "fixture.hpp"
#include "threads.hpp"

namespace {
constexpr size_t kSize = 1 << 20;
constexpr size_t kSlabSlot = size_t{2} << 20;  // served from a slab (alloc/slabs.hpp)

struct Buffer {
  explicit Buffer(size_t size = kSize, int device = 0) : size(size), device(device) {
    ptr = static_cast<unsigned char*>(uvm_malloc(size, device, nullptr));
    REQUIRE(ptr != nullptr);
    for (size_t i = 0; i < size; ++i) ptr[i] = static_cast<unsigned char>(i * 7 + 3);
  }
  ~Buffer() { uvm_free(ptr, size, device, nullptr); }
  bool intact(size_t from = 0, size_t to = 0) const {
    for (size_t i = from; i < (to ? to : size); ++i) {
      if (ptr[i] != static_cast<unsigned char>(i * 7 + 3)) return false;
    }
    return true;
  }
  uvm_range whole() const { return uvm_range{ptr, size}; }
  unsigned char* ptr;
  size_t size;
  int device;
};

// Tensors of one allocation packed end to end, as PyTorch packs tensors whose sizes are multiples
// of its 512-byte block (tensors with gaps between them: test_offload_safety.cpp).
std::vector<uvm_range> tensors_in(const Buffer& b, size_t count) {
  std::vector<uvm_range> ranges;
  const size_t stride = b.size / count;
  for (size_t i = 0; i < count; ++i) ranges.push_back(uvm_range{b.ptr + i * stride, stride});
  return ranges;
}

// The staging memory held once the free an offload asked for in the background has run (waited
// for, not polled).
size_t staging_held_after_background_free() {
  uvm::staging().wait_for_background_free();
  size_t held = 0;
  REQUIRE(uvm_get_staging(&held, nullptr) == UVM_OK);
  return held;
}

// A small tensor and a big one staged together as one block of three pinning steps, and brought
// back: an offload of the small one alone then leaves the block's last two steps unused.
struct ThreeSteps {
  static constexpr size_t kStep = size_t{256} << 20;
  Buffer small{size_t{10} << 20};
  Buffer big{2 * kStep};
  const uvm_range both[2] = {small.whole(), big.whole()};
  cudaStream_t stream = fake::make_stream();
  ThreeSteps() {
    REQUIRE(uvm_release_staging() == UVM_OK);
    REQUIRE(uvm_offload_ranges(both, 2, UVM_STRATEGY_STAGED, stream) == UVM_OK);
    REQUIRE(uvm_onload_ranges(both, 2, stream) == UVM_OK);
  }
};

}  // namespace

TEST_CASE("staged offload copies out and discards; onload restores the bytes", "[offload][cuda13]") {
  FakeMachine machine;
  Buffer b;
  cudaStream_t stream = fake::make_stream();
  const auto ranges = tensors_in(b, 64);

  REQUIRE(uvm_offload_ranges(ranges.data(), ranges.size(), UVM_STRATEGY_STAGED, stream) == UVM_OK);
  // 64 touching tensors: one copy and one discard.
  CHECK(FakeMachine::ops_named(fake::OpKind::copy_to_host).size() == 1);
  const auto discards = FakeMachine::ops_named(fake::OpKind::discard);
  REQUIRE(discards.size() == 1);
  CHECK(discards[0].stream == stream);
  CHECK_FALSE(b.intact());  // discarded: the fake scribbles over it
  CHECK(residency().staged_bytes == kSize);
  CHECK(residency().host_bytes == kSize);
  size_t capacity = 0, staged = 0;
  REQUIRE(uvm_get_staging(&capacity, &staged) == UVM_OK);
  CHECK(staged == kSize);
  CHECK(capacity >= staged);

  REQUIRE(uvm_onload_ranges(ranges.data(), ranges.size(), stream) == UVM_OK);
  CHECK(b.intact());
  CHECK(residency().device_bytes == kSize);
  REQUIRE(uvm_get_staging(nullptr, &staged) == UVM_OK);
  CHECK(staged == 0);
  // Each chunk is prefetched before its copy (populate) and after it (undo the discard), on the same
  // worker stream; the worker streams join the caller's stream.
  const auto copies = FakeMachine::ops_named(fake::OpKind::copy_to_device);
  REQUIRE(copies.size() == 1);
  CHECK(copies[0].stream != stream);
  const auto prefetches = FakeMachine::ops_named(fake::OpKind::prefetch);
  REQUIRE(prefetches.size() == 2);
  for (const auto& prefetch : prefetches) {
    CHECK(prefetch.location == 0);
    CHECK(prefetch.stream == copies[0].stream);
  }
  std::vector<fake::OpKind> on_worker;
  for (const fake::Op& op : fake::ops()) {
    if (op.stream == copies[0].stream && (op.call == fake::OpKind::prefetch || op.call == fake::OpKind::copy_to_device)) on_worker.push_back(op.call);
  }
  CHECK(on_worker == std::vector<fake::OpKind>{fake::OpKind::prefetch, fake::OpKind::copy_to_device,
                                              fake::OpKind::prefetch});
  bool caller_waits = false;
  for (const auto& op : FakeMachine::ops_named(fake::OpKind::wait_event)) caller_waits |= op.stream == stream;
  CHECK(caller_waits);
}

TEST_CASE("many cycles of every strategy keep the data and reuse the staging memory", "[offload][cuda13]") {
  FakeMachine machine;
  Buffer a, b(3 * kSize + 5);
  const std::vector<uvm_range> ranges = {a.whole(), b.whole()};
  cudaStream_t stream = fake::make_stream();
  REQUIRE(uvm_release_staging() == UVM_OK);  // start with none, so the count below is exact
  for (uvm_strategy strategy : {UVM_STRATEGY_AUTO, UVM_STRATEGY_MIGRATE, UVM_STRATEGY_STAGED}) {
    for (int cycle = 0; cycle < 50; ++cycle) {
      REQUIRE(uvm_offload_ranges(ranges.data(), 2, strategy, stream) == UVM_OK);
      REQUIRE(uvm_onload_ranges(ranges.data(), 2, stream) == UVM_OK);
    }
    CHECK(a.intact());
    CHECK(b.intact());
  }
  CHECK(FakeMachine::pinnings() == 1);  // one block, reused 100 times
}

TEST_CASE("a staged onload leaves no page discardable: a migrate cycle afterwards keeps the data", "[offload][cuda13]") {
  // The fake drops bytes a prefetch to the CPU finds still marked discarded, as the driver does
  // after a copy into discarded pages that no prefetch followed.
  FakeMachine machine;
  Buffer a, b(3 * kSize + 5);
  const std::vector<uvm_range> ranges = {a.whole(), b.whole()};
  cudaStream_t stream = fake::make_stream();
  REQUIRE(uvm_offload_ranges(ranges.data(), 2, UVM_STRATEGY_STAGED, stream) == UVM_OK);
  REQUIRE(uvm_onload_ranges(ranges.data(), 2, stream) == UVM_OK);
  REQUIRE(uvm_offload_ranges(ranges.data(), 2, UVM_STRATEGY_MIGRATE, stream) == UVM_OK);
  CHECK(a.intact());
  CHECK(b.intact());
  REQUIRE(uvm_onload_ranges(ranges.data(), 2, stream) == UVM_OK);
  CHECK(a.intact());
  CHECK(b.intact());
}

TEST_CASE("many small allocations come back whole, every byte populated after its copy",
          "[offload][small][cuda13]") {
  // PyTorch's small tensors: one allocation per 2 MiB segment. Half of each is offloaded; the
  // other half is written meanwhile. Then a migrate cycle: a byte whose copy no prefetch followed
  // would still count as discarded, and the fake (like the driver) drops it on the way to the CPU.
  FakeMachine machine;
  std::vector<std::unique_ptr<Buffer>> segments;
  std::vector<uvm_range> moved;
  for (int i = 0; i < 96; ++i) {
    segments.push_back(std::make_unique<Buffer>(64 << 10));
    moved.push_back(uvm_range{segments.back()->ptr, size_t{32} << 10});
  }
  cudaStream_t stream = fake::make_stream();
  REQUIRE(uvm_offload_ranges(moved.data(), moved.size(), UVM_STRATEGY_STAGED, stream) == UVM_OK);
  const size_t half = 32 << 10;
  const auto kept_value = [](size_t i) { return static_cast<unsigned char>(i * 11 + 5); };
  for (auto& segment : segments) {
    for (size_t i = half; i < segment->size; ++i) segment->ptr[i] = kept_value(i);
  }
  const auto all_right = [&] {
    for (auto& segment : segments) {
      if (!segment->intact(0, half)) return false;
      for (size_t i = half; i < segment->size; ++i) {
        if (segment->ptr[i] != kept_value(i)) return false;
      }
    }
    return true;
  };
  fake::reset_ops();
  uvm_stats before{}, after{};
  REQUIRE(uvm_get_stats(0, &before) == UVM_OK);
  REQUIRE(uvm_onload_ranges(moved.data(), moved.size(), stream) == UVM_OK);
  REQUIRE(uvm_get_stats(0, &after) == UVM_OK);
  CHECK(all_right());
  const auto prefetches = FakeMachine::ops_named(fake::OpKind::prefetch);
  CHECK(prefetches.size() == 2 * moved.size());  // each offloaded half, before and after its copy
  for (const fake::Op& op : prefetches) CHECK(op.size == (32u << 10));
  // One chunk per allocation: the driver's cost is per range, batched or not (docs/performance.md).
  CHECK(after.prefetch_calls - before.prefetch_calls == 2 * moved.size());
  REQUIRE(uvm_offload_ranges(moved.data(), moved.size(), UVM_STRATEGY_MIGRATE, stream) == UVM_OK);
  CHECK(all_right());
  REQUIRE(uvm_onload_ranges(moved.data(), moved.size(), stream) == UVM_OK);
  CHECK(all_right());
}

TEST_CASE("a slot freed while staged or discarded is never handed out again", "[offload][slabs][cuda13]") {
  // A copy into a page the driver counts as discarded leaves it discardable: a next owner that
  // copied its data in could lose it to a later migration. Such a slot waits for its slab's cudaFree.
  FakeMachine machine;
  void* keep = uvm_malloc(kSlabSlot, 0, nullptr);  // holds the slab
  void* staged = uvm_malloc(kSlabSlot, 0, nullptr);
  void* discarded = uvm_malloc(kSlabSlot, 0, nullptr);
  void* migrated = uvm_malloc(kSlabSlot, 0, nullptr);
  cudaStream_t stream = fake::make_stream();
  const uvm_range staged_range{staged, 4096}, migrated_range{migrated, kSlabSlot};
  REQUIRE(uvm_offload_ranges(&staged_range, 1, UVM_STRATEGY_STAGED, stream) == UVM_OK);
  REQUIRE(uvm_discard(discarded, 4096, stream) == UVM_OK);
  REQUIRE(uvm_offload_ranges(&migrated_range, 1, UVM_STRATEGY_MIGRATE, stream) == UVM_OK);
  for (void* p : {staged, discarded, migrated}) uvm_free(p, kSlabSlot, 0, nullptr);
  CHECK(uvm_last_status() == UVM_OK);
  std::set<void*> handed;
  std::vector<void*> fresh;
  for (int i = 0; i < 40; ++i) {
    fresh.push_back(uvm_malloc(kSlabSlot, 0, nullptr));
    handed.insert(fresh.back());
  }
  CHECK(handed.count(staged) == 0);
  CHECK(handed.count(discarded) == 0);
  CHECK(handed.count(migrated) == 0);  // counted off the device too: uvm keeps to the safe side
  for (void* p : fresh) uvm_free(p, kSlabSlot, 0, nullptr);
  fake::reset_ops();
  uvm_free(keep, kSlabSlot, 0, nullptr);
  CHECK(FakeMachine::ops_named(fake::OpKind::free).size() == 1);  // the last slot in use: the slab goes, retired slots too
  REQUIRE(uvm_release_staging() == UVM_OK);
}

TEST_CASE("neighbouring slots of a slab come back with one populate; a kept tensor stays as written",
          "[offload][slabs][cuda13]") {
  // 40 slots (a full slab of 32 and 8 of the next), each four 512 KiB tensors, as PyTorch packs
  // them; all are offloaded but the third tensor of slot 5, which the program writes meanwhile.
  FakeMachine machine;
  constexpr size_t kTensor = kSlabSlot / 4;
  std::vector<unsigned char*> slots;
  for (int i = 0; i < 40; ++i) {
    slots.push_back(static_cast<unsigned char*>(uvm_malloc(kSlabSlot, 0, nullptr)));
    REQUIRE(slots.back() != nullptr);
    for (size_t b = 0; b < kSlabSlot; ++b) slots.back()[b] = static_cast<unsigned char>(b * 7 + i);
  }
  const uvm_range kept{slots[5] + 2 * kTensor, kTensor};
  std::vector<uvm_range> moved;
  for (unsigned char* slot : slots) {
    for (size_t k = 0; k < 4; ++k) {
      if (slot + k * kTensor != kept.ptr) moved.push_back(uvm_range{slot + k * kTensor, kTensor});
    }
  }
  const auto right = [&] {
    for (size_t i = 0; i < slots.size(); ++i) {
      for (size_t b = 0; b < kSlabSlot; ++b) {
        const bool in_kept = slots[i] + b >= kept.ptr && slots[i] + b < static_cast<const unsigned char*>(kept.ptr) + kTensor;
        if (slots[i][b] != static_cast<unsigned char>(in_kept ? b * 3 + 1 : b * 7 + i)) return false;
      }
    }
    return true;
  };
  cudaStream_t stream = fake::make_stream();
  REQUIRE(uvm_release_staging() == UVM_OK);  // one new block holds it all
  fake::reset_ops();
  REQUIRE(uvm_offload_ranges(moved.data(), moved.size(), UVM_STRATEGY_STAGED, stream) == UVM_OK);
  // Pieces that follow each other on the device, in one slab, and in staging go as one copy: up to
  // the kept tensor, after it, and the second slab.
  CHECK(FakeMachine::ops_named(fake::OpKind::copy_to_host).size() == 3);
  for (size_t b = 2 * kTensor; b < 3 * kTensor; ++b) slots[5][b] = static_cast<unsigned char>(b * 3 + 1);
  fake::reset_ops();
  REQUIRE(uvm_onload_ranges(moved.data(), moved.size(), stream) == UVM_OK);
  CHECK(right());
  CHECK(FakeMachine::ops_named(fake::OpKind::copy_to_device).size() == 3);  // one a chunk
  // Three chunks: the first slab up to the kept tensor, the rest of it, and the second slab; each
  // prefetched before and after its copies (one range a slot would be 80 prefetches).
  const auto prefetches = FakeMachine::ops_named(fake::OpKind::prefetch);
  CHECK(prefetches.size() == 6);
  const auto first_slab = reinterpret_cast<uintptr_t>(slots[0]);
  const auto kept_begin = reinterpret_cast<uintptr_t>(kept.ptr);
  for (const fake::Op& op : prefetches) {
    const auto begin = reinterpret_cast<uintptr_t>(op.ptr);
    const bool in_first = begin >= first_slab && begin < first_slab + 32 * kSlabSlot;
    if (in_first) CHECK(begin + op.size <= first_slab + 32 * kSlabSlot);  // never across slabs
    CHECK((begin + op.size <= kept_begin || begin >= kept_begin + kTensor));  // never the kept tensor
  }
  // A migrate cycle after: no page the copies wrote may still count as discarded.
  REQUIRE(uvm_offload_ranges(moved.data(), moved.size(), UVM_STRATEGY_MIGRATE, stream) == UVM_OK);
  REQUIRE(uvm_onload_ranges(moved.data(), moved.size(), stream) == UVM_OK);
  CHECK(right());
  for (unsigned char* slot : slots) uvm_free(slot, kSlabSlot, 0, nullptr);
  CHECK(uvm_last_status() == UVM_OK);
  REQUIRE(uvm_release_staging() == UVM_OK);
}

TEST_CASE("migrate offload prefetches to the CPU; auto stages where discard works", "[offload][cuda13]") {
  FakeMachine machine;
  Buffer b;
  const uvm_range r = b.whole();
  REQUIRE(uvm_offload_ranges(&r, 1, UVM_STRATEGY_MIGRATE, nullptr) == UVM_OK);
  const auto prefetches = FakeMachine::ops_named(fake::OpKind::prefetch);
  REQUIRE(prefetches.size() == 1);
  CHECK(prefetches[0].location == -1);
  CHECK(FakeMachine::ops_named(fake::OpKind::discard).empty());
  CHECK(residency().host_bytes == kSize);
  CHECK(residency().staged_bytes == 0);
  // Offloading again moves nothing new for staged bytes, and onload prefetches migrated ones back.
  REQUIRE(uvm_onload_ranges(&r, 1, nullptr) == UVM_OK);
  CHECK(FakeMachine::ops_named(fake::OpKind::prefetch).back().location == 0);
  REQUIRE(uvm_offload_ranges(&r, 1, UVM_STRATEGY_AUTO, nullptr) == UVM_OK);
  CHECK(FakeMachine::ops_named(fake::OpKind::discard).size() == 1);
  REQUIRE(uvm_offload_ranges(&r, 1, UVM_STRATEGY_AUTO, nullptr) == UVM_OK);
  CHECK(FakeMachine::ops_named(fake::OpKind::copy_to_host).size() == 1);  // already staged: skipped
  REQUIRE(uvm_onload_ranges(&r, 1, nullptr) == UVM_OK);
  CHECK(b.intact());
}

TEST_CASE("onload of part of a staged range keeps the rest staged", "[offload][cuda13]") {
  FakeMachine machine;
  Buffer b;
  const uvm_range whole = b.whole();
  REQUIRE(uvm_offload_ranges(&whole, 1, UVM_STRATEGY_STAGED, nullptr) == UVM_OK);
  const uvm_range middle{b.ptr + 1000, 5000};
  REQUIRE(uvm_onload_ranges(&middle, 1, nullptr) == UVM_OK);
  CHECK(b.intact(1000, 6000));
  CHECK_FALSE(b.intact(0, 1000));
  CHECK(residency().staged_bytes == kSize - 5000);
  REQUIRE(uvm_onload_ranges(&whole, 1, nullptr) == UVM_OK);
  CHECK(b.intact());
  CHECK(residency().staged_bytes == 0);
}

TEST_CASE("discard and free drop staged copies", "[offload][cuda13]") {
  FakeMachine machine;
  size_t staged = 0;
  {
    Buffer b;
    const uvm_range r = b.whole();
    REQUIRE(uvm_offload_ranges(&r, 1, UVM_STRATEGY_STAGED, nullptr) == UVM_OK);
    REQUIRE(uvm_discard_ranges(&r, 1, nullptr) == UVM_OK);
    REQUIRE(uvm_get_staging(nullptr, &staged) == UVM_OK);
    CHECK(staged == 0);
    CHECK(residency().discarded_bytes == kSize);
    REQUIRE(uvm_offload_ranges(&r, 1, UVM_STRATEGY_STAGED, nullptr) == UVM_OK);
  }  // freed while staged
  REQUIRE(uvm_get_staging(nullptr, &staged) == UVM_OK);
  CHECK(staged == 0);
  REQUIRE(uvm_release_staging() == UVM_OK);
  size_t capacity = 1;
  REQUIRE(uvm_get_staging(&capacity, nullptr) == UVM_OK);
  CHECK(capacity == 0);
  CHECK(fake::pinned_blocks() == 0);
}

TEST_CASE("offload and onload refuse what they cannot do, leaving the data in place", "[offload]") {
  FakeMachine machine;
  Buffer b;
  Buffer other(kSize, 1);
  const uvm_range r = b.whole();
  std::vector<char> host(64);
  const uvm_range not_managed{host.data(), host.size()};
  CHECK(uvm_offload_ranges(&not_managed, 1, UVM_STRATEGY_AUTO, nullptr) == UVM_ERROR_NOT_MANAGED);
  CHECK_THAT(last_error(), Has("uvm_offload_ranges(count=1): range 0 of 1 is invalid"));
  CHECK(uvm_offload_ranges(&r, 1, static_cast<uvm_strategy>(7), nullptr) == UVM_ERROR_INVALID_ARGUMENT);
  CHECK_THAT(last_error(), Has("strategy 7 is not a uvm_strategy"));
  const std::vector<uvm_range> two_devices = {r, other.whole()};
  CHECK(uvm_offload_ranges(two_devices.data(), 2, UVM_STRATEGY_AUTO, nullptr) == UVM_ERROR_INVALID_ARGUMENT);
  CHECK_THAT(last_error(), Has("belong to devices 0 and 1"));
  // The message names the devices in order, whichever range (or heap address) comes first.
  const std::vector<uvm_range> reversed = {other.whole(), r};
  CHECK(uvm_offload_ranges(reversed.data(), 2, UVM_STRATEGY_AUTO, nullptr) == UVM_ERROR_INVALID_ARGUMENT);
  CHECK_THAT(last_error(), Has("belong to devices 0 and 1"));
  cudaStream_t stream = fake::make_stream();
  fake::set_capturing(stream, true);
  CHECK(uvm_offload_ranges(&r, 1, UVM_STRATEGY_STAGED, stream) == UVM_ERROR_CAPTURING);
  CHECK(uvm_onload_ranges(&r, 1, stream) == UVM_ERROR_CAPTURING);
  CHECK(b.intact());
  CHECK(residency().device_bytes == kSize);
}

TEST_CASE("a failed staged offload leaves the data in place and nothing half-staged", "[offload][cuda13]") {
  FakeMachine machine;
  Buffer b;
  const uvm_range r = b.whole();
  fake::fail_next("cudaHostRegister", cudaErrorMemoryAllocation);
  fake::fail_next("cudaHostAlloc", cudaErrorMemoryAllocation);
  CHECK(uvm_offload_ranges(&r, 1, UVM_STRATEGY_STAGED, nullptr) == UVM_ERROR_OUT_OF_MEMORY);
  CHECK_THAT(last_error(), Has("cudaHostAlloc(268435456 bytes of pinned staging memory"));
  fake::fail_next("cudaMemDiscardBatchAsync", cudaErrorInvalidValue);
  CHECK(uvm_offload_ranges(&r, 1, UVM_STRATEGY_STAGED, fake::make_stream()) == UVM_ERROR_CUDA);
  CHECK(cudaPeekAtLastError() == cudaSuccess);
  size_t staged = 1;
  REQUIRE(uvm_get_staging(nullptr, &staged) == UVM_OK);
  CHECK(staged == 0);  // nothing half-staged
  CHECK(b.intact());
  CHECK(residency().device_bytes == kSize);
}

TEST_CASE("tags select allocations for offload, discard and residency", "[offload][tags][cuda13]") {
  FakeMachine machine;
  REQUIRE(uvm_set_thread_tag("weights") == UVM_OK);
  CHECK(std::string(uvm_get_thread_tag()) == "weights");
  Buffer w1, w2;
  REQUIRE(uvm_set_thread_tag("kv_cache") == UVM_OK);
  Buffer kv;
  REQUIRE(uvm_set_thread_tag(nullptr) == UVM_OK);
  CHECK(std::string(uvm_get_thread_tag()).empty());
  Buffer plain;

  size_t count = 0;
  REQUIRE(uvm_allocation_ranges(0, "weights", nullptr, 0, &count) == UVM_OK);
  REQUIRE(count == 2);
  std::vector<uvm_range> weights(count);
  REQUIRE(uvm_allocation_ranges(0, "weights", weights.data(), weights.size(), &count) == UVM_OK);
  REQUIRE(uvm_allocation_ranges(UVM_ANY_DEVICE, "", nullptr, 0, &count) == UVM_OK);
  CHECK(count == 1);
  REQUIRE(uvm_allocation_ranges(UVM_ANY_DEVICE, "never-used", nullptr, 0, &count) == UVM_OK);
  CHECK(count == 0);
  REQUIRE(uvm_allocation_ranges(0, nullptr, nullptr, 0, &count) == UVM_OK);
  CHECK(count == 4);

  REQUIRE(uvm_offload_ranges(weights.data(), weights.size(), UVM_STRATEGY_STAGED, nullptr) == UVM_OK);
  std::vector<uvm_range> kv_ranges(1);
  REQUIRE(uvm_allocation_ranges(0, "kv_cache", kv_ranges.data(), 1, &count) == UVM_OK);
  REQUIRE(uvm_discard_ranges(kv_ranges.data(), 1, nullptr) == UVM_OK);
  CHECK(residency(0, "weights").staged_bytes == 2 * kSize);
  CHECK(residency(0, "weights").device_bytes == 0);
  CHECK(residency(0, "kv_cache").discarded_bytes == kSize);
  CHECK(residency(0, "").device_bytes == kSize);
  const uvm_residency all = residency(UVM_ANY_DEVICE);
  CHECK(all.allocations == 4);
  CHECK(all.live_bytes == 4 * kSize);
  CHECK(all.device_bytes + all.host_bytes + all.discarded_bytes == all.live_bytes);

  REQUIRE(uvm_onload_ranges(weights.data(), weights.size(), nullptr) == UVM_OK);
  CHECK(w1.intact());
  CHECK(w2.intact());
  CHECK(plain.intact());
  CHECK(uvm_tag_count() >= 2);
  bool listed = false;
  for (size_t i = 0; i < uvm_tag_count(); ++i) listed |= std::string(uvm_tag_name(i)) == "kv_cache";
  CHECK(listed);
  CHECK(uvm_tag_name(uvm_tag_count()) == nullptr);
  CHECK(uvm_tag_name(static_cast<size_t>(-1)) == nullptr);
  CHECK(uvm_set_thread_tag(std::string(UVM_TAG_MAX_LENGTH + 1, 'x').c_str()) == UVM_ERROR_INVALID_ARGUMENT);
  CHECK(uvm_allocation_ranges(0, nullptr, nullptr, 3, &count) == UVM_ERROR_INVALID_ARGUMENT);
}

TEST_CASE("offload works from a thread with no context, in the owner's context only", "[offload]") {
  FakeMachine machine;
  Buffer b(kSize, 1);
  const uvm_range r = b.whole();
  fake::set_thread_context(fake::kNoContext);
  // auto: staged (copies and a discard) with CUDA 13, migrate (prefetches) with CUDA 12 headers.
  REQUIRE(uvm_offload_ranges(&r, 1, UVM_STRATEGY_AUTO, nullptr) == UVM_OK);
  REQUIRE(uvm_onload_ranges(&r, 1, nullptr) == UVM_OK);
  CHECK(fake::current_context() == fake::kNoContext);  // restored
  for (const auto& op : fake::ops()) {
    if (op.call == fake::OpKind::copy_to_host || op.call == fake::OpKind::copy_to_device || op.call == fake::OpKind::discard || op.call == fake::OpKind::prefetch) {
      CHECK(op.context_device == 1);
    }
  }
  CHECK(b.intact());
}

TEST_CASE("moves on device 1 from a thread with no context never make device 0's context", "[offload][threads][context]") {
  // The GPU suite's multi-GPU case found device 0's primary context created by a cycle on device 1:
  // a runtime call made with no context current (an event queried or destroyed after the move's
  // context was left) initializes the selected device's. The fake does the same.
  FakeMachine machine;
  REQUIRE(uvm_release_staging() == UVM_OK);
  fake::reset();  // forget which contexts exist
  fake::set_thread_context(fake::kNoContext);
  {
    Buffer b(size_t{64} << 20, 1);
    const uvm_range r = b.whole();
    std::vector<uvm_strategy> strategies = {UVM_STRATEGY_MIGRATE, UVM_STRATEGY_AUTO};
    if (CUDART_VERSION >= 13000) strategies.push_back(UVM_STRATEGY_STAGED);  // discard: CUDA 13
    for (uvm_strategy strategy : strategies) {
      REQUIRE(uvm_offload_ranges(&r, 1, strategy, nullptr) == UVM_OK);
      REQUIRE(uvm_onload_ranges(&r, 1, nullptr) == UVM_OK);
      uvm_move_report report{};
      (void)uvm_last_move(1, &report);
    }
    uvm_residency residency{};
    REQUIRE(uvm_get_residency(1, nullptr, &residency) == UVM_OK);
    CHECK(b.intact());
  }
  REQUIRE(uvm_release_staging() == UVM_OK);
  CHECK(fake::current_context() == fake::kNoContext);
  CHECK_FALSE(fake::context_created(0));
  CHECK(fake::context_created(1));
}

TEST_CASE("with a CUDA 12 driver auto falls back to migrate and staged is refused", "[cuda12][scenario]") {
  FakeMachine machine;
  Buffer b;
  const uvm_range r = b.whole();
  CHECK(uvm_offload_ranges(&r, 1, UVM_STRATEGY_STAGED, nullptr) == UVM_ERROR_UNSUPPORTED);
  CHECK_THAT(last_error(), Has("needs a CUDA 13 runtime and driver"));
  REQUIRE(uvm_offload_ranges(&r, 1, UVM_STRATEGY_AUTO, nullptr) == UVM_OK);
  CHECK(FakeMachine::ops_named(fake::OpKind::discard).empty());
  CHECK(FakeMachine::ops_named(fake::OpKind::prefetch).size() == 1);
  REQUIRE(uvm_onload_ranges(&r, 1, nullptr) == UVM_OK);
  CHECK(b.intact());
}

TEST_CASE("reserve_staging allocates ahead, once, and the next staged offload uses it", "[offload][cuda13]") {
  FakeMachine machine;
  REQUIRE(uvm_release_staging() == UVM_OK);
  const size_t blocks_before = fake::pinned_blocks();
  Buffer b(size_t{300} << 20);  // past the 256 MiB minimum block, so the reservation decides the size
  REQUIRE(uvm_reserve_staging(b.size) == UVM_OK);
  CHECK(fake::pinned_blocks() == blocks_before + 1);
  size_t capacity = 0;
  REQUIRE(uvm_get_staging(&capacity, nullptr) == UVM_OK);
  CHECK(capacity >= b.size);
  REQUIRE(uvm_reserve_staging(b.size) == UVM_OK);  // already there: nothing more
  REQUIRE(uvm_reserve_staging(0) == UVM_OK);
  CHECK(fake::pinned_blocks() == blocks_before + 1);
  uvm_staging_info info{};
  REQUIRE(uvm_get_staging_info(&info) == UVM_OK);  // this program runs with UVM_PINNED=hostalloc
  CHECK(info.configured_kind == UVM_PINNED_HOST_ALLOC);
  CHECK(info.host_alloc_bytes == capacity);
  CHECK(info.registered_bytes + info.pageable_bytes + info.pinning_bytes + info.staged_bytes == 0);
  CHECK(info.blocks == 1);
  CHECK(uvm_get_staging_info(nullptr) == UVM_ERROR_INVALID_ARGUMENT);
  CHECK_THAT(std::string(uvm_last_error()), Has("uvm_get_staging_info(): info is NULL"));
  fake::reset_ops();
  const uvm_range whole = b.whole();
  REQUIRE(uvm_offload_ranges(&whole, 1, UVM_STRATEGY_STAGED, fake::make_stream()) == UVM_OK);
  CHECK(FakeMachine::pinnings() == 0);  // the first offload allocated nothing
  REQUIRE(uvm_onload_ranges(&whole, 1, fake::make_stream()) == UVM_OK);
  CHECK(b.intact());
  fake::fail_next("cudaHostRegister", cudaErrorMemoryAllocation);
  fake::fail_next("cudaHostAlloc", cudaErrorMemoryAllocation);
  CHECK(uvm_reserve_staging(size_t{2} << 30) == UVM_ERROR_OUT_OF_MEMORY);
  CHECK(std::string(uvm_last_error()).find("uvm_reserve_staging") != std::string::npos);
  CHECK(cudaPeekAtLastError() == cudaSuccess);
}

namespace {

// Offloads both ranges (each past the 256 MiB minimum), one call each, so that each gets a staging
// block of its own, and onloads them: staging then holds two empty blocks, kept for the next cycle.
void cycle_in_two_blocks(const uvm_range (&both)[2], cudaStream_t stream) {
  REQUIRE(uvm_offload_ranges(&both[0], 1, UVM_STRATEGY_STAGED, stream) == UVM_OK);
  REQUIRE(uvm_offload_ranges(&both[1], 1, UVM_STRATEGY_STAGED, stream) == UVM_OK);
  REQUIRE(uvm_onload_ranges(both, 2, stream) == UVM_OK);
}

}  // namespace

TEST_CASE("when the set offloaded shrinks, the staging left empty goes back in the background",
          "[offload][cuda13]") {
  FakeMachine machine;
  REQUIRE(uvm_release_staging() == UVM_OK);
  const size_t blocks_before = fake::pinned_blocks();
  Buffer x(size_t{300} << 20), y(size_t{300} << 20);  // past the 256 MiB minimum: a block each
  const uvm_range both[] = {x.whole(), y.whole()};
  cudaStream_t stream = fake::make_stream();
  cycle_in_two_blocks(both, stream);
  size_t capacity = 0;
  REQUIRE(uvm_get_staging(&capacity, nullptr) == UVM_OK);
  CHECK(capacity == x.size + y.size);  // kept across the cycle, for the next one
  REQUIRE(uvm_offload_ranges(both, 2, UVM_STRATEGY_MIGRATE, stream) == UVM_OK);  // stages nothing
  REQUIRE(uvm_onload_ranges(both, 2, stream) == UVM_OK);
  REQUIRE(uvm_get_staging(&capacity, nullptr) == UVM_OK);
  CHECK(capacity == x.size + y.size);  // a migration leaves the blocks for the next staged offload

  REQUIRE(uvm_offload_ranges(&both[0], 1, UVM_STRATEGY_STAGED, stream) == UVM_OK);  // one block holds it
  capacity = staging_held_after_background_free();
  CHECK(capacity == x.size);  // held: what is offloaded, and no more
  size_t staged = 0;
  REQUIRE(uvm_release_staging() == UVM_OK);  // waits for the free in the background
  REQUIRE(uvm_get_staging(&capacity, &staged) == UVM_OK);
  CHECK(staged == x.size);
  CHECK(fake::pinned_blocks() == blocks_before + 1);
  REQUIRE(uvm_onload_ranges(&both[0], 1, stream) == UVM_OK);
  CHECK(x.intact());
  CHECK(y.intact());
  REQUIRE(uvm_release_staging() == UVM_OK);
}

TEST_CASE("in a group of moves the staging left empty goes back once the group ends, not after each offload",
          "[offload][group][cuda13]") {
  FakeMachine machine;
  REQUIRE(uvm_release_staging() == UVM_OK);
  Buffer x(size_t{300} << 20), y(size_t{300} << 20);  // past the 256 MiB minimum: a block each
  const uvm_range both[] = {x.whole(), y.whole()};
  cudaStream_t stream = fake::make_stream();
  cycle_in_two_blocks(both, stream);
  size_t held = 0;
  REQUIRE(uvm_get_staging(&held, nullptr) == UVM_OK);
  REQUIRE(held == x.size + y.size);
  const size_t pinned_before = FakeMachine::pinnings();

  // The shim's move of a module: its tensors in slices, each offloaded as soon as it is found.
  REQUIRE(uvm_begin_moves(0) == UVM_OK);
  const uint64_t frees_asked = uvm::staging().background_frees_asked();
  REQUIRE(uvm_offload_ranges(&both[0], 1, UVM_STRATEGY_STAGED, stream) == UVM_OK);
  CHECK(uvm::staging().background_frees_asked() == frees_asked);  // alone, it would ask to free y's empty block
  REQUIRE(uvm_get_staging(&held, nullptr) == UVM_OK);
  CHECK(held == x.size + y.size);
  REQUIRE(uvm_offload_ranges(&both[1], 1, UVM_STRATEGY_STAGED, stream) == UVM_OK);
  REQUIRE(uvm_end_moves() == UVM_OK);
  CHECK(FakeMachine::pinnings() == pinned_before);  // the second slice found its block still pinned
  REQUIRE(uvm_onload_ranges(both, 2, stream) == UVM_OK);
  CHECK(x.intact());
  CHECK(y.intact());

  // A group that offloads less than before still gives the rest back, at its end.
  REQUIRE(uvm_begin_moves(0) == UVM_OK);
  REQUIRE(uvm_offload_ranges(&both[0], 1, UVM_STRATEGY_STAGED, stream) == UVM_OK);
  REQUIRE(uvm_end_moves() == UVM_OK);
  held = staging_held_after_background_free();
  CHECK(held == x.size);
  REQUIRE(uvm_onload_ranges(&both[0], 1, stream) == UVM_OK);
  CHECK(x.intact());
  REQUIRE(uvm_release_staging() == UVM_OK);
  CHECK(cudaPeekAtLastError() == cudaSuccess);
}

TEST_CASE("a group of moves that says what it will stage pins it in one block at its first offload",
          "[offload][group][cuda13]") {
  FakeMachine machine;
  const size_t part = size_t{100} << 20;
  Buffer a(part), b(part), c(part);
  const uvm_range parts[] = {a.whole(), b.whole(), c.whole()};
  cudaStream_t stream = fake::make_stream();
  for (const size_t expected : {size_t{0}, 3 * part}) {
    CAPTURE(expected);
    REQUIRE(uvm_release_staging() == UVM_OK);  // nothing pinned: a first offload, in three slices
    REQUIRE(uvm_begin_moves(expected) == UVM_OK);
    for (const uvm_range& slice : parts) REQUIRE(uvm_offload_ranges(&slice, 1, UVM_STRATEGY_STAGED, stream) == UVM_OK);
    REQUIRE(uvm_end_moves() == UVM_OK);
    uvm_staging_info info{};
    REQUIRE(uvm_get_staging_info(&info) == UVM_OK);
    CHECK(info.staged_bytes == 3 * part);
    // Unknown, the first slice pins the 256 MiB minimum and the third a block of its own; known,
    // the first pins all three.
    CHECK(info.blocks == (expected ? 1u : 2u));
    REQUIRE(uvm_onload_ranges(parts, 3, stream) == UVM_OK);
    CHECK(a.intact());
    CHECK(b.intact());
    CHECK(c.intact());
  }
  REQUIRE(uvm_release_staging() == UVM_OK);
  CHECK(cudaPeekAtLastError() == cudaSuccess);
}

TEST_CASE("reservations at once take turns: one block, not one each", "[offload][threads]") {
  FakeMachine machine;
  REQUIRE(uvm_release_staging() == UVM_OK);
  const size_t blocks_before = fake::pinned_blocks();
  // The first reserver's pinning is held; the others come while it is, and must wait for its block
  // rather than pin one of their own.
  fake::hold_next("cudaHostAlloc");
  std::vector<std::thread> reservers;
  uvm_status reserved[4] = {UVM_ERROR_INTERNAL, UVM_ERROR_INTERNAL, UVM_ERROR_INTERNAL, UVM_ERROR_INTERNAL};
  std::atomic<pid_t> ids[4] = {};
  for (int i = 0; i < 4; ++i) {
    if (i == 1) REQUIRE(fake::wait_until_held());
    reservers.emplace_back([&, i] {  // Catch2 assertions are not thread-safe: checked after the joins
      ids[i] = threads::this_id();
      reserved[i] = uvm_reserve_staging(size_t{300} << 20);
    });
  }
  // The others wait for the first (asleep) or, wrongly, pinned blocks of their own (ended).
  bool parked = true;
  for (int i = 1; i < 4; ++i) parked = threads::wait_until_parked(ids[i]) && parked;
  fake::release_held();
  for (std::thread& t : reservers) t.join();
  CHECK(parked);
  for (uvm_status status : reserved) CHECK(status == UVM_OK);
  CHECK(fake::pinned_blocks() == blocks_before + 1);
}

// Run with UVM_PINNED unset, so that staging is pinned the registered way (tests/meson.build:
// offload-pinned-in-steps); 512 MiB of it is faulted in for real.
TEST_CASE("a first offload copies into the steps pinned so far while the rest is being pinned",
          "[scenario][steps][steps_race][cuda13]") {
  FakeMachine machine;
  REQUIRE(uvm_release_staging() == UVM_OK);  // nothing pinned yet: this is a first offload
  const size_t step = size_t{256} << 20;
  Buffer b(2 * step);
  const auto ranges = tensors_in(b, 8);
  cudaStream_t stream = fake::make_stream();
  auto copied_out = [] { return FakeMachine::bytes_of(fake::OpKind::copy_to_host); };
  fake::hold_next("cudaHostRegister", 1);  // the second step waits
  uvm_status status = UVM_ERROR_INTERNAL;
  uvm_move_report report{};
  TestThread offload([&] {
    fake::set_thread_context(0);
    status = uvm_offload_ranges(ranges.data(), ranges.size(), UVM_STRATEGY_STAGED, stream);
    uvm_last_move(0, &report);
  });
  REQUIRE(fake::wait_until_held());
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(10);
  while (copied_out() < step && std::chrono::steady_clock::now() < deadline) {
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
  CHECK(copied_out() == step);  // the first step's tensors are copied out, the second's wait
  uvm_staging_info pinning{};
  REQUIRE(uvm_get_staging_info(&pinning) == UVM_OK);
  CHECK(pinning.configured_kind == UVM_PINNED_REGISTERED);
  CHECK(pinning.blocks == 1);
  CHECK(pinning.registered_bytes == 2 * step);
  CHECK(pinning.pinning_bytes == step);  // the second step is not pinned yet
  fake::release_held();
  offload.join();
  REQUIRE(status == UVM_OK);
  CHECK(copied_out() == 2 * step);
  CHECK(residency().staged_bytes == 2 * step);
  CHECK(report.bytes == 2 * step);  // one call, in two rounds
  uvm_staging_info pinned{};
  REQUIRE(uvm_get_staging_info(&pinned) == UVM_OK);
  CHECK(pinned.pinning_bytes == 0);
  CHECK(pinned.staged_bytes == 2 * step);
  const void* copy = nullptr;
  REQUIRE(uvm_get_staged_copy(b.ptr, b.size, &copy) == UVM_OK);  // cut where the steps end, yet one copy
  REQUIRE(copy != nullptr);
  CHECK(std::memcmp(copy, b.ptr, 0) == 0);
  for (size_t i : {size_t{0}, step - 1, step, 2 * step - 1}) {
    CHECK(static_cast<const unsigned char*>(copy)[i] == static_cast<unsigned char>(i * 7 + 3));
  }
  REQUIRE(uvm_onload_ranges(ranges.data(), ranges.size(), stream) == UVM_OK);
  CHECK(b.intact());
  REQUIRE(uvm_release_staging() == UVM_OK);
  size_t capacity = 1;
  REQUIRE(uvm_get_staging(&capacity, nullptr) == UVM_OK);
  CHECK(capacity == 0);  // the block pinned in steps is given back whole
}

TEST_CASE("a first offload never copies across two pinning steps, wherever its tensors start",
          "[scenario][steps][cuda13]") {
  FakeMachine machine;
  REQUIRE(uvm_release_staging() == UVM_OK);
  // 1 MiB + 300 MiB + 200 MiB in three allocations: every piece after the first starts off a step
  // boundary of the staging block, and the big one spans two steps.
  Buffer small(1 << 20), big(300 << 20), middle(200 << 20);
  const std::vector<uvm_range> ranges = {small.whole(), big.whole(), middle.whole()};
  cudaStream_t stream = fake::make_stream();
  REQUIRE(uvm_offload_ranges(ranges.data(), ranges.size(), UVM_STRATEGY_STAGED, stream) == UVM_OK);
  INFO(uvm_last_error());
  CHECK(residency().staged_bytes == (501u << 20));
  const void* copy = nullptr;
  REQUIRE(uvm_get_staged_copy(big.ptr, big.size, &copy) == UVM_OK);
  CHECK(copy != nullptr);
  REQUIRE(uvm_onload_ranges(ranges.data(), ranges.size(), stream) == UVM_OK);
  CHECK(small.intact());
  CHECK(big.intact());
  CHECK(middle.intact());
  REQUIRE(uvm_release_staging() == UVM_OK);
}

TEST_CASE("a block pinned in steps that holds a smaller set gives back the steps past it", "[scenario][steps][cuda13]") {
  FakeMachine machine;
  ThreeSteps set;
  const size_t step = ThreeSteps::kStep;
  const Buffer &small = set.small, &big = set.big;
  const uvm_range* both = set.both;
  cudaStream_t stream = set.stream;
  size_t capacity = 0;
  REQUIRE(uvm_get_staging(&capacity, nullptr) == UVM_OK);
  REQUIRE(capacity == small.size + big.size);
  const size_t blocks_before = fake::pinned_blocks();

  fake::reset_ops();
  REQUIRE(uvm_offload_ranges(&both[0], 1, UVM_STRATEGY_STAGED, stream) == UVM_OK);  // the first step holds it
  capacity = staging_held_after_background_free();
  CHECK(capacity == step);  // held: the offloaded set rounded up to a step, not the whole block
  REQUIRE(uvm_release_staging() == UVM_OK);  // waits for the free in the background
  const auto unpinned = FakeMachine::ops_named(fake::OpKind::host_unregister);
  REQUIRE(unpinned.size() == 2);  // the second and third steps, each where its registration starts
  CHECK(unpinned[0].ptr != unpinned[1].ptr);
  CHECK(fake::pinned_blocks() == blocks_before - 2);  // the block stays, its first step registered
  uvm_staging_info info{};
  REQUIRE(uvm_get_staging_info(&info) == UVM_OK);
  CHECK(info.registered_bytes == step);
  CHECK(info.pinning_bytes == 0);
  CHECK(info.staged_bytes == small.size);
  REQUIRE(uvm_onload_ranges(&both[0], 1, stream) == UVM_OK);
  CHECK(small.intact());

  // The smaller block goes on serving, and a bigger set grows staging again.
  REQUIRE(uvm_offload_ranges(both, 2, UVM_STRATEGY_STAGED, stream) == UVM_OK);
  REQUIRE(uvm_onload_ranges(both, 2, stream) == UVM_OK);
  CHECK(small.intact());
  CHECK(big.intact());
  REQUIRE(uvm_release_staging() == UVM_OK);
  REQUIRE(uvm_get_staging(&capacity, nullptr) == UVM_OK);
  CHECK(capacity == 0);
  CHECK(cudaPeekAtLastError() == cudaSuccess);
}

TEST_CASE("steps of a block that cannot be given back stay uvm's staging memory, and the next release frees them",
          "[scenario][steps][cuda13]") {
  // Issue 58 item 5: the block was cut before its steps were unregistered, so a failure there left
  // them registered and mapped, known to no one.
  FakeMachine machine;
  ThreeSteps set;
  const size_t step = ThreeSteps::kStep;
  const Buffer &small = set.small, &big = set.big;
  const uvm_range* both = set.both;
  cudaStream_t stream = set.stream;
  const size_t blocks_before = fake::pinned_blocks();
  fake::fail_next("cudaHostUnregister", cudaErrorInvalidValue, 1);  // the third step
  REQUIRE(uvm_offload_ranges(&both[0], 1, UVM_STRATEGY_STAGED, stream) == UVM_OK);  // the first step holds it
  (void)uvm_release_staging();  // it, or the cut in the background, fails at the third step
  CHECK(cudaPeekAtLastError() == cudaSuccess);
  REQUIRE(uvm_release_staging() == UVM_OK);  // the step left is tried again
  CHECK(fake::pinned_blocks() == blocks_before - 2);
  size_t capacity = 0;
  REQUIRE(uvm_get_staging(&capacity, nullptr) == UVM_OK);
  CHECK(capacity == step);
  REQUIRE(uvm_onload_ranges(&both[0], 1, stream) == UVM_OK);
  CHECK(small.intact());
  CHECK(big.intact());
  REQUIRE(uvm_release_staging() == UVM_OK);
  CHECK(fake::pinned_blocks() == 0);
}

TEST_CASE("steps given back while other threads offload, onload and release staging lose no byte",
          "[scenario][steps][steps_race][cuda13]") {
  FakeMachine machine;
  REQUIRE(uvm_release_staging() == UVM_OK);
  const size_t step = size_t{256} << 20;
  Buffer small(size_t{10} << 20), big(2 * step), other(size_t{6} << 20);
  const uvm_range both[] = {small.whole(), big.whole()};
  const uvm_range kept = other.whole();
  std::atomic<bool> stop{false};
  std::atomic<int> failures{0};
  // One thread cycles between the whole set (three steps) and its small part (one step: the other
  // two are cut off in the background); another offloads its own tensor; a third releases staging.
  std::thread cycling([&] {
    fake::set_thread_context(0);
    cudaStream_t stream = fake::make_stream();
    for (int round = 0; round < 2; ++round) {
      failures += uvm_offload_ranges(both, 2, UVM_STRATEGY_STAGED, stream) != UVM_OK;
      failures += uvm_onload_ranges(both, 2, stream) != UVM_OK;
      failures += !small.intact() + !big.intact();
      failures += uvm_offload_ranges(&both[0], 1, UVM_STRATEGY_STAGED, stream) != UVM_OK;
      failures += uvm_onload_ranges(&both[0], 1, stream) != UVM_OK;
      failures += !small.intact() + !big.intact();
    }
    stop = true;
  });
  std::thread neighbour([&] {
    fake::set_thread_context(0);
    cudaStream_t stream = fake::make_stream();
    while (!stop) {
      failures += uvm_offload_ranges(&kept, 1, UVM_STRATEGY_STAGED, stream) != UVM_OK;
      failures += uvm_onload_ranges(&kept, 1, stream) != UVM_OK;
      failures += !other.intact();
    }
  });
  std::thread releasing([&] {
    fake::set_thread_context(0);
    while (!stop) failures += uvm_release_staging() != UVM_OK;
  });
  cycling.join();
  neighbour.join();
  releasing.join();
  INFO(uvm_last_error());
  CHECK(failures == 0);
  CHECK(small.intact());
  CHECK(big.intact());
  CHECK(other.intact());
  REQUIRE(uvm_release_staging() == UVM_OK);
  size_t capacity = 1;
  REQUIRE(uvm_get_staging(&capacity, nullptr) == UVM_OK);
  CHECK(capacity == 0);
  CHECK(fake::pinned_blocks() == 0);
}

// Run with UVM_PINNED=pageable (tests/meson.build: offload-pageable).
TEST_CASE("UVM_PINNED=pageable stages in memory it never pins, and the data survives", "[scenario][pageable][cuda13]") {
  FakeMachine machine;
  REQUIRE(uvm_release_staging() == UVM_OK);
  Buffer b(size_t{32} << 20);
  const auto ranges = tensors_in(b, 16);
  cudaStream_t stream = fake::make_stream();
  fake::reset_ops();
  REQUIRE(uvm_offload_ranges(ranges.data(), ranges.size(), UVM_STRATEGY_STAGED, stream) == UVM_OK);
  CHECK(FakeMachine::pinnings() == 0);  // neither cudaHostRegister nor cudaHostAlloc
  CHECK(FakeMachine::ops_named(fake::OpKind::copy_to_host).size() == 1);
  CHECK(residency().staged_bytes == b.size);
  size_t capacity = 0;
  REQUIRE(uvm_get_staging(&capacity, nullptr) == UVM_OK);
  CHECK(capacity >= b.size);
  uvm_staging_info info{};
  REQUIRE(uvm_get_staging_info(&info) == UVM_OK);
  CHECK(info.configured_kind == UVM_PINNED_PAGEABLE);
  CHECK(info.pageable_bytes == capacity);  // all of it, and none pinned
  CHECK(info.registered_bytes + info.host_alloc_bytes == 0);
  CHECK(info.staged_bytes == b.size);
  const void* copy = nullptr;
  REQUIRE(uvm_get_staged_copy(b.ptr, b.size, &copy) == UVM_OK);
  REQUIRE(copy != nullptr);
  CHECK(static_cast<const unsigned char*>(copy)[12345] == static_cast<unsigned char>(12345 * 7 + 3));
  REQUIRE(uvm_onload_ranges(ranges.data(), ranges.size(), stream) == UVM_OK);
  CHECK(b.intact());
  REQUIRE(uvm_release_staging() == UVM_OK);
  REQUIRE(uvm_get_staging(&capacity, nullptr) == UVM_OK);
  CHECK(capacity == 0);
  CHECK(FakeMachine::ops_named(fake::OpKind::host_unregister).empty());
}

TEST_CASE("a cycle whose every runtime call fails in turn names the call, leaves nothing pending and loses no byte",
          "[offload][errors][cuda13]") {
  // Issue 58 item 5: each failure of each call an offload and an onload make, one at a time (the
  // k-th call of that name fails), managed and releasable memory side by side; after it the onload
  // is tried again until it works, and every byte must be back.
  FakeMachine machine;
  Buffer managed(kSize);
  Releasable released(kSize, 0, 9);
  cudaStream_t stream = fake::make_stream();
  std::vector<uvm_range> ranges = tensors_in(managed, 4);
  ranges.push_back(released.whole());
  for (const char* call : {"cudaStreamWaitEvent", "cudaEventRecord", "cudaEventSynchronize", "cudaMemcpyAsync",
                           "cudaMemPrefetchAsync", "cudaMemDiscardBatchAsync",
                           "cudaEventCreateWithFlags", "cuMemUnmap", "cuMemRelease", "cuMemCreate", "cuMemMap",
                           "cuMemSetAccess", "cudaGetDevice", "cudaDeviceGetAttribute", "cudaStreamIsCapturing",
                           "cudaEventQuery", "cudaEventDestroy", "cuCtxGetCurrent", "cudaMemGetInfo"}) {
    for (int skip = 0;; ++skip) {
      CAPTURE(call, skip);
      REQUIRE(skip < 64);
      fake::fail_next(call, cudaErrorLaunchFailure, skip);
      uvm_clear_last_error();
      if (uvm_offload_ranges(ranges.data(), ranges.size(), UVM_STRATEGY_STAGED, stream) != UVM_OK) {
        CHECK_THAT(last_error(), Has(call));
      }
      CHECK(cudaPeekAtLastError() == cudaSuccess);
      const bool failed_in_offload = !fake::injection_left(call);
      uvm_clear_last_error();
      uvm_status onloaded = uvm_onload_ranges(ranges.data(), ranges.size(), stream);
      if (onloaded != UVM_OK) {
        CHECK(!failed_in_offload);
        CHECK_THAT(last_error(), Has(call));
        CHECK(cudaPeekAtLastError() == cudaSuccess);
        onloaded = uvm_onload_ranges(ranges.data(), ranges.size(), stream);
      }
      REQUIRE(onloaded == UVM_OK);
      CHECK(cudaPeekAtLastError() == cudaSuccess);
      CHECK(managed.intact());
      CHECK(released.intact());
      CHECK(residency().staged_bytes == 0);
      const bool happened = !fake::injection_left(call);
      fake::clear_injections();
      if (happened) continue;
      CHECK(skip > 0);  // the cycle calls it at least once: the sweep failed something
      break;            // and each of its calls was failed in turn
    }
  }
  REQUIRE(uvm_release_staging() == UVM_OK);
}

TEST_CASE("an allocation, a query and a free on a new thread whose every call fails in turn name it and leave nothing",
          "[malloc][errors][cuda13]") {
  // Issue 58 item 5, the calls an offload does not make: a thread with no context allocating on
  // another device (context calls), managed and releasable, asked where its bytes are, then freed.
  FakeMachine machine;
  for (const char* call : {"cuCtxGetCurrent", "cuCtxSetCurrent", "cuMemGetAllocationGranularity", "cudaMemRangeGetAttribute",
                           "cudaMallocManaged", "cudaMemAdvise", "cuMemAddressReserve",
                           "cuMemCreate", "cudaDeviceSynchronize", "cudaFree", "cuMemUnmap", "cuMemRelease",
                           "cuMemAddressFree"}) {
    for (int skip = 0;; ++skip) {
      CAPTURE(call, skip);
      REQUIRE(skip < 64);
      const size_t allocations = fake::live_allocations(), reservations = fake::live_reservations();
      bool ok = true;
      std::thread([&] {  // a thread of its own: no context yet
        fake::set_thread_context(fake::kNoContext);
        fake::fail_next(call, cudaErrorLaunchFailure, skip);
        const auto failed_naming_it = [&] {
          const bool named = std::string(uvm_last_error()).find(call) != std::string::npos;
          return named && cudaPeekAtLastError() == cudaSuccess;
        };
        void* managed = nullptr;
        void* released = nullptr;
        for (int attempt = 0; attempt < 2 && managed == nullptr; ++attempt) {
          uvm_clear_last_error();
          if ((managed = uvm_malloc(kSize, 1, nullptr)) == nullptr) ok = ok && failed_naming_it();
        }
        for (int attempt = 0; attempt < 2 && released == nullptr; ++attempt) {
          uvm_clear_last_error();
          if ((released = uvm_malloc_releasable(kSize, 1, nullptr)) == nullptr) ok = ok && failed_naming_it();
        }
        if (managed == nullptr || released == nullptr) {
          ok = false;
          return;
        }
        int preferred = 0, prefetched = 0;
        uvm_clear_last_error();
        if (uvm_query_location(managed, kSize, &preferred, &prefetched) != UVM_OK) ok = ok && failed_naming_it();
        for (void* p : {managed, released}) {
          uvm_clear_last_error();
          uvm_free(p, kSize, 1, nullptr);
          if (uvm_last_status() != UVM_OK) {
            ok = ok && failed_naming_it();
            uvm_clear_last_error();
            uvm_free(p, kSize, 1, nullptr);  // the second free finishes
            ok = ok && uvm_last_status() == UVM_OK;
          }
        }
      }).join();
      INFO(uvm_last_error());
      CHECK(ok);
      CHECK(fake::live_allocations() == allocations);
      CHECK(fake::live_reservations() == reservations);
      const bool happened = !fake::injection_left(call);
      fake::clear_injections();
      if (happened) continue;
      CHECK(skip > 0);
      break;
    }
  }
}
