// uvm_block_allocated and uvm_block_freed (alloc/blocks.cpp): a runtime that cuts blocks out of uvm
// allocations, as PyTorch's caching allocator does, reuses a freed block without uvm_free. Staged
// bytes must die with the block they were staged for: the next block at the same address never
// receives them, a released allocation under a new block is mapped before anyone writes it, and a
// move still running over the bytes is waited for.
#include <atomic>
#include <cstring>
#include <string>
#include <thread>
#include <vector>

#include "fixture.hpp"

namespace {
constexpr size_t kMiB = size_t{1} << 20;

bool holds(const unsigned char* p, size_t size, unsigned char value) {
  for (size_t i = 0; i < size; ++i) {
    if (p[i] != value) return false;
  }
  return true;
}

size_t staged_bytes() {
  size_t staged = 0;
  REQUIRE(uvm_get_staging(nullptr, &staged) == UVM_OK);
  return staged;
}

// A segment of `kSegment` bytes holding two 4 MiB blocks, "keep" and "old", as PyTorch would
// place two tensors in one segment.
struct Segment {
  static constexpr size_t kSegment = 8 * kMiB, kBlock = 4 * kMiB;
  explicit Segment(bool releasable) : releasable(releasable) {
    REQUIRE(uvm_report_blocks(1) == UVM_OK);  // a runtime that reports every block, as the shim's hook does
    base = static_cast<unsigned char*>(releasable ? uvm_malloc_releasable(kSegment, 0, nullptr)
                                                  : uvm_malloc(kSegment, 0, nullptr));
    REQUIRE(base != nullptr);
    REQUIRE(uvm_block_allocated(keep(), kBlock) == UVM_OK);
    REQUIRE(uvm_block_allocated(old(), kBlock) == UVM_OK);
    std::memset(keep(), 0x11, kBlock);
    std::memset(old(), 0x22, kBlock);
  }
  ~Segment() { uvm_free(base, kSegment, 0, nullptr); }
  unsigned char* keep() const { return base; }
  unsigned char* old() const { return base + kBlock; }
  uvm_range whole() const { return uvm_range{base, kSegment}; }
  unsigned char* base;
  bool releasable;
};

}  // namespace

TEST_CASE("a block handed out where a freed block was staged never receives the old bytes", "[blocks][cuda13]") {
  for (const bool releasable : {false, true}) {
    CAPTURE(releasable);
    FakeMachine machine;
    Segment segment(releasable);
    const uvm_range both[] = {{segment.keep(), Segment::kBlock}, {segment.old(), Segment::kBlock}};
    REQUIRE(uvm_offload_ranges(both, 2, UVM_STRATEGY_AUTO, nullptr) == UVM_OK);
    // The runtime frees "old" and hands its block to "new" (same address, same size).
    REQUIRE(uvm_block_freed(segment.old(), Segment::kBlock) == UVM_OK);
    CHECK(staged_bytes() == Segment::kBlock);  // only keep's copy is left
    REQUIRE(uvm_block_allocated(segment.old(), Segment::kBlock) == UVM_OK);
    unsigned char* fresh = segment.old();
    std::memset(fresh, 7, Segment::kBlock);  // the new tensor's kernel: mapped memory, never a fault
    const uvm_range moved[] = {{segment.keep(), Segment::kBlock}, {fresh, Segment::kBlock}};
    REQUIRE(uvm_onload_ranges(moved, 2, nullptr) == UVM_OK);
    const uvm_range whole = segment.whole();
    REQUIRE(uvm_onload_ranges(&whole, 1, nullptr) == UVM_OK);  // as onload(pool) does
    CHECK(holds(fresh, Segment::kBlock, 7));
    CHECK(holds(segment.keep(), Segment::kBlock, 0x11));
    CHECK(residency().device_bytes == Segment::kSegment);
    CHECK(staged_bytes() == 0);
  }
}

TEST_CASE("a block handed out after a whole-segment offload keeps what it writes through the onload", "[blocks][cuda13]") {
  // offload(pool) moves whole segments, free blocks included; the new block is not one of the
  // tensors that were offloaded, and its bytes are its own from the moment it is handed out.
  for (const bool releasable : {false, true}) {
    CAPTURE(releasable);
    FakeMachine machine;
    Segment segment(releasable);
    REQUIRE(uvm_block_freed(segment.old(), Segment::kBlock) == UVM_OK);  // freed before the offload
    const uvm_range whole = segment.whole();
    REQUIRE(uvm_offload_ranges(&whole, 1, UVM_STRATEGY_AUTO, nullptr) == UVM_OK);
    if (releasable) CHECK(residency().released_bytes == Segment::kSegment);
    REQUIRE(uvm_block_allocated(segment.old(), 1000) == UVM_OK);  // a smaller tensor in the free block
    CHECK(residency().released_bytes == 0);  // mapped again for its writes
    std::memset(segment.old(), 9, 1000);
    REQUIRE(uvm_onload_ranges(&whole, 1, nullptr) == UVM_OK);
    CHECK(holds(segment.old(), 1000, 9));
    CHECK(holds(segment.keep(), Segment::kBlock, 0x11));
  }
}

TEST_CASE("a freed block's staged copy goes, and its pinned memory is reused once its neighbours are back",
          "[blocks][cuda13]") {
  FakeMachine machine;
  REQUIRE(uvm_release_staging() == UVM_OK);
  Segment segment(false);
  const uvm_range whole = segment.whole();
  REQUIRE(uvm_offload_ranges(&whole, 1, UVM_STRATEGY_STAGED, nullptr) == UVM_OK);
  CHECK(staged_bytes() == Segment::kSegment);
  REQUIRE(uvm_block_freed(segment.old(), Segment::kBlock) == UVM_OK);
  CHECK(staged_bytes() == Segment::kBlock);
  uvm_residency r = residency();
  CHECK(r.host_bytes == Segment::kBlock);
  CHECK(r.discarded_bytes == Segment::kBlock);  // no copy kept of the freed bytes
  uvm_stats stats{};
  REQUIRE(uvm_get_stats(0, &stats) == UVM_OK);
  CHECK(stats.host_resident_bytes == Segment::kBlock);
  const uvm_range keep{segment.keep(), Segment::kBlock};
  REQUIRE(uvm_onload_ranges(&keep, 1, nullptr) == UVM_OK);
  CHECK(holds(segment.keep(), Segment::kBlock, 0x11));
  // Nothing in the staging block is held any more: the next offload pins nothing new.
  const size_t pinnings = FakeMachine::pinnings();
  REQUIRE(uvm_offload_ranges(&keep, 1, UVM_STRATEGY_STAGED, nullptr) == UVM_OK);
  CHECK(FakeMachine::pinnings() == pinnings);
  REQUIRE(uvm_onload_ranges(&keep, 1, nullptr) == UVM_OK);
}

TEST_CASE("a block handed out waits for the move still running over its allocation", "[blocks][cuda13]") {
  FakeMachine machine;
  Segment segment(false);
  const uvm_range old{segment.old(), Segment::kBlock};
  fake::set_events_pending(true);  // the GPU has not reached the end of the offload yet
  REQUIRE(uvm_offload_ranges(&old, 1, UVM_STRATEGY_STAGED, fake::make_stream()) == UVM_OK);
  fake::set_events_pending(false);
  REQUIRE(uvm_block_freed(segment.old(), Segment::kBlock) == UVM_OK);
  fake::reset_ops();
  REQUIRE(uvm_block_allocated(segment.old(), Segment::kBlock) == UVM_OK);
  // Its discard must not land on what the new owner writes next: the block waited for it.
  CHECK(FakeMachine::ops_named(fake::OpKind::event_sync).size() == 1);
  // Once seen complete, the next block of the allocation does not wait again.
  REQUIRE(uvm_block_freed(segment.old(), Segment::kBlock) == UVM_OK);
  fake::reset_ops();
  REQUIRE(uvm_block_allocated(segment.old(), Segment::kBlock) == UVM_OK);
  CHECK(fake::ops().empty());
}

TEST_CASE("blocks of memory uvm did not allocate, or of untouched allocations, cost no CUDA call", "[blocks]") {
  FakeMachine machine;
  void* foreign = nullptr;
  REQUIRE(cudaMallocManaged(&foreign, 4096, cudaMemAttachGlobal) == cudaSuccess);
  auto* mine = static_cast<unsigned char*>(uvm_malloc(kMiB, 0, nullptr));
  REQUIRE(mine != nullptr);
  fake::reset_ops();
  CHECK(uvm_block_allocated(foreign, 512) == UVM_OK);
  CHECK(uvm_block_freed(foreign, 512) == UVM_OK);
  CHECK(uvm_block_allocated(mine + 512, 512) == UVM_OK);
  CHECK(uvm_block_freed(mine + 512, 512) == UVM_OK);
  CHECK(uvm_block_allocated(nullptr, 512) == UVM_OK);
  CHECK(uvm_block_allocated(mine, 0) == UVM_OK);
  CHECK(fake::ops().empty());
  uvm_free(mine, kMiB, 0, nullptr);
  REQUIRE(cudaFree(foreign) == cudaSuccess);
}

TEST_CASE("a block that runs past its allocation is refused, naming both", "[blocks]") {
  FakeMachine machine;
  auto* mine = static_cast<unsigned char*>(uvm_malloc(kMiB, 0, nullptr));
  REQUIRE(mine != nullptr);
  CHECK(uvm_block_allocated(mine + kMiB - 512, 1024) == UVM_ERROR_INVALID_ARGUMENT);
  CHECK_THAT(last_error(), Has("uvm_block_allocated(ptr="));
  CHECK_THAT(last_error(), Has("512 bytes past the end of its uvm allocation"));
  CHECK(uvm_block_freed(mine + kMiB - 512, 1024) == UVM_ERROR_INVALID_ARGUMENT);
  CHECK_THAT(last_error(), Has("uvm_block_freed("));
  uvm_free(mine, kMiB, 0, nullptr);
}

TEST_CASE("a block in a released allocation whose memory cannot be mapped fails clearly and can be retried",
          "[blocks]") {
  FakeMachine machine;
  Segment segment(true);
  const uvm_range whole = segment.whole();
  REQUIRE(uvm_offload_ranges(&whole, 1, UVM_STRATEGY_AUTO, nullptr) == UVM_OK);
  REQUIRE(uvm_block_freed(segment.old(), Segment::kBlock) == UVM_OK);
  fake::fail_next("cuMemCreate", cudaErrorMemoryAllocation);
  CHECK(uvm_block_allocated(segment.old(), Segment::kBlock) == UVM_ERROR_OUT_OF_MEMORY);
  CHECK_THAT(last_error(), Has("uvm_block_allocated("));
  CHECK_THAT(last_error(), Has("cuMemCreate"));
  CHECK(cudaPeekAtLastError() == cudaSuccess);
  CHECK(fake::mapped_reservations() == 0);  // still released: the runtime must not hand it out
  REQUIRE(uvm_block_allocated(segment.old(), Segment::kBlock) == UVM_OK);
  CHECK(fake::mapped_reservations() == 1);
  std::memset(segment.old(), 5, Segment::kBlock);
  REQUIRE(uvm_onload_ranges(&whole, 1, nullptr) == UVM_OK);
  CHECK(holds(segment.keep(), Segment::kBlock, 0x11));
  CHECK(holds(segment.old(), Segment::kBlock, 5));
}

TEST_CASE("blocks handed out and freed on one thread while another moves their neighbours lose nothing",
          "[blocks][threads][cuda13]") {
  FakeMachine machine;
  REQUIRE(uvm_report_blocks(1) == UVM_OK);
  constexpr size_t kBlock = 64 * 1024, kBlocks = 16;
  auto* base = static_cast<unsigned char*>(uvm_malloc(kBlock * kBlocks, 0, nullptr));
  REQUIRE(base != nullptr);
  // Blocks 0..7 are the mover's, 8..15 the allocator's.
  std::vector<uvm_range> mover;
  for (size_t i = 0; i < kBlocks / 2; ++i) {
    REQUIRE(uvm_block_allocated(base + i * kBlock, kBlock) == UVM_OK);
    std::memset(base + i * kBlock, static_cast<int>(i + 1), kBlock);
    mover.push_back(uvm_range{base + i * kBlock, kBlock});
  }
  std::atomic<int> failures{0};
  std::thread allocator([&] {
    fake::set_thread_context(0);
    for (int round = 0; round < 300; ++round) {
      for (size_t i = kBlocks / 2; i < kBlocks; ++i) {
        unsigned char* block = base + i * kBlock;
        failures += uvm_block_allocated(block, kBlock) != UVM_OK;
        std::memset(block, static_cast<int>(round % 200 + 20), kBlock);
        failures += !holds(block, kBlock, static_cast<unsigned char>(round % 200 + 20));
        failures += uvm_block_freed(block, kBlock) != UVM_OK;
      }
    }
  });
  const cudaStream_t stream = fake::make_stream();
  for (int round = 0; round < 200; ++round) {
    failures += uvm_offload_ranges(mover.data(), mover.size(), UVM_STRATEGY_STAGED, stream) != UVM_OK;
    failures += uvm_onload_ranges(mover.data(), mover.size(), stream) != UVM_OK;
  }
  allocator.join();
  CHECK(failures == 0);
  for (size_t i = 0; i < kBlocks / 2; ++i) CHECK(holds(base + i * kBlock, kBlock, static_cast<unsigned char>(i + 1)));
  uvm_free(base, kBlock * kBlocks, 0, nullptr);
  CHECK(staged_bytes() == 0);
}

TEST_CASE("an offload drops the free space of a reported allocation and keeps every byte of the others",
          "[blocks][cuda13]") {
  for (const bool releasable : {false, true}) {
    CAPTURE(releasable);
    FakeMachine machine;
    // Made before the runtime said it reports its blocks: every byte counts, blocks or not.
    auto* before = static_cast<unsigned char*>(uvm_malloc(Segment::kSegment, 0, nullptr));
    REQUIRE(before != nullptr);
    std::memset(before, 0x44, Segment::kSegment);
    Segment segment(releasable);  // turns reporting on, then allocates
    REQUIRE(uvm_block_allocated(before, 4096) == UVM_OK);
    // A plain buffer made while reporting is on, that no block is ever reported for.
    auto* plain = static_cast<unsigned char*>(uvm_malloc(Segment::kSegment, 0, nullptr));
    REQUIRE(plain != nullptr);
    std::memset(plain, 0x55, Segment::kSegment);
    REQUIRE(uvm_block_freed(segment.old(), Segment::kBlock) == UVM_OK);  // free space now
    fake::reset_ops();
    const uvm_range ranges[] = {segment.whole(), {before, Segment::kSegment}, {plain, Segment::kSegment}};
    for (const uvm_range& r : ranges) REQUIRE(uvm_offload_ranges(&r, 1, UVM_STRATEGY_AUTO, nullptr) == UVM_OK);
    // Copied out: keep's block and both other allocations whole; not the segment's free block.
    CHECK(FakeMachine::bytes_of(fake::OpKind::copy_to_host) == Segment::kBlock + 2 * Segment::kSegment);
    CHECK(staged_bytes() == Segment::kBlock + 2 * Segment::kSegment);
    uvm_residency r{};
    REQUIRE(uvm_get_residency(0, nullptr, &r) == UVM_OK);
    CHECK(r.discarded_bytes == Segment::kBlock);
    if (releasable) CHECK(r.released_bytes == Segment::kSegment);  // its free space counts as off the device
    for (const uvm_range& range : ranges) REQUIRE(uvm_onload_ranges(&range, 1, nullptr) == UVM_OK);
    CHECK(holds(segment.keep(), Segment::kBlock, 0x11));
    CHECK(holds(before, Segment::kSegment, 0x44));
    CHECK(holds(plain, Segment::kSegment, 0x55));
    uvm_free(before, Segment::kSegment, 0, nullptr);
    uvm_free(plain, Segment::kSegment, 0, nullptr);
  }
}

TEST_CASE("a block handed out in an allocation made before reporting began drops what a whole offload staged there",
          "[blocks][cuda13]") {
  // A pool built on uvm before the hook was attached: its segments are staged whole (free space
  // too), and a block handed out later in that free space must not get those bytes back.
  for (const bool releasable : {false, true}) {
    CAPTURE(releasable);
    FakeMachine machine;  // reporting off
    auto* base = static_cast<unsigned char*>(releasable ? uvm_malloc_releasable(2 * kMiB, 0, nullptr)
                                                        : uvm_malloc(2 * kMiB, 0, nullptr));
    REQUIRE(base != nullptr);
    std::memset(base, 0x66, 2 * kMiB);
    const uvm_range whole{base, 2 * kMiB};
    REQUIRE(uvm_offload_ranges(&whole, 1, UVM_STRATEGY_AUTO, nullptr) == UVM_OK);
    CHECK(staged_bytes() == 2 * kMiB);
    REQUIRE(uvm_report_blocks(1) == UVM_OK);  // the hook attaches now
    REQUIRE(uvm_block_allocated(base + kMiB, 4096) == UVM_OK);
    CHECK(staged_bytes() == 2 * kMiB - 4096);
    std::memset(base + kMiB, 0x77, 4096);
    REQUIRE(uvm_onload_ranges(&whole, 1, nullptr) == UVM_OK);
    CHECK(holds(base + kMiB, 4096, 0x77));
    CHECK(holds(base, kMiB, 0x66));
    uvm_free(base, 2 * kMiB, 0, nullptr);
  }
}
