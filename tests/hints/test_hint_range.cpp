// What every hint checks first (hints/hint_range.cpp): a range resolved to its allocation, owner and
// backing, refused by name when the driver would only say "invalid argument".
#include <cstdint>
#include <vector>

#include "../../hints/moves/hint_range.hpp"
#include "fixture.hpp"

namespace {
constexpr size_t kSize = 1 << 20;
const uvm::Call kCall = uvm::Call::of("test");
}  // namespace

TEST_CASE("a range inside a uvm allocation knows its base, device and backing", "[hint_range]") {
  FakeMachine machine;
  auto* managed = static_cast<char*>(uvm_malloc(kSize, 1, nullptr));
  auto* releasable = static_cast<char*>(uvm_malloc_releasable(kSize, 0, nullptr));
  REQUIRE((managed && releasable));
  uvm::HintRange range;
  REQUIRE(uvm::resolve_range(kCall, managed + 4096, 100, &range) == UVM_OK);
  CHECK(range.begin == reinterpret_cast<uintptr_t>(managed) + 4096);
  CHECK(range.end == range.begin + 100);
  CHECK(range.allocation == reinterpret_cast<uintptr_t>(managed));
  CHECK(range.owner_device == 1);
  CHECK_FALSE(range.releasable);
  CHECK(uvm::check_all_managed(kCall, {range}, "prefetch") == UVM_OK);

  REQUIRE(uvm::resolve_range(kCall, releasable, kSize, &range) == UVM_OK);
  CHECK(range.releasable);
  CHECK(range.owner_device == 0);
  CHECK(uvm::check_all_managed(kCall, {range}, "advise") == UVM_ERROR_NOT_MANAGED);
  CHECK_THAT(last_error(), Has("advise does not apply to it"));
  uvm_free(managed, kSize, 1, nullptr);
  uvm_free(releasable, kSize, 0, nullptr);
}

TEST_CASE("managed memory uvm did not allocate belongs to the caller's current device", "[hint_range]") {
  FakeMachine machine;
  void* other = nullptr;
  REQUIRE(cudaMallocManaged(&other, kSize, cudaMemAttachGlobal) == cudaSuccess);
  REQUIRE(cudaSetDevice(1) == cudaSuccess);
  uvm::HintRange range;
  REQUIRE(uvm::resolve_range(kCall, other, kSize, &range) == UVM_OK);
  CHECK(range.allocation == 0);
  CHECK(range.owner_device == 1);
  CHECK_FALSE(range.releasable);
  REQUIRE(cudaSetDevice(0) == cudaSuccess);
  REQUIRE(cudaFree(other) == cudaSuccess);
}

TEST_CASE("a range is refused by name before any driver call", "[hint_range]") {
  FakeMachine machine;
  auto* a = static_cast<char*>(uvm_malloc(kSize, 0, nullptr));
  REQUIRE(a != nullptr);
  std::vector<char> host(64);
  uvm::HintRange range;
  CHECK(uvm::resolve_range(kCall, nullptr, 16, &range) == UVM_ERROR_INVALID_ARGUMENT);
  CHECK_THAT(last_error(), Has("ptr is NULL"));
  CHECK(uvm::resolve_range(kCall, a, SIZE_MAX, &range) == UVM_ERROR_INVALID_ARGUMENT);
  CHECK_THAT(last_error(), Has("wraps around the address space"));
  CHECK(uvm::resolve_range(kCall, a + kSize - 8, 16, &range) == UVM_ERROR_INVALID_ARGUMENT);
  CHECK_THAT(last_error(), Has("range ends 8 bytes past the end of its uvm allocation"));
  CHECK(uvm::resolve_range(kCall, host.data(), host.size(), &range) == UVM_ERROR_NOT_MANAGED);
  CHECK(uvm::check_hint_support(kCall, 2) == UVM_ERROR_UNSUPPORTED);  // device 2: no concurrent access
  CHECK_THAT(last_error(), Has("device 2 lacks concurrentManagedAccess"));
  const cudaStream_t stream = fake::make_stream();
  fake::set_capturing(stream, true);
  CHECK(uvm::check_not_capturing(kCall, stream) == UVM_ERROR_CAPTURING);
  fake::set_capturing(stream, false);
  CHECK(uvm::check_not_capturing(kCall, stream) == UVM_OK);
  CHECK(uvm::deciding_device(UVM_LOCATION_CPU, uvm::HintRange{0, 1, 0, 1, false}) == 1);
  CHECK(uvm::deciding_device(0, uvm::HintRange{0, 1, 0, 1, false}) == 0);
  CHECK(cudaPeekAtLastError() == cudaSuccess);
  uvm_free(a, kSize, 0, nullptr);
}

TEST_CASE("memory uvm did not allocate whose pointer query fails is refused with the query's error, not as unmanaged",
          "[hint_range][errors]") {
  // Issue 58 item 5: a failed cudaPointerGetAttributes read as "not managed memory".
  FakeMachine machine;
  void* foreign = nullptr;
  REQUIRE(cudaMallocManaged(&foreign, kSize, cudaMemAttachGlobal) == cudaSuccess);
  fake::fail_next("cudaPointerGetAttributes", cudaErrorLaunchFailure);
  uvm_clear_last_error();
  CHECK(uvm_prefetch(foreign, kSize, 0, nullptr) == UVM_ERROR_CUDA);
  CHECK_THAT(last_error(), Has("cudaPointerGetAttributes(") && Has("cudaErrorLaunchFailure"));
  CHECK(cudaPeekAtLastError() == cudaSuccess);
  REQUIRE(uvm_prefetch(foreign, kSize, 0, nullptr) == UVM_OK);  // asked again, it is managed
  fake::fail_next("cudaPointerGetAttributes", cudaErrorLaunchFailure);
  CHECK(uvm_is_managed(foreign) == 0);  // an int has no error to give: "no", and nothing pending
  CHECK(cudaPeekAtLastError() == cudaSuccess);
  CHECK(uvm_is_managed(foreign) == 1);
  REQUIRE(cudaFree(foreign) == cudaSuccess);
}
