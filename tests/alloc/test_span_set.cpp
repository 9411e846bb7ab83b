// SpanSet (alloc/span_set.cpp): the byte ranges the registry keeps per allocation.
#include "../../alloc/span_set.hpp"
#include "fixture.hpp"

TEST_CASE("span sets add, merge and remove exactly", "[spans]") {
  uvm::SpanSet spans;
  CHECK(spans.add(100, 200) == 100);
  CHECK(spans.add(150, 250) == 50);  // overlaps: only the new bytes count
  CHECK(spans.total() == 150);
  CHECK(spans.add(250, 300) == 50);  // touches: merged
  REQUIRE(spans.spans().size() == 1);
  CHECK(spans.spans()[0] == std::make_pair(size_t{100}, size_t{300}));
  CHECK(spans.add(0, 10) == 10);
  CHECK(spans.spans().size() == 2);
  CHECK(spans.remove(150, 160) == 10);  // splits
  CHECK(spans.spans().size() == 3);
  CHECK(spans.total() == 200);
  CHECK(spans.remove(5, 1000) == 195);
  CHECK(spans.total() == 5);
  CHECK(spans.add(10, 10) == 0);
  CHECK(spans.remove(7, 3) == 0);
  CHECK(spans.add(0, 400) == 395);
  CHECK(spans.spans().size() == 1);
}

TEST_CASE("overlaps says whether any byte of a range is in the set, gaps and edges included", "[spans]") {
  uvm::SpanSet set;
  set.add(100, 200);
  set.add(300, 400);
  CHECK(set.overlaps(150, 160));
  CHECK(set.overlaps(50, 101));
  CHECK(set.overlaps(199, 301));
  CHECK_FALSE(set.overlaps(200, 300));  // the gap, its edges touching both spans
  CHECK_FALSE(set.overlaps(0, 100));
  CHECK_FALSE(set.overlaps(400, 500));
  CHECK_FALSE(set.overlaps(150, 150));  // empty
  CHECK(set.first_ending_after(200)->first == 300);
  CHECK(set.first_ending_after(400) == set.spans().end());
}
