// Offload/onload planning: strategy choice, what is left to move, how the pipeline cuts work.
#include "../../offload/plan.hpp"

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

TEST_CASE("split_into_chunks cuts each span, keeping order and every byte", "[plan]") {
  const auto chunks = uvm::split_into_chunks({span(0, 250), span(1000, 1100)}, 100);
  CHECK(same(chunks, {span(0, 100), span(100, 200), span(200, 250), span(1000, 1100)}));
  CHECK(uvm::split_into_chunks({}, 100).empty());
}

TEST_CASE("the onload pipeline reads its env, keeping defaults for bad values", "[plan]") {
  const auto defaults = uvm::parse_onload_pipeline(nullptr, nullptr);
  CHECK(defaults.chunk_bytes == (size_t{64} << 20));
  CHECK(defaults.streams == 4);
  const auto set = uvm::parse_onload_pipeline("16", "4");
  CHECK(set.chunk_bytes == (size_t{16} << 20));
  CHECK(set.streams == 4);
  CHECK(uvm::parse_onload_pipeline("0", "9").chunk_bytes == defaults.chunk_bytes);
  CHECK(uvm::parse_onload_pipeline("12x", "9").streams == defaults.streams);
}

namespace {
uvm::CopyPiece piece(uintptr_t begin, uintptr_t end, uintptr_t allocation = 1, bool managed = true) {
  return uvm::CopyPiece{span(begin, end), allocation, reinterpret_cast<const char*>(begin + 100000), managed};
}

// Every byte of every piece is copied exactly once, from its own host byte, inside a populate
// range of its chunk; the populate ranges cover exactly the copied bytes (never a gap) and each
// lies inside one piece's allocation; no chunk is over `chunk_bytes`, and a releasable
// allocation's chunk holds nothing else.
void check_exact(const std::vector<uvm::OnloadChunk>& chunks, const std::vector<uvm::CopyPiece>& pieces,
                 size_t chunk_bytes) {
  size_t copied = 0, wanted = 0;
  for (const auto& p : pieces) wanted += p.span.size();
  for (const auto& chunk : chunks) {
    size_t in_chunk = 0;
    CHECK(chunk.bytes() <= chunk_bytes);
    for (const auto& copy : chunk.copies) {
      copied += copy.span.size();
      in_chunk += copy.span.size();
      bool inside_populate = false;
      for (const auto& range : chunk.populate) inside_populate |= copy.span.begin >= range.begin && copy.span.end <= range.end;
      CHECK(inside_populate);
      CHECK(copy.host == reinterpret_cast<const char*>(copy.span.begin + 100000));
      const uvm::CopyPiece* owner = nullptr;
      for (const auto& p : pieces) {
        if (copy.span.begin >= p.span.begin && copy.span.end <= p.span.end) owner = &p;
      }
      REQUIRE(owner != nullptr);
      CHECK(copy.allocation == owner->allocation);
      CHECK(copy.managed == owner->managed);
      if (!copy.managed) CHECK(copy.allocation == chunk.copies.front().allocation);
      CHECK(copy.managed == chunk.copies.front().managed);
    }
    CHECK(chunk.bytes() == in_chunk);  // populate ranges hold the copies and nothing else
    for (const auto& range : chunk.populate) {  // inside one allocation: the copies in it share one
      uintptr_t allocation = 0;
      for (const auto& copy : chunk.copies) {
        if (copy.span.begin < range.begin || copy.span.end > range.end) continue;
        if (allocation == 0) allocation = copy.allocation;
        CHECK(copy.allocation == allocation);
      }
      CHECK(allocation != 0);
    }
  }
  CHECK(copied == wanted);
}
}  // namespace

TEST_CASE("onload chunks: touching pieces share a populate range, a gap never is populated", "[plan]") {
  const std::vector<uvm::CopyPiece> pieces = {piece(0, 100), piece(100, 600), piece(612, 1000), piece(3000, 3100)};
  const auto chunks = uvm::plan_onload(pieces, 1 << 20);
  REQUIRE(chunks.size() == 1);
  CHECK(same(chunks[0].populate, {span(0, 600), span(612, 1000), span(3000, 3100)}));
  CHECK(chunks[0].copies.size() == 4);
  check_exact(chunks, pieces, 1 << 20);
  const std::vector<uvm::CopyPiece> long_ones = {piece(0, 250), piece(250, 270), piece(300, 700)};
  const auto cut = uvm::plan_onload(long_ones, 100);
  // [0,100) [100,200) [200,270)+[300,330) [330,430) [430,530) [530,630) [630,700)
  REQUIRE(cut.size() == 7);
  CHECK(same(cut[2].populate, {span(200, 270), span(300, 330)}));
  check_exact(cut, long_ones, 100);
  CHECK(uvm::plan_onload({}, 100).empty());
}

TEST_CASE("onload chunks: small managed allocations share chunks, releasable ones never", "[plan]") {
  // PyTorch's small tensors: 2 MiB segments, each its own allocation, end to end.
  std::vector<uvm::CopyPiece> segments;
  for (uintptr_t i = 0; i < 100; ++i) segments.push_back(piece(i * 2048, (i + 1) * 2048, i + 1));
  const auto chunks = uvm::plan_onload(segments, 64 * 1024);
  REQUIRE(chunks.size() == 4);  // 32 segments a chunk, then 4
  CHECK(chunks[0].populate.size() == 32);  // touching, but of different allocations: not merged
  CHECK(chunks[3].populate.size() == 4);
  check_exact(chunks, segments, 64 * 1024);

  const std::vector<uvm::CopyPiece> mixed = {piece(0, 100, 1, false), piece(100, 200, 1, false),
                                             piece(200, 300, 2, false), piece(300, 400, 3), piece(400, 500, 4),
                                             piece(500, 600, 5, false)};
  const auto split = uvm::plan_onload(mixed, 1 << 20);
  REQUIRE(split.size() == 4);
  CHECK(same(split[0].populate, {span(0, 200)}));
  CHECK(same(split[1].populate, {span(200, 300)}));
  CHECK(same(split[2].populate, {span(300, 400), span(400, 500)}));
  CHECK(same(split[3].populate, {span(500, 600)}));
  check_exact(split, mixed, 1 << 20);
}

TEST_CASE("onload prefetches a chunk in one batch unless UVM_ONLOAD_PREFETCH=each", "[plan]") {
  CHECK(uvm::parse_onload_pipeline(nullptr, nullptr, nullptr).batch_prefetch);
  CHECK(uvm::parse_onload_pipeline(nullptr, nullptr, "batch").batch_prefetch);
  CHECK_FALSE(uvm::parse_onload_pipeline(nullptr, nullptr, "each").batch_prefetch);
}
