// uvm_offload_selection, uvm_onload_selection and uvm_discard_selection (offload/moves/selection.cpp):
// whole allocations by device and tag, chosen where each device's move begins.
#include <cstring>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "fixture.hpp"

namespace {
constexpr size_t kMiB = size_t{1} << 20;
constexpr size_t kSlot = 2 * kMiB;  // a slab slot (alloc/slabs.hpp): a freed one is handed out again

// A managed allocation under `tag`, filled with a pattern of `seed`.
struct Tagged {
  Tagged(const char* tag, size_t size, int device, unsigned seed) : size(size), device(device), seed(seed) {
    REQUIRE(uvm_set_thread_tag(tag) == UVM_OK);
    ptr = static_cast<unsigned char*>(uvm_malloc(size, device, nullptr));
    REQUIRE(uvm_set_thread_tag(nullptr) == UVM_OK);
    REQUIRE(ptr != nullptr);
    for (size_t i = 0; i < size; ++i) ptr[i] = expected(i);
  }
  ~Tagged() {
    if (ptr != nullptr) uvm_free(ptr, size, device, nullptr);
  }
  unsigned char expected(size_t i) const { return static_cast<unsigned char>(i * 11 + seed); }
  bool intact() const {
    for (size_t i = 0; i < size; ++i) {
      if (ptr[i] != expected(i)) return false;
    }
    return true;
  }
  unsigned char* ptr = nullptr;
  size_t size;
  int device;
  unsigned seed;
};

std::unique_ptr<Releasable> releasable_tagged(const char* tag, int device, unsigned seed) {
  REQUIRE(uvm_set_thread_tag(tag) == UVM_OK);
  auto memory = std::make_unique<Releasable>(kMiB, device, seed);
  REQUIRE(uvm_set_thread_tag(nullptr) == UVM_OK);
  return memory;
}

// One tag, as the selection calls take a list of them.
struct Tags {
  const char* tag;
  const char* const* list() const { return &tag; }
};

std::string last_call(int device) {
  uvm_move_report report{};
  REQUIRE(uvm_last_move(device, &report) == UVM_OK);
  return report.call == nullptr ? std::string() : std::string(report.call);
}
}  // namespace

TEST_CASE("a tag's allocations go off the device and come back whole; other tags are not touched",
          "[selection][cuda13]") {
  FakeMachine machine;
  Tagged weights("weights", kMiB, 0, 1), more_weights("weights", 3 * kMiB, 0, 2), cache("kv", kMiB, 0, 3);
  auto mapped = releasable_tagged("weights", 0, 4);
  cudaStream_t stream = fake::make_stream();
  size_t bytes = 0;
  REQUIRE(uvm_offload_selection(0, Tags{"weights"}.list(), 1, UVM_STRATEGY_STAGED, stream, &bytes) == UVM_OK);
  CHECK(bytes == 5 * kMiB);
  CHECK(residency(0, "weights").staged_bytes == 5 * kMiB);
  CHECK(residency(0, "weights").released_bytes == kMiB);
  CHECK(residency(0, "kv").device_bytes == kMiB);
  CHECK(cache.intact());
  for (const fake::Op& op : FakeMachine::ops_named(fake::OpKind::copy_to_host)) CHECK(op.ptr != cache.ptr);

  REQUIRE(uvm_onload_selection(0, Tags{"weights"}.list(), 1, stream, &bytes) == UVM_OK);
  CHECK(bytes == 5 * kMiB);
  CHECK(weights.intact());
  CHECK(more_weights.intact());
  CHECK(mapped->intact());
  CHECK(residency(0, "weights").device_bytes == 5 * kMiB);
  CHECK(residency(0, "weights").staged_bytes == 0);
  CHECK(last_call(0) == "uvm_onload_selection");
  CHECK(cudaPeekAtLastError() == cudaSuccess);
}

TEST_CASE("several tags move in one call, one move per device: untagged and unknown tags included",
          "[selection][cuda13]") {
  FakeMachine machine;
  Tagged weights("weights", kMiB, 0, 20), cache("kv", 2 * kMiB, 0, 21), untagged(nullptr, kMiB, 0, 22),
      other("other", kMiB, 0, 23);
  const char* tags[] = {"weights", "kv", "", "never-used-tag"};
  fake::reset_ops();
  size_t bytes = 0;
  REQUIRE(uvm_offload_selection(0, tags, 4, UVM_STRATEGY_STAGED, nullptr, &bytes) == UVM_OK);
  CHECK(bytes == 4 * kMiB);
  uvm_move_report report{};
  REQUIRE(uvm_last_move(0, &report) == UVM_OK);
  CHECK(report.bytes == 4 * kMiB);  // one move for all three tags
  CHECK(residency(0, "other").device_bytes == kMiB);
  CHECK(other.intact());
  REQUIRE(uvm_onload_selection(0, tags, 3, nullptr, &bytes) == UVM_OK);
  CHECK(bytes == 4 * kMiB);
  CHECK(weights.intact());
  CHECK(cache.intact());
  CHECK(untagged.intact());
  CHECK(residency(0).staged_bytes == 0);
}

TEST_CASE("every strategy moves a selection, and a discard drops only the selection", "[selection][cuda13]") {
  FakeMachine machine;
  test_disk_dir();
  Tagged kept("kept", kMiB, 0, 5), neighbour("other", kMiB, 0, 6);
  for (uvm_strategy strategy :
       {UVM_STRATEGY_AUTO, UVM_STRATEGY_STAGED, UVM_STRATEGY_MIGRATE, UVM_STRATEGY_MMAP, UVM_STRATEGY_DISK}) {
    INFO("strategy " << static_cast<int>(strategy));
    REQUIRE(uvm_offload_selection(0, Tags{"kept"}.list(), 1, strategy, nullptr, nullptr) == UVM_OK);
    CHECK(residency(0, "kept").host_bytes == kMiB);
    REQUIRE(uvm_onload_selection(0, Tags{"kept"}.list(), 1, nullptr, nullptr) == UVM_OK);
    CHECK(kept.intact());
    CHECK(kept_copies(0, "kept").disk_files == 0);
  }
  size_t bytes = 0;
  REQUIRE(uvm_discard_selection(0, Tags{"kept"}.list(), 1, nullptr, &bytes) == UVM_OK);
  CHECK(bytes == kMiB);
  CHECK(residency(0, "kept").discarded_bytes == kMiB);
  CHECK(neighbour.intact());
  CHECK(residency(0, "other").discarded_bytes == 0);
  CHECK(last_call(0) == "uvm_discard_selection");
}

TEST_CASE("a device's selection moves that device's allocations, each device in its own context",
          "[selection][cuda13]") {
  FakeMachine machine;
  Tagged on0("layers", kMiB, 0, 7), on1("layers", 2 * kMiB, 1, 8), untagged(nullptr, kMiB, 1, 9);
  size_t bytes = 0;
  SECTION("one device, any tag") {
    REQUIRE(uvm_offload_selection(1, nullptr, 0, UVM_STRATEGY_AUTO, nullptr, &bytes) == UVM_OK);
    CHECK(bytes == 3 * kMiB);
    CHECK(residency(1).staged_bytes == 3 * kMiB);
    CHECK(residency(0).device_bytes == kMiB);
    CHECK(last_call(1) == "uvm_offload_selection");
  }
  SECTION("untagged only") {
    REQUIRE(uvm_offload_selection(1, Tags{""}.list(), 1, UVM_STRATEGY_AUTO, nullptr, &bytes) == UVM_OK);
    CHECK(bytes == kMiB);
    CHECK(residency(1, "").staged_bytes == kMiB);
    CHECK(residency(1, "layers").device_bytes == 2 * kMiB);
  }
  SECTION("every device: one move each, in its context, on its own legacy stream") {
    fake::set_thread_context(2);  // the caller's context is neither device's
    REQUIRE(uvm_offload_selection(UVM_ANY_DEVICE, Tags{"layers"}.list(), 1, UVM_STRATEGY_STAGED, nullptr, &bytes) == UVM_OK);
    CHECK(bytes == 3 * kMiB);
    const auto copies = FakeMachine::ops_named(fake::OpKind::copy_to_host);
    REQUIRE(copies.size() == 2);
    for (const fake::Op& op : copies) CHECK(op.context_device == (op.ptr == on0.ptr ? 0 : 1));
    CHECK(fake::current_context() == 2);  // given back
    CHECK(last_call(0) == "uvm_offload_selection");
    CHECK(last_call(1) == "uvm_offload_selection");
    REQUIRE(uvm_onload_selection(UVM_ANY_DEVICE, Tags{"layers"}.list(), 1, cudaStreamPerThread, &bytes) == UVM_OK);
    CHECK(bytes == 3 * kMiB);
  }
  REQUIRE(uvm_onload_selection(UVM_ANY_DEVICE, nullptr, 0, nullptr, nullptr) == UVM_OK);
  CHECK(on0.intact());
  CHECK(on1.intact());
  CHECK(untagged.intact());
}

TEST_CASE("a selection of nothing does nothing and touches no device", "[selection]") {
  FakeMachine machine;
  Tagged elsewhere("weights", kMiB, 0, 10);
  fake::reset_ops();
  size_t bytes = 99;
  CHECK(uvm_offload_selection(UVM_ANY_DEVICE, Tags{"never-used-tag"}.list(), 1, UVM_STRATEGY_AUTO, nullptr, &bytes) == UVM_OK);
  CHECK(bytes == 0);
  CHECK(uvm_onload_selection(1, Tags{"weights"}.list(), 1, nullptr, &bytes) == UVM_OK);  // none of it on device 1
  CHECK(uvm_discard_selection(2, nullptr, 0, nullptr, nullptr) == UVM_OK);
  CHECK(fake::ops().empty());
  CHECK(elsewhere.intact());
}

TEST_CASE("bad selection arguments are refused by name before anything moves", "[selection]") {
  FakeMachine machine;
  Tagged weights("weights", kMiB, 0, 11);
  fake::reset_ops();
  const cudaStream_t stream = fake::make_stream();
  CHECK(uvm_offload_selection(UVM_ANY_DEVICE, Tags{"weights"}.list(), 1, UVM_STRATEGY_AUTO, stream, nullptr) ==
        UVM_ERROR_INVALID_ARGUMENT);
  CHECK_THAT(last_error(), Has("uvm_offload_selection(device=any, tags=\"weights\")"));
  CHECK_THAT(last_error(), Has("belongs to one device"));
  CHECK(uvm_onload_selection(7, nullptr, 0, nullptr, nullptr) == UVM_ERROR_INVALID_ARGUMENT);
  CHECK_THAT(last_error(), Has("uvm_onload_selection(device=7, tags=any)"));
  size_t bytes = 5;
  CHECK(uvm_offload_selection(0, Tags{"no-such-tag"}.list(), 1, static_cast<uvm_strategy>(9), nullptr, &bytes) ==
        UVM_ERROR_INVALID_ARGUMENT);
  CHECK_THAT(last_error(), Has("strategy 9 is not a uvm_strategy"));
  CHECK(uvm_onload_selection(0, nullptr, 2, nullptr, nullptr) == UVM_ERROR_INVALID_ARGUMENT);
  CHECK_THAT(last_error(), Has("tags is NULL but tag_count is 2"));
  const char* with_null[] = {"weights", nullptr};
  CHECK(uvm_discard_selection(0, with_null, 2, nullptr, nullptr) == UVM_ERROR_INVALID_ARGUMENT);
  CHECK_THAT(last_error(), Has("uvm_discard_selection(device=0, tags=\"weights\", NULL)") && Has("tags[1] is NULL"));
  CHECK(bytes == 0);
  CHECK(fake::ops().empty());
  CHECK(weights.intact());
  CHECK(cudaPeekAtLastError() == cudaSuccess);
}

TEST_CASE("an offload of a tag takes no allocation made at a freed address while it pins staging",
          "[selection][cuda13]") {
  // A first offload pins its staging memory with the moves lock let go, then begins again. If
  // another thread frees one of the tag's allocations meanwhile and the address goes to an
  // allocation of another tag, the offload must move neither: it selects again when it begins
  // again. (Listing the tag's ranges first and offloading them would move the new one.)
  FakeMachine machine;
  REQUIRE(uvm_release_staging() == UVM_OK);
  uvm_staging_info staging{};
  REQUIRE(uvm_get_staging_info(&staging) == UVM_OK);
  REQUIRE(staging.capacity_bytes == 0);
  const char* pinning = staging.configured_kind == UVM_PINNED_HOST_ALLOC ? "cudaHostAlloc" : "cudaHostRegister";
  auto freed = std::make_unique<Tagged>("scratch", kSlot, 0, 12);
  Tagged stays("scratch", kMiB, 0, 13), neighbour(nullptr, kSlot, 0, 14);  // the neighbour keeps the slab
  fake::hold_next(pinning);
  uvm_status offloaded = UVM_ERROR_CUDA;
  TestThread offloader([&] {
    fake::set_thread_context(0);
    offloaded = uvm_offload_selection(0, Tags{"scratch"}.list(), 1, UVM_STRATEGY_STAGED, nullptr, nullptr);
  });
  REQUIRE(fake::wait_until_held());
  unsigned char* const address = freed->ptr;
  freed.reset();
  Tagged taken("weights", kSlot, 0, 15);
  INFO("the new allocation took the freed address: " << (taken.ptr == address));
  fake::release_held();
  offloader.join();
  CHECK(offloaded == UVM_OK);
  CHECK(taken.intact());
  CHECK(residency(0, "weights").device_bytes == kSlot);
  CHECK(residency(0, "scratch").staged_bytes == kMiB);
  REQUIRE(uvm_onload_selection(0, Tags{"scratch"}.list(), 1, nullptr, nullptr) == UVM_OK);
  CHECK(stays.intact());
  CHECK(neighbour.intact());
}
