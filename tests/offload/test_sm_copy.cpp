// offload/moves/sm_copy.cpp against the fake driver, whose copy kernel copies as the GPU would (from pinned
// host memory into mapped device memory) and is logged as an sm_copy op. The [sm_copy] cases run
// with UVM_ONLOAD_COPY=sm (tests/meson.build: offload-sm-copy), [sm_copy_mixed] with mixed and 1 MiB
// chunks, [sm_copy_env] with a misspelt value, [sm_copy_auto] unset (auto), [sm_copy_default] unset
// and [sm_copy_refused] sm, both on devices too old for the kernel.
#include <string>
#include <utility>

#include "../../offload/moves/sm_copy.hpp"
#include "fixture.hpp"

namespace {
constexpr size_t kMiB = size_t{1} << 20;

}  // namespace

TEST_CASE("auto takes the kernel only when the device has more than 4 times the staged bytes free", "[offload]") {
  using uvm::OnloadCopy;
  const size_t staged = size_t{4158652416};  // the RL benchmark's weights
  CHECK(uvm::auto_copy(size_t{83722698752}, staged) == OnloadCopy::sm);      // after its 70 GB free (H100)
  CHECK(uvm::auto_copy(size_t{5484249088}, staged) == OnloadCopy::engine);   // on its full GPU (H100)
  CHECK(uvm::auto_copy(4 * staged + 4, staged) == OnloadCopy::sm);
  CHECK(uvm::auto_copy(4 * staged, staged) == OnloadCopy::engine);
  CHECK(uvm::auto_copy(0, staged) == OnloadCopy::engine);
  CHECK(uvm::auto_copy(size_t{1} << 20, 0) == OnloadCopy::sm);
}

TEST_CASE("mixed copies by kernel on every other worker stream and by engine on the rest", "[offload]") {
  using uvm::OnloadCopy;
  for (int worker = 0; worker < 8; ++worker) {
    CHECK(uvm::copy_for_worker(OnloadCopy::engine, worker) == OnloadCopy::engine);
    CHECK(uvm::copy_for_worker(OnloadCopy::sm, worker) == OnloadCopy::sm);
    CHECK(uvm::copy_for_worker(OnloadCopy::mixed, worker) == (worker % 2 ? OnloadCopy::sm : OnloadCopy::engine));
  }
}

TEST_CASE("the kernel takes only 16-byte words at 16-byte aligned ends", "[offload]") {
  alignas(16) static char host[64];
  char* device = reinterpret_cast<char*>(uintptr_t{1} << 40);
  CHECK(uvm::sm_copyable(device, host, 64));
  CHECK_FALSE(uvm::sm_copyable(device, host, 0));
  CHECK_FALSE(uvm::sm_copyable(device, host, 40));  // not whole words
  CHECK_FALSE(uvm::sm_copyable(device + 8, host, 48));
  CHECK_FALSE(uvm::sm_copyable(device, host + 4, 48));
}

// First of the [sm_copy] cases: the kernel is loaded once per device and process, so its load can
// fail only before any other case loaded it.
TEST_CASE("a kernel that cannot be loaded or launched fails the onload by name and loses nothing",
          "[scenario][sm_copy][cuda13]") {
  FakeMachine machine;
  Releasable a(2 * kMiB, 0, 7);
  cudaStream_t stream = fake::make_stream();
  const uvm_range whole = a.whole();
  // The kernel's function not found (its module loaded): the next onload loads it again.
  REQUIRE(uvm_offload_ranges(&whole, 1, UVM_STRATEGY_STAGED, stream) == UVM_OK);
  fake::fail_next("cuModuleGetFunction", cudaErrorInvalidValue);
  CHECK(uvm_onload_ranges(&whole, 1, stream) == UVM_ERROR_CUDA);
  CHECK(mentions(uvm_last_error(), "cuModuleGetFunction(uvm_copy_words"));
  CHECK(cudaPeekAtLastError() == cudaSuccess);
  CHECK(residency().staged_bytes == a.size);
  for (const char* call : {"cuModuleLoadData", "cuLaunchKernel"}) {
    INFO(call);
    REQUIRE(uvm_offload_ranges(&whole, 1, UVM_STRATEGY_STAGED, stream) == UVM_OK);
    fake::fail_next(call, cudaErrorInvalidValue);
    CHECK(uvm_onload_ranges(&whole, 1, stream) == UVM_ERROR_CUDA);
    CHECK(mentions(uvm_last_error(), call));
    CHECK(mentions(uvm_last_error(), "CUDA_ERROR_INVALID_VALUE"));
    CHECK(cudaPeekAtLastError() == cudaSuccess);
    CHECK(residency().staged_bytes == a.size);  // still staged: the next onload brings it back
    REQUIRE(uvm_onload_ranges(&whole, 1, stream) == UVM_OK);
    CHECK(a.intact());
  }
  REQUIRE(uvm_release_staging() == UVM_OK);
}

TEST_CASE("with UVM_ONLOAD_COPY=sm releasable memory comes back by the kernel, managed memory by the engine",
          "[scenario][sm_copy][cuda13]") {
  FakeMachine machine;
  Releasable a(4 * kMiB, 0, 5), b(2 * kMiB, 0, 9);
  void* managed_ptr = uvm_malloc(kMiB, 0, nullptr);
  REQUIRE(managed_ptr != nullptr);
  auto* managed = static_cast<unsigned char*>(managed_ptr);
  for (size_t i = 0; i < kMiB; ++i) managed[i] = static_cast<unsigned char>(i * 3 + 1);
  cudaStream_t stream = fake::make_stream();
  // All of a; of b a piece that starts off a 16-byte boundary and two neighbours that stay; the
  // managed allocation whole.
  const uvm_range moved[] = {a.whole(), b.part(1001, 1001 + 3 * 4096), uvm_range{managed, kMiB}};
  REQUIRE(uvm_offload_ranges(moved, 3, UVM_STRATEGY_STAGED, stream) == UVM_OK);
  fake::reset_ops();
  REQUIRE(uvm_onload_ranges(moved, 3, stream) == UVM_OK);
  INFO(uvm_last_error());
  const auto by_kernel = FakeMachine::ops_named(fake::OpKind::sm_copy);
  REQUIRE(by_kernel.size() >= 1);
  for (const fake::Op& op : by_kernel) {
    CHECK(op.ptr >= a.ptr);
    CHECK(static_cast<const unsigned char*>(op.ptr) + op.size <= a.ptr + a.size);  // only a is word-aligned
  }
  CHECK(FakeMachine::bytes_of(fake::OpKind::sm_copy) == a.size);
  // b's unaligned piece and the managed allocation
  CHECK(FakeMachine::bytes_of(fake::OpKind::copy_to_device) == 3 * 4096 + kMiB);
  CHECK(a.intact());
  CHECK(b.intact());  // the piece and both neighbours
  bool managed_intact = true;
  for (size_t i = 0; i < kMiB; ++i) managed_intact = managed_intact && managed[i] == static_cast<unsigned char>(i * 3 + 1);
  CHECK(managed_intact);
  CHECK(residency().staged_bytes == 0);
  uvm_free(managed_ptr, kMiB, 0, nullptr);
  REQUIRE(uvm_release_staging() == UVM_OK);
  CHECK(cudaPeekAtLastError() == cudaSuccess);
}

TEST_CASE("with UVM_ONLOAD_COPY=mixed the chunks of releasable memory alternate kernel and engine; no byte lost",
          "[scenario][sm_copy_mixed][cuda13]") {
  FakeMachine machine;
  Releasable a(8 * kMiB, 0, 13), b(2 * kMiB, 0, 17);
  cudaStream_t stream = fake::make_stream();
  const uvm_range moved[] = {a.whole(), b.part(4096, 4096 + kMiB)};  // b's first and last bytes stay
  REQUIRE(uvm_offload_ranges(moved, 2, UVM_STRATEGY_STAGED, stream) == UVM_OK);
  fake::reset_ops();
  REQUIRE(uvm_onload_ranges(moved, 2, stream) == UVM_OK);
  INFO(uvm_last_error());
  const size_t by_kernel = FakeMachine::bytes_of(fake::OpKind::sm_copy);
  const size_t by_engine = FakeMachine::bytes_of(fake::OpKind::copy_to_device);
  CHECK(by_kernel > 0);
  CHECK(by_engine > 0);
  CHECK(by_kernel + by_engine == a.size + kMiB);
  CHECK(a.intact());
  CHECK(b.intact());
  REQUIRE(uvm_release_staging() == UVM_OK);
}

TEST_CASE("with UVM_ONLOAD_COPY unset, a device too old for the kernel gets the copy engine, and no error",
          "[scenario][sm_copy_default][cuda13]") {
  FakeMachine machine;
  Releasable a(2 * kMiB, 0, 19);
  cudaStream_t stream = fake::make_stream();
  const uvm_range whole = a.whole();
  REQUIRE(uvm_offload_ranges(&whole, 1, UVM_STRATEGY_STAGED, stream) == UVM_OK);
  fake::reset_ops();
  uvm_clear_last_error();
  REQUIRE(uvm_onload_ranges(&whole, 1, stream) == UVM_OK);
  CHECK(FakeMachine::ops_named(fake::OpKind::sm_copy).empty());
  CHECK(FakeMachine::bytes_of(fake::OpKind::copy_to_device) == a.size);
  CHECK(std::string(uvm_last_error()).empty());  // falling back is not a failure
  CHECK(a.intact());
  CHECK(cudaPeekAtLastError() == cudaSuccess);
  REQUIRE(uvm_release_staging() == UVM_OK);
}

TEST_CASE("asked for on a device too old for it, the kernel fails the onload saying why; nothing is lost",
          "[scenario][sm_copy_refused][cuda13]") {
  FakeMachine machine;
  Releasable a(kMiB, 0, 23);
  cudaStream_t stream = fake::make_stream();
  const uvm_range whole = a.whole();
  REQUIRE(uvm_offload_ranges(&whole, 1, UVM_STRATEGY_STAGED, stream) == UVM_OK);
  CHECK(uvm_onload_ranges(&whole, 1, stream) == UVM_ERROR_UNSUPPORTED);
  CHECK(mentions(uvm_last_error(), "compute capability 7.0"));
  CHECK(mentions(uvm_last_error(), "UVM_ONLOAD_COPY=engine"));
  CHECK(residency().staged_bytes == a.size);
  CHECK(cudaPeekAtLastError() == cudaSuccess);
}

TEST_CASE("a misspelt UVM_ONLOAD_COPY is refused before anything is allocated, naming it", "[scenario][sm_copy_env][cuda13]") {
  FakeMachine machine;
  CHECK(uvm_malloc_releasable(kMiB, 0, nullptr) == nullptr);
  CHECK(mentions(uvm_last_error(), "UVM_ONLOAD_COPY='fast' is not understood; expected auto, engine, sm or mixed"));
  CHECK(FakeMachine::ops_named(fake::OpKind::vmm_create).empty());
  CHECK(cudaPeekAtLastError() == cudaSuccess);
}

TEST_CASE("auto copies by kernel while the device has room, by engine when it is nearly full, and by engine "
          "when cudaMemGetInfo fails; no byte lost",
          "[scenario][sm_copy_auto][cuda13]") {
  FakeMachine machine;  // device 0 has 1 GiB
  Releasable a(32 * kMiB, 0, 29), b(2 * kMiB, 0, 31);
  cudaStream_t stream = fake::make_stream();
  const uvm_range moved[] = {a.whole(), b.part(4096, 4096 + kMiB)};  // b's first and last bytes stay
  const auto cycle = [&](const char* why) {
    INFO(why << ": " << uvm_last_error());
    REQUIRE(uvm_offload_ranges(moved, 2, UVM_STRATEGY_STAGED, stream) == UVM_OK);
    fake::reset_ops();
    REQUIRE(uvm_onload_ranges(moved, 2, stream) == UVM_OK);
    CHECK(a.intact());
    CHECK(b.intact());
    CHECK(residency().staged_bytes == 0);
    CHECK(cudaPeekAtLastError() == cudaSuccess);
    return std::make_pair(FakeMachine::bytes_of(fake::OpKind::sm_copy),
                          FakeMachine::bytes_of(fake::OpKind::copy_to_device));
  };
  // Room: 1022 MiB free (b is mapped, a released) for 33 MiB staged.
  auto copied = cycle("room");
  CHECK(copied.first == a.size + kMiB);
  CHECK(copied.second == 0);
  // Nearly full: 900 MiB allocated by someone else (the fake counts any allocation as used) and b's
  // 2 MiB leave 122 MiB, under 4 × 33 MiB.
  void* filler = nullptr;
  REQUIRE(cudaMallocManaged(&filler, 900 * kMiB, cudaMemAttachGlobal) == cudaSuccess);
  copied = cycle("nearly full");
  CHECK(copied.first == 0);
  CHECK(copied.second == a.size + kMiB);
  REQUIRE(cudaFree(filler) == cudaSuccess);
  // Room again, but cudaMemGetInfo fails: the engine, and no error left behind.
  REQUIRE(uvm_offload_ranges(moved, 2, UVM_STRATEGY_STAGED, stream) == UVM_OK);
  fake::reset_ops();
  fake::fail_next("cudaMemGetInfo", cudaErrorUnknown);
  uvm_clear_last_error();
  REQUIRE(uvm_onload_ranges(moved, 2, stream) == UVM_OK);
  CHECK(FakeMachine::ops_named(fake::OpKind::sm_copy).empty());
  CHECK(FakeMachine::bytes_of(fake::OpKind::copy_to_device) == a.size + kMiB);
  CHECK(std::string(uvm_last_error()).empty());
  CHECK(cudaPeekAtLastError() == cudaSuccess);
  CHECK(a.intact());
  CHECK(b.intact());
  // Managed memory alone: auto has nothing to choose for, so it asks the device nothing (the
  // injected failure is still armed afterwards).
  void* managed = uvm_malloc(kMiB, 0, nullptr);
  REQUIRE(managed != nullptr);
  const uvm_range managed_range{managed, kMiB};
  REQUIRE(uvm_offload_ranges(&managed_range, 1, UVM_STRATEGY_STAGED, stream) == UVM_OK);
  fake::fail_next("cudaMemGetInfo", cudaErrorUnknown);
  REQUIRE(uvm_onload_ranges(&managed_range, 1, stream) == UVM_OK);
  size_t free_bytes = 0, total_bytes = 0;
  CHECK(cudaMemGetInfo(&free_bytes, &total_bytes) == cudaErrorUnknown);
  CHECK(cudaGetLastError() == cudaErrorUnknown);  // the test's own call left it; cleared here
  uvm_free(managed, kMiB, 0, nullptr);
  REQUIRE(uvm_release_staging() == UVM_OK);
}

TEST_CASE("a fetch copies by engine under auto where an onload would take the kernel; it runs beside compute",
          "[scenario][sm_copy_auto][cuda13]") {
  FakeMachine machine;  // device 0 has 1 GiB: room for the kernel
  Releasable a(32 * kMiB, 0, 37);
  cudaStream_t stream = fake::make_stream();
  const uvm_range range = a.whole();
  REQUIRE(uvm_offload_ranges(&range, 1, UVM_STRATEGY_STAGED, stream) == UVM_OK);
  fake::reset_ops();
  REQUIRE(uvm_fetch_ranges(&range, 1, stream, nullptr) == UVM_OK);
  CHECK(FakeMachine::ops_named(fake::OpKind::sm_copy).empty());
  CHECK(FakeMachine::bytes_of(fake::OpKind::copy_to_device) == a.size);
  CHECK(a.intact());
  REQUIRE(uvm_drop_clean_ranges(&range, 1, stream) == UVM_OK);
  fake::reset_ops();
  REQUIRE(uvm_onload_ranges(&range, 1, stream) == UVM_OK);  // the same bytes, onloaded: the kernel
  CHECK(FakeMachine::bytes_of(fake::OpKind::sm_copy) == a.size);
  CHECK(a.intact());
}
