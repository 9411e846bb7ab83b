// Coalescing into the fewest, largest driver calls, and uvm_prefetch_ranges end to end.
#include <algorithm>
#include <random>

#include "../../hints/moves/ranges.hpp"
#include "fixture.hpp"

namespace {
uvm::HintRange range(uintptr_t begin, uintptr_t end, uintptr_t allocation) {
  return uvm::HintRange{begin, end, allocation, 0};
}
}  // namespace

TEST_CASE("coalesce sorts and merges inside one allocation", "[ranges]") {
  const auto merged = uvm::coalesce({range(300, 400, 100), range(100, 200, 100), range(200, 300, 100),
                                     range(150, 160, 100), range(350, 420, 100)});
  REQUIRE(merged.size() == 1);
  CHECK(merged[0].begin == 100);
  CHECK(merged[0].end == 420);
}

TEST_CASE("coalesce keeps gaps and allocation borders", "[ranges]") {
  SECTION("a gap") {
    const auto merged = uvm::coalesce({range(100, 200, 100), range(201, 300, 100)});
    CHECK(merged.size() == 2);
  }
  SECTION("touching ranges of two allocations stay two calls") {
    const auto merged = uvm::coalesce({range(100, 200, 100), range(200, 300, 200)});
    CHECK(merged.size() == 2);
  }
  SECTION("other managed memory merges only when it overlaps") {
    CHECK(uvm::coalesce({range(100, 200, 0), range(200, 300, 0)}).size() == 2);
    const auto merged = uvm::coalesce({range(100, 250, 0), range(200, 300, 0)});
    REQUIRE(merged.size() == 1);
    CHECK(merged[0].end == 300);
  }
  SECTION("nothing in, nothing out") { CHECK(uvm::coalesce({}).empty()); }
}

TEST_CASE("prefetch_ranges turns 1000 shuffled pieces into one driver call", "[ranges][prefetch]") {
  FakeMachine machine;
  constexpr size_t kPiece = 4096, kPieces = 1000;
  char* base = static_cast<char*>(uvm_malloc(kPiece * kPieces, 0, nullptr));
  REQUIRE(base != nullptr);
  std::vector<uvm_range> pieces;
  for (size_t i = 0; i < kPieces; ++i) pieces.push_back({base + i * kPiece, kPiece});
  std::shuffle(pieces.begin(), pieces.end(), std::mt19937(42));
  uvm_stats before{};
  REQUIRE(uvm_get_stats(0, &before) == UVM_OK);

  REQUIRE(uvm_prefetch_ranges(pieces.data(), pieces.size(), UVM_LOCATION_CPU, nullptr) == UVM_OK);
  const auto calls = FakeMachine::ops_named(fake::OpKind::prefetch);
  REQUIRE(calls.size() == 1);
  CHECK(calls[0].ptr == base);
  CHECK(calls[0].size == kPiece * kPieces);
  uvm_stats after{};
  REQUIRE(uvm_get_stats(0, &after) == UVM_OK);
  CHECK(after.prefetch_calls - before.prefetch_calls == 1);
  CHECK(after.bytes_to_host - before.bytes_to_host == kPiece * kPieces);
  uvm_free(base, kPiece * kPieces, 0, nullptr);
}

TEST_CASE("prefetch_ranges over several allocations issues one call each", "[ranges][prefetch]") {
  FakeMachine machine;
  char* a = static_cast<char*>(uvm_malloc(1 << 16, 0, nullptr));
  char* b = static_cast<char*>(uvm_malloc(1 << 16, 0, nullptr));
  REQUIRE(a != nullptr);
  REQUIRE(b != nullptr);
  const uvm_range ranges[] = {{b + 100, 900}, {a, 1 << 15}, {b, 100}, {a + (1 << 15), 1 << 15},
                              {a + 10, 0}, {b + 5000, 10}};
  REQUIRE(uvm_prefetch_ranges(ranges, 6, 0, nullptr) == UVM_OK);
  const auto calls = FakeMachine::ops_named(fake::OpKind::prefetch);
  REQUIRE(calls.size() == 3);  // all of a; b[0, 1000); b[5000, 5010)
  std::vector<std::pair<const void*, size_t>> seen;
  for (const auto& call : calls) seen.emplace_back(call.ptr, call.size);
  std::sort(seen.begin(), seen.end());
  std::vector<std::pair<const void*, size_t>> expected = {
      {a, size_t{1} << 16}, {b, 1000}, {b + 5000, 10}};
  std::sort(expected.begin(), expected.end());
  CHECK(seen == expected);
  uvm_free(a, 1 << 16, 0, nullptr);
  uvm_free(b, 1 << 16, 0, nullptr);
}

TEST_CASE("prefetch_ranges validates every range before issuing any", "[ranges][prefetch]") {
  FakeMachine machine;
  char* a = static_cast<char*>(uvm_malloc(1 << 16, 0, nullptr));
  REQUIRE(a != nullptr);
  std::vector<char> host(64);
  const uvm_range ranges[] = {{a, 4096}, {host.data(), host.size()}, {a + 8192, 4096}};
  CHECK(uvm_prefetch_ranges(ranges, 3, 0, nullptr) == UVM_ERROR_NOT_MANAGED);
  CHECK_THAT(last_error(), Has("uvm_prefetch_ranges(count=3, device=0): range 1 of 3 is invalid"));
  CHECK_THAT(last_error(), Has("not CUDA managed memory"));
  CHECK(uvm_last_error_index() == 1);  // the index a caller can use without parsing the message
  CHECK(FakeMachine::ops_named(fake::OpKind::prefetch).empty());

  CHECK(uvm_prefetch_ranges(nullptr, 2, 0, nullptr) == UVM_ERROR_INVALID_ARGUMENT);
  CHECK(uvm_prefetch_ranges(nullptr, 0, 0, nullptr) == UVM_OK);
  const uvm_range empty[] = {{a, 0}, {nullptr, 0}};
  CHECK(uvm_prefetch_ranges(empty, 2, 0, nullptr) == UVM_OK);
  CHECK(FakeMachine::ops_named(fake::OpKind::prefetch).empty());

  cudaStream_t stream = fake::make_stream();
  fake::set_capturing(stream, true);
  CHECK(uvm_prefetch_ranges(ranges, 1, 0, stream) == UVM_ERROR_CAPTURING);
  CHECK(FakeMachine::ops_named(fake::OpKind::prefetch).empty());
  uvm_free(a, 1 << 16, 0, nullptr);
}

TEST_CASE("prefetch_ranges to the CPU checks every owning device before issuing", "[ranges][prefetch]") {
  FakeMachine machine;
  char* on_device0 = static_cast<char*>(uvm_malloc(4096, 0, nullptr));
  char* on_device2 = static_cast<char*>(uvm_malloc(4096, 2, nullptr));  // no concurrent access
  REQUIRE(on_device0 != nullptr);
  REQUIRE(on_device2 != nullptr);
  const uvm_range ranges[] = {{on_device0, 4096}, {on_device2, 4096}};
  CHECK(uvm_prefetch_ranges(ranges, 2, UVM_LOCATION_CPU, nullptr) == UVM_ERROR_UNSUPPORTED);
  CHECK_THAT(last_error(), Has("device 2 lacks concurrentManagedAccess"));
  CHECK(FakeMachine::ops_named(fake::OpKind::prefetch).empty());
  uvm_free(on_device0, 4096, 0, nullptr);
  uvm_free(on_device2, 4096, 2, nullptr);
}
