// The process-wide tag table: UVM_MAX_TAGS distinct names and no more. Run alone (meson test
// alloc-tag-limit), since it fills the table for the rest of the process.
#include <string>

#include "fixture.hpp"

TEST_CASE("exactly UVM_MAX_TAGS distinct tags fit; the next is refused by name", "[tag_limit][scenario]") {
  FakeMachine machine;
  REQUIRE(uvm_tag_count() == 0);
  for (int i = 0; i < UVM_MAX_TAGS; ++i) {
    const std::string name = "tag-" + std::to_string(i);
    REQUIRE(uvm_set_thread_tag(name.c_str()) == UVM_OK);
  }
  CHECK(uvm_tag_count() == UVM_MAX_TAGS);
  CHECK(uvm_set_thread_tag("one-too-many") == UVM_ERROR_INVALID_ARGUMENT);
  CHECK_THAT(last_error(), Has("\"one-too-many\" would be past the 256 distinct tags"));
  CHECK(std::string(uvm_get_thread_tag()) == "tag-255");  // the failed call changed nothing
  CHECK(uvm_set_thread_tag("tag-7") == UVM_OK);            // known names still work
  CHECK(uvm_tag_count() == UVM_MAX_TAGS);
  CHECK(std::string(uvm_tag_name(UVM_MAX_TAGS - 1)) == "tag-255");
  CHECK(uvm_tag_name(UVM_MAX_TAGS) == nullptr);
  uvm_set_thread_tag(nullptr);
}
