// Offload/onload planning: strategy choice, what is left to move, how the pipeline cuts work.
#include "../../hints/plan.hpp"

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
