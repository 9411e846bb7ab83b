// Offload/onload planning: strategy choice, what is left to move, how the pipeline cuts work.
#include "../../offload/media/plan.hpp"

#include "uvm_test.hpp"

namespace {
uvm::Span span(uintptr_t begin, uintptr_t end) { return uvm::Span{begin, end}; }

bool same(const std::vector<uvm::Span>& got, const std::vector<uvm::Span>& want) {
  if (got.size() != want.size()) return false;
  for (size_t i = 0; i < got.size(); ++i) {
    if (got[i].begin != want[i].begin || got[i].end != want[i].end) return false;
  }
  return true;
}
}  // namespace

TEST_CASE("auto picks staged where discard works, migrate elsewhere", "[plan]") {
  CHECK(uvm::choose_strategy(UVM_STRATEGY_AUTO, true) == UVM_STRATEGY_STAGED);
  CHECK(uvm::choose_strategy(UVM_STRATEGY_AUTO, false) == UVM_STRATEGY_MIGRATE);
  CHECK(uvm::choose_strategy(UVM_STRATEGY_MIGRATE, true) == UVM_STRATEGY_MIGRATE);
  CHECK(uvm::choose_strategy(UVM_STRATEGY_STAGED, false) == UVM_STRATEGY_STAGED);  // refused later
}

TEST_CASE("subtract leaves the parts nothing covers", "[plan]") {
  CHECK(same(uvm::subtract(span(100, 200), {}), {span(100, 200)}));
  CHECK(same(uvm::subtract(span(100, 200), {span(100, 200)}), {}));
  CHECK(same(uvm::subtract(span(100, 200), {span(50, 120), span(150, 160), span(190, 300)}),
             {span(120, 150), span(160, 190)}));
  CHECK(same(uvm::subtract(span(100, 200), {span(0, 100), span(200, 300)}), {span(100, 200)}));
}

namespace {
// A piece of `allocation`, held by the driver allocation `memory` (a slab; by default its own).
uvm::CopyPiece piece(uintptr_t begin, uintptr_t end, uintptr_t allocation = 1, uintptr_t memory = 0) {
  return uvm::CopyPiece{span(begin, end), allocation, reinterpret_cast<const char*>(begin + 100000),
                        memory != 0 ? memory : allocation};
}

// Every byte of every piece is copied exactly once, from its own host byte, and nothing else.
void check_exact(const std::vector<uvm::OnloadChunk>& chunks, const std::vector<uvm::CopyPiece>& pieces) {
  size_t copied = 0, wanted = 0;
  for (const auto& p : pieces) wanted += p.span.size();
  for (const auto& chunk : chunks) {
    for (const auto& copy : chunk.copies) {
      copied += copy.span.size();
      CHECK(copy.span.begin >= chunk.populate.begin);
      CHECK(copy.span.end <= chunk.populate.end);
      CHECK(copy.host == reinterpret_cast<const char*>(copy.span.begin + 100000));
      bool inside_a_piece = false;
      for (const auto& p : pieces) inside_a_piece |= copy.span.begin >= p.span.begin && copy.span.end <= p.span.end;
      CHECK(inside_a_piece);
    }
  }
  CHECK(copied == wanted);
}
}  // namespace

TEST_CASE("onload chunks: touching pieces share one, a gap never is populated", "[plan]") {
  const std::vector<uvm::CopyPiece> pieces = {piece(0, 100), piece(100, 600), piece(612, 1000), piece(3000, 3100)};
  const auto chunks = uvm::plan_onload(pieces, 1 << 20);
  REQUIRE(chunks.size() == 3);
  CHECK(chunks[0].populate.begin == 0);
  CHECK(chunks[0].populate.end == 600);
  CHECK(chunks[0].copies.size() == 2);
  CHECK(chunks[1].populate.begin == 612);
  CHECK(chunks[2].populate.end == 3100);
  check_exact(chunks, pieces);
  const std::vector<uvm::CopyPiece> two = {piece(0, 100, 1), piece(100, 200, 2)};
  CHECK(uvm::plan_onload(two, 1 << 20).size() == 2);  // two driver allocations never share a chunk
  // Slots of one slab (alloc/slabs.hpp) that touch share one: one prefetch populates them.
  const std::vector<uvm::CopyPiece> slots = {piece(0, 100, 1, 9), piece(100, 200, 2, 9), piece(200, 300, 3, 10),
                                             piece(300, 400, 4, 10), piece(450, 500, 5, 10)};
  const auto slotted = uvm::plan_onload(slots, 1 << 20);
  REQUIRE(slotted.size() == 3);
  CHECK(slotted[0].populate.begin == 0);
  CHECK(slotted[0].populate.end == 200);
  REQUIRE(slotted[0].copies.size() == 2);
  CHECK(slotted[0].copies[1].allocation == 2);  // each copy still knows its own allocation
  CHECK(slotted[1].populate.begin == 200);      // touching, but another slab
  CHECK(slotted[1].populate.end == 400);
  CHECK(slotted[2].populate.begin == 450);      // the same slab, after a gap: never populated
  check_exact(slotted, slots);
  const std::vector<uvm::CopyPiece> long_ones = {piece(0, 250), piece(250, 270), piece(300, 700)};
  const auto cut = uvm::plan_onload(long_ones, 100);
  for (const auto& chunk : cut) CHECK(chunk.populate.size() <= 100);
  CHECK(cut.size() == 7);  // [0,100) [100,200) [200,270) [300,400) [400,500) [500,600) [600,700)
  check_exact(cut, long_ones);
  CHECK(uvm::plan_onload({}, 100).empty());
}

TEST_CASE("one copy takes the pieces that follow each other on the device and in staging", "[plan]") {
  // piece(): host = device address + 100000, so pieces that touch on the device touch in staging.
  const std::vector<uvm::CopyPiece> pieces = {piece(0, 100, 1, 9), piece(100, 200, 2, 9), piece(200, 300, 3, 10),
                                              piece(300, 400, 4, 10), piece(500, 600, 5, 10), piece(600, 700, 6, 10)};
  const auto anywhere = [](const char*, size_t) { return true; };
  const auto ends = [](const std::vector<uvm::CopyRun>& runs) {
    std::vector<size_t> found;
    for (const auto& run : runs) found.push_back(run.end);
    return found;
  };
  // Two slots of slab 9 (slab 10 is another allocation), then a gap on the device.
  const auto runs = uvm::copy_runs(pieces, anywhere);
  CHECK(ends(runs) == std::vector<size_t>{2, 4, 6});
  REQUIRE(runs.size() == 3);
  CHECK(runs[1].first == 2);
  CHECK(runs[1].bytes == 200);
  auto moved = pieces;
  moved[1].host += 8;  // apart in staging
  CHECK(ends(uvm::copy_runs(moved, anywhere)) == std::vector<size_t>{1, 2, 4, 6});
  const auto at_most_150 = [](const char*, size_t bytes) { return bytes <= 150; };  // a registration ends
  CHECK(ends(uvm::copy_runs(pieces, at_most_150)) == std::vector<size_t>{1, 2, 3, 4, 5, 6});
  CHECK(uvm::copy_runs({}, anywhere).empty());
}

TEST_CASE("a range splits into its staged pieces, its free space and the rest, every byte once", "[plan]") {
  const auto split = uvm::split_range(span(0, 1000), {span(600, 700), span(100, 200)}, {span(900, 1000), span(300, 350)});
  CHECK(same(split.staged, {span(100, 200), span(600, 700)}));
  CHECK(same(split.free, {span(300, 350), span(900, 1000)}));
  CHECK(same(split.rest, {span(0, 100), span(200, 300), span(350, 600), span(700, 900)}));
  CHECK(same(uvm::split_range(span(0, 10), {}, {}).rest, {span(0, 10)}));
  CHECK(uvm::split_range(span(0, 10), {span(0, 4)}, {span(4, 10)}).rest.empty());
}

TEST_CASE("plan_spill cuts items into chunks that fit a buffer with their I/O widened, and packs them", "[plan][spill]") {
  constexpr size_t kBuffer = 64 * 1024, kAlign = 4096;
  // One item at an aligned offset longer than two buffers, then two small ones of another target.
  const std::vector<uvm::SpillItem> items = {
      {uvm::Span{0x100000, 0x100000 + 150000}, 0, 0},
      {uvm::Span{0x200000, 0x200000 + 100}, 1, 5000},  // unaligned: its I/O widens to [4096, 8192)
      {uvm::Span{0x300000, 0x300000 + 10}, 1, 8190},   // crosses a 4 KiB boundary: [4096, 12288)
  };
  const auto batches = uvm::plan_spill(items, kBuffer, kAlign);
  size_t covered = 0;
  for (const auto& batch : batches) {
    size_t used = 0;
    for (const auto& chunk : batch.chunks) {
      CHECK(chunk.io_begin % kAlign == 0);
      CHECK(chunk.io_bytes % kAlign == 0);
      CHECK(chunk.io_begin <= chunk.offset);
      CHECK(chunk.offset + chunk.span.size() <= chunk.io_begin + chunk.io_bytes);
      CHECK(chunk.bounce == used);  // packed end to end
      used += chunk.io_bytes;
      covered += chunk.span.size();
      CHECK(chunk.target == items[chunk.item].target);
      CHECK(chunk.offset - items[chunk.item].offset == chunk.span.begin - items[chunk.item].span.begin);
    }
    CHECK(used <= kBuffer);
  }
  CHECK(covered == 150000 + 100 + 10);
  // The long item: starting aligned, its chunks fill the buffer and the next ones start aligned.
  CHECK(batches[0].chunks[0].span.size() == kBuffer);
  CHECK(batches[1].chunks[0].offset == kBuffer);
  CHECK(batches[2].chunks[0].span.size() == 150000 - 2 * kBuffer);
  // An item starting unaligned takes buffer - align at most: room for its widening.
  const auto unaligned = uvm::plan_spill({{uvm::Span{0x100000, 0x100000 + 150000}, 0, 100}}, kBuffer, kAlign);
  CHECK(unaligned[0].chunks[0].span.size() == kBuffer - kAlign);
  CHECK(unaligned[0].chunks[0].io_bytes == kBuffer);
  CHECK(batches.back().chunks.back().io_begin == 4096);
  CHECK(batches.back().chunks.back().io_bytes == 8192);
  // Without alignment (pageable copies) the I/O is the chunk itself.
  for (const auto& batch : uvm::plan_spill(items, kBuffer, 1)) {
    for (const auto& chunk : batch.chunks) {
      CHECK(chunk.io_begin == chunk.offset);
      CHECK(chunk.io_bytes == chunk.span.size());
    }
  }
  CHECK(uvm::plan_spill({}, kBuffer, kAlign).empty());
}

TEST_CASE("lay_out_copies gives each allocation one copy, its pieces at aligned offsets", "[plan][spill]") {
  const std::vector<uvm::Span> pieces = {{0x1000, 0x1010}, {0x2000, 0x3001}, {0x9000, 0x9100}, {0x4000, 0x5000}};
  const std::vector<uintptr_t> allocations = {0x1000, 0x1000, 0x9000, 0x1000};
  const uvm::CopyLayout layout = uvm::lay_out_copies(pieces, allocations, 4096);
  CHECK(layout.target_allocations == std::vector<uintptr_t>{0x1000, 0x9000});
  CHECK(layout.target_bytes == std::vector<uint64_t>{4096 + 8192 + 4096, 4096});
  CHECK(layout.items[0].offset == 0);
  CHECK(layout.items[1].offset == 4096);
  CHECK(layout.items[2].target == 1);
  CHECK(layout.items[2].offset == 0);
  CHECK(layout.items[3].offset == 4096 + 8192);
}
