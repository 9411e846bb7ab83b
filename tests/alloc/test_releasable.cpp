// uvm_malloc_releasable and uvm_free of releasable memory against the fake driver: address range,
// physical memory and bookkeeping appear and go together, and every failure leaves nothing behind.
#include <cuda.h>

#include <cstring>
#include <string>

#include "fixture.hpp"

namespace {
constexpr size_t kSize = (size_t{1} << 20) + 100;  // not a multiple of the granularity

uvm_stats stats_of(int device) {
  uvm_stats s{};
  REQUIRE(uvm_get_stats(device, &s) == UVM_OK);
  return s;
}

bool no_cuda_error_pending() { return cudaPeekAtLastError() == cudaSuccess; }
}  // namespace

TEST_CASE("a releasable allocation is mapped device memory that uvm tracks like any other", "[releasable]") {
  FakeMachine machine;
  REQUIRE(uvm_set_thread_tag("weights") == UVM_OK);
  auto* p = static_cast<unsigned char*>(uvm_malloc_releasable(kSize, 1, nullptr));
  REQUIRE(uvm_set_thread_tag(nullptr) == UVM_OK);
  REQUIRE(p != nullptr);
  std::memset(p, 7, kSize);  // mapped read-write
  CHECK(fake::mapped_reservations() == 1);
  CHECK(uvm_is_managed(p) == 0);
  void* base = nullptr;
  size_t size = 0;
  int device = -5;
  REQUIRE(uvm_allocation_info(p + 10, &base, &size, &device) == UVM_OK);
  CHECK(base == p);
  CHECK(size == kSize);
  CHECK(device == 1);
  CHECK(stats_of(1).live_bytes == kSize);
  uvm_range found{};
  size_t count = 0;
  REQUIRE(uvm_allocation_ranges(1, "weights", &found, 1, &count) == UVM_OK);
  CHECK(count == 1);
  CHECK(found.ptr == p);

  fake::reset_ops();
  uvm_free(p, kSize, 1, nullptr);
  CHECK(uvm_last_status() == UVM_OK);
  // Like cudaFree, the free waits for the device before the memory goes.
  const auto ops = fake::ops();
  REQUIRE(ops.size() >= 2);
  CHECK(ops[0].call == fake::OpKind::device_sync);
  CHECK(FakeMachine::ops_named(fake::OpKind::vmm_unmap).size() == 1);
  CHECK(fake::live_reservations() == 0);
  CHECK(stats_of(1).live_bytes == 0);
  CHECK(uvm_allocation_info(p, nullptr, nullptr, nullptr) == UVM_ERROR_NOT_MANAGED);
}

TEST_CASE("a releasable allocation the driver cannot back fails cleanly", "[releasable]") {
  FakeMachine machine;
  fake::fail_next("cuMemCreate", cudaErrorMemoryAllocation);
  CHECK(uvm_malloc_releasable(kSize, 0, nullptr) == nullptr);
  CHECK(uvm_last_status() == UVM_ERROR_OUT_OF_MEMORY);
  const std::string message = uvm_last_error();
  CHECK(message.find("uvm_malloc_releasable") != std::string::npos);
  CHECK(message.find("cuMemCreate") != std::string::npos);
  CHECK(message.find("CUDA_ERROR_OUT_OF_MEMORY") != std::string::npos);
  CHECK(fake::live_reservations() == 0);  // the address range went back too
  CHECK(stats_of(0).live_bytes == 0);     // and the limit's reservation
  CHECK(no_cuda_error_pending());

  fake::fail_next("cuMemMap", cudaErrorInvalidValue);
  CHECK(uvm_malloc_releasable(kSize, 0, nullptr) == nullptr);
  CHECK(std::string(uvm_last_error()).find("cuMemMap") != std::string::npos);
  CHECK(fake::live_reservations() == 0);
}

TEST_CASE("releasable allocations obey the device's limit", "[releasable]") {
  FakeMachine machine;
  REQUIRE(uvm_set_limit(0, kSize) == UVM_OK);
  void* p = uvm_malloc_releasable(kSize, 0, nullptr);
  REQUIRE(p != nullptr);
  CHECK(uvm_malloc_releasable(1, 0, nullptr) == nullptr);
  CHECK(uvm_last_status() == UVM_ERROR_LIMIT_EXCEEDED);
  CHECK(fake::live_reservations() == 1);
  uvm_free(p, kSize, 0, nullptr);
}

TEST_CASE("prefetch and advise refuse releasable memory by name", "[releasable]") {
  FakeMachine machine;
  void* p = uvm_malloc_releasable(kSize, 0, nullptr);
  REQUIRE(p != nullptr);
  fake::reset_ops();
  CHECK(uvm_prefetch(p, 4096, UVM_LOCATION_CPU, fake::make_stream()) == UVM_ERROR_NOT_MANAGED);
  CHECK(std::string(uvm_last_error()).find("uvm_malloc_releasable") != std::string::npos);
  const uvm_range range{p, 4096};
  CHECK(uvm_prefetch_ranges(&range, 1, 0, fake::make_stream()) == UVM_ERROR_NOT_MANAGED);
  CHECK(uvm_advise_preferred_location(p, 4096, 0) == UVM_ERROR_NOT_MANAGED);
  CHECK(std::string(uvm_last_error()).find("advise does not apply") != std::string::npos);
  CHECK(fake::ops().empty());
  uvm_free(p, kSize, 0, nullptr);
}

TEST_CASE("without driver entry points releasable allocation is unsupported, by name", "[no_entry_points][scenario]") {
  FakeMachine machine;
  CHECK(uvm_malloc_releasable(kSize, 0, nullptr) == nullptr);
  CHECK(uvm_last_status() == UVM_ERROR_UNSUPPORTED);
  CHECK(std::string(uvm_last_error()).find("cuMemCreate") != std::string::npos);
  CHECK(stats_of(0).live_bytes == 0);
}

// Spare memory (uvm_set_spare_limit): physical memory an unmap keeps for the next map of its size.
namespace {
constexpr size_t kGranule = size_t{64} << 10;  // the fake driver's granularity
size_t reserved_of(size_t size) { return (size + kGranule - 1) / kGranule * kGranule; }

// Sets `device`'s spare limit for the scope, and back to 0 after (giving back what is kept).
struct SpareLimit {
  SpareLimit(int device, size_t bytes) : device(device) { REQUIRE(uvm_set_spare_limit(device, bytes) == UVM_OK); }
  ~SpareLimit() { uvm_set_spare_limit(device, 0); }
  int device;
};
}  // namespace

TEST_CASE("with a spare limit, an offload keeps the physical memory and the next onload maps it again", "[releasable][spare]") {
  FakeMachine machine;
  Releasable a(kSize, 0, 1), b(kSize, 0, 2);
  const size_t reserved = reserved_of(kSize);
  const uvm_range ra = a.whole(), rb = b.whole();

  // Limit 0 (the default): the offload gives the memory back to the driver.
  fake::reset_ops();
  REQUIRE(uvm_offload_ranges(&ra, 1, UVM_STRATEGY_STAGED, nullptr) == UVM_OK);
  CHECK(FakeMachine::ops_named(fake::OpKind::vmm_release).size() == 1);
  CHECK(fake::physical_handles() == 1);
  REQUIRE(uvm_onload_ranges(&ra, 1, nullptr) == UVM_OK);

  SpareLimit limit(0, reserved);
  size_t got = 0;
  REQUIRE(uvm_get_spare_limit(0, &got) == UVM_OK);
  CHECK(got == reserved);
  fake::reset_ops();
  REQUIRE(uvm_offload_ranges(&ra, 1, UVM_STRATEGY_STAGED, nullptr) == UVM_OK);
  CHECK(FakeMachine::ops_named(fake::OpKind::vmm_release).empty());
  CHECK(fake::physical_handles() == 2);  // b's, and a's kept
  CHECK(fake::mapped_reservations() == 1);
  CHECK(stats_of(0).spare_bytes == reserved);
  CHECK(residency().released_bytes == kSize);  // a is released all the same: unmapped, not its memory
  // The onload maps the spare memory: nothing created, nothing given back.
  fake::reset_ops();
  REQUIRE(uvm_onload_ranges(&ra, 1, nullptr) == UVM_OK);
  CHECK(FakeMachine::ops_named(fake::OpKind::vmm_create).empty());
  CHECK(FakeMachine::ops_named(fake::OpKind::vmm_map).size() == 1);
  CHECK(stats_of(0).spare_bytes == 0);
  CHECK(fake::physical_handles() == 2);
  CHECK(a.intact());
  CHECK(b.intact());

  // Two offloads, room for one: the newer is kept, the older given back.
  fake::reset_ops();
  REQUIRE(uvm_offload_ranges(&ra, 1, UVM_STRATEGY_STAGED, nullptr) == UVM_OK);
  REQUIRE(uvm_offload_ranges(&rb, 1, UVM_STRATEGY_STAGED, nullptr) == UVM_OK);
  CHECK(FakeMachine::ops_named(fake::OpKind::vmm_release).size() == 1);
  CHECK(fake::physical_handles() == 1);
  CHECK(stats_of(0).spare_bytes == reserved);
  // A new allocation of the same size takes it too.
  fake::reset_ops();
  Releasable c(kSize, 0, 3);
  CHECK(FakeMachine::ops_named(fake::OpKind::vmm_create).empty());
  CHECK(stats_of(0).spare_bytes == 0);
  REQUIRE(uvm_onload_ranges(&ra, 1, nullptr) == UVM_OK);
  REQUIRE(uvm_onload_ranges(&rb, 1, nullptr) == UVM_OK);
  CHECK(a.intact());
  CHECK(b.intact());
  CHECK(c.intact());
  CHECK(cudaPeekAtLastError() == cudaSuccess);
}

TEST_CASE("spare memory is mapped only at its own size and device, and goes back when the limit falls", "[releasable][spare]") {
  FakeMachine machine;
  Releasable small(kSize, 0, 1), large(3 * kSize, 0, 2), other(kSize, 1, 3);
  SpareLimit limit0(0, 8 * reserved_of(kSize));
  const uvm_range rs = small.whole(), rl = large.whole(), ro = other.whole();
  REQUIRE(uvm_offload_ranges(&rs, 1, UVM_STRATEGY_STAGED, nullptr) == UVM_OK);
  REQUIRE(uvm_offload_ranges(&ro, 1, UVM_STRATEGY_STAGED, nullptr) == UVM_OK);  // device 1: limit 0
  CHECK(stats_of(0).spare_bytes == reserved_of(kSize));
  CHECK(stats_of(1).spare_bytes == 0);
  REQUIRE(uvm_offload_ranges(&rl, 1, UVM_STRATEGY_STAGED, nullptr) == UVM_OK);
  CHECK(stats_of(0).spare_bytes == reserved_of(kSize) + reserved_of(3 * kSize));
  // Back in the other order: each maps the spare of its own size.
  REQUIRE(uvm_onload_ranges(&rs, 1, nullptr) == UVM_OK);
  CHECK(stats_of(0).spare_bytes == reserved_of(3 * kSize));
  REQUIRE(uvm_offload_ranges(&rs, 1, UVM_STRATEGY_STAGED, nullptr) == UVM_OK);
  fake::reset_ops();
  REQUIRE(uvm_set_spare_limit(0, reserved_of(3 * kSize)) == UVM_OK);  // the oldest (large) goes
  const auto released = FakeMachine::ops_named(fake::OpKind::vmm_release);
  REQUIRE(released.size() == 1);
  CHECK(released[0].size == reserved_of(3 * kSize));
  CHECK(stats_of(0).spare_bytes == reserved_of(kSize));
  fake::reset_ops();
  REQUIRE(uvm_onload_ranges(&rl, 1, nullptr) == UVM_OK);
  CHECK(FakeMachine::ops_named(fake::OpKind::vmm_create).size() == 1);  // no spare of its size
  REQUIRE(uvm_onload_ranges(&rs, 1, nullptr) == UVM_OK);
  REQUIRE(uvm_onload_ranges(&ro, 1, nullptr) == UVM_OK);
  CHECK(small.intact());
  CHECK(large.intact());
  CHECK(other.intact());
  REQUIRE(uvm_set_spare_limit(0, 0) == UVM_OK);
  CHECK(stats_of(0).spare_bytes == 0);
  CHECK(fake::physical_handles() == 3);  // exactly the three mapped
}

TEST_CASE("a device out of memory gives its spare memory back and asks again", "[releasable][spare]") {
  FakeMachine machine;
  Releasable small(kSize, 0, 1), large(3 * kSize, 0, 2);
  SpareLimit limit(0, reserved_of(kSize));
  const uvm_range rs = small.whole(), rl = large.whole();
  REQUIRE(uvm_offload_ranges(&rl, 1, UVM_STRATEGY_STAGED, nullptr) == UVM_OK);  // above the limit: given back
  REQUIRE(uvm_offload_ranges(&rs, 1, UVM_STRATEGY_STAGED, nullptr) == UVM_OK);  // kept
  CHECK(stats_of(0).spare_bytes == reserved_of(kSize));
  fake::reset_ops();
  fake::fail_next("cuMemCreate", cudaErrorMemoryAllocation);
  REQUIRE(uvm_onload_ranges(&rl, 1, nullptr) == UVM_OK);
  const auto ops = fake::ops();
  size_t release_at = ops.size(), create_at = ops.size();
  for (size_t i = 0; i < ops.size(); ++i) {
    if (ops[i].call == fake::OpKind::vmm_release && release_at == ops.size()) release_at = i;
    if (ops[i].call == fake::OpKind::vmm_create) create_at = i;
  }
  CHECK(release_at < create_at);  // the spare went before the second ask
  CHECK(create_at < ops.size());
  CHECK(stats_of(0).spare_bytes == 0);
  CHECK(large.intact());
  CHECK(cudaPeekAtLastError() == cudaSuccess);
  // Out of memory with no spare memory to give: the onload fails as before, nothing lost.
  REQUIRE(uvm_offload_ranges(&rl, 1, UVM_STRATEGY_STAGED, nullptr) == UVM_OK);  // above the limit: given back
  fake::fail_next("cuMemCreate", cudaErrorMemoryAllocation);
  CHECK(uvm_onload_ranges(&rl, 1, nullptr) == UVM_ERROR_OUT_OF_MEMORY);
  CHECK_THAT(last_error(), Has("cuMemCreate") && Has("CUDA_ERROR_OUT_OF_MEMORY"));
  REQUIRE(uvm_onload_ranges(&rl, 1, nullptr) == UVM_OK);
  REQUIRE(uvm_onload_ranges(&rs, 1, nullptr) == UVM_OK);
  CHECK(large.intact());
  CHECK(small.intact());
}

TEST_CASE("a free gives its memory back whatever the spare limit; bad arguments are refused by name", "[releasable][spare]") {
  FakeMachine machine;
  SpareLimit limit(0, 16 * reserved_of(kSize));
  {
    Releasable a(kSize, 0, 1);
  }
  CHECK(stats_of(0).spare_bytes == 0);
  CHECK(fake::physical_handles() == 0);
  CHECK(uvm_set_spare_limit(7, 0) == UVM_ERROR_INVALID_ARGUMENT);
  CHECK_THAT(last_error(), Has("uvm_set_spare_limit(device=7)") && Has("device 7 is not a CUDA device"));
  CHECK(uvm_set_spare_limit(UVM_ANY_DEVICE, 0) == UVM_ERROR_INVALID_ARGUMENT);
  CHECK(uvm_get_spare_limit(0, nullptr) == UVM_ERROR_INVALID_ARGUMENT);
  CHECK_THAT(last_error(), Has("uvm_get_spare_limit(device=0)") && Has("bytes is NULL"));
  CHECK(cudaPeekAtLastError() == cudaSuccess);
}

TEST_CASE("a free whose wait for the device fails leaves the allocation for a second free", "[releasable][errors]") {
  // Issue 57: the allocation was forgotten before the wait, so a sticky error there leaked its
  // address range and physical memory (nothing could free them any more).
  FakeMachine machine;
  const size_t reservations = fake::live_reservations(), physical = fake::physical_bytes();
  void* p = uvm_malloc_releasable(2 << 20, 0, nullptr);
  REQUIRE(p != nullptr);
  fake::fail_next("cudaDeviceSynchronize", cudaErrorLaunchFailure);
  uvm_free(p, 2 << 20, 0, nullptr);
  CHECK(uvm_last_status() == UVM_ERROR_CUDA);
  CHECK(uvm_last_cuda_error() == cudaErrorLaunchFailure);
  CHECK_THAT(last_error(), Has("cudaDeviceSynchronize before unmapping failed: cudaErrorLaunchFailure"));
  CHECK(cudaPeekAtLastError() == cudaSuccess);
  void* base = nullptr;
  size_t size = 0;
  int device = -1;
  CHECK(uvm_allocation_info(p, &base, &size, &device) == UVM_OK);  // still uvm's, whole
  CHECK((base == p && size == (2u << 20) && device == 0));
  CHECK(fake::live_reservations() == reservations + 1);
  uvm_clear_last_error();
  uvm_free(p, 2 << 20, 0, nullptr);
  CHECK(uvm_last_status() == UVM_OK);
  CHECK(fake::live_reservations() == reservations);
  CHECK(fake::physical_bytes() == physical);
  CHECK(uvm_allocation_info(p, &base, &size, &device) != UVM_OK);
}

TEST_CASE("releasable memory is GPUDirect RDMA capable where the device supports it", "[releasable]") {
  // Issue 57 item 9: the flag was never set, so a NIC could not register region tensors where the
  // original's could. The double's device 0 supports it, device 1 does not.
  FakeMachine machine;
  for (int device : {0, 1}) {
    void* p = uvm_malloc_releasable(2 << 20, device, nullptr);
    REQUIRE(p != nullptr);
    CHECK(fake::last_created_rdma_capable() == (device == 0));
    uvm_free(p, 2 << 20, device, nullptr);
  }
}

TEST_CASE("a device whose RDMA support cannot be asked refuses the allocation and is asked again",
          "[first_probe][scenario]") {
  // Issue 58 item 5: a failed query was cached as "not capable", so every later allocation on a
  // device that supports GPUDirect RDMA silently lacked it. In a process of its own: a device's
  // answer, once had, is kept.
  FakeMachine machine;
  const size_t reservations = fake::live_reservations();
  fake::fail_next("cuDeviceGetAttribute", cudaErrorLaunchFailure);
  uvm_clear_last_error();
  CHECK(uvm_malloc_releasable(2 << 20, 0, nullptr) == nullptr);
  CHECK(uvm_last_status() == UVM_ERROR_CUDA);
  CHECK_THAT(last_error(), Has("cuDeviceGetAttribute(GPU_DIRECT_RDMA_WITH_CUDA_VMM_SUPPORTED, device 0)") &&
                               Has("CUDA_ERROR_LAUNCH_FAILED"));
  CHECK(cudaPeekAtLastError() == cudaSuccess);
  CHECK(fake::live_reservations() == reservations);
  uvm_stats stats{};
  REQUIRE(uvm_get_stats(0, &stats) == UVM_OK);
  CHECK(stats.live_bytes == 0);
  void* p = uvm_malloc_releasable(2 << 20, 0, nullptr);
  REQUIRE(p != nullptr);
  CHECK(fake::last_created_rdma_capable());
  uvm_free(p, 2 << 20, 0, nullptr);

  // A driver that does not know the attribute has no such memory: the allocation goes on without
  // it, and the answer is kept (the next failure of the query is not asked for).
  fake::fail_next("cuDeviceGetAttribute", cudaErrorInvalidValue);
  p = uvm_malloc_releasable(2 << 20, 1, nullptr);
  REQUIRE(p != nullptr);
  CHECK_FALSE(fake::last_created_rdma_capable());
  uvm_free(p, 2 << 20, 1, nullptr);
  fake::fail_next("cuDeviceGetAttribute", cudaErrorLaunchFailure);
  p = uvm_malloc_releasable(2 << 20, 1, nullptr);
  CHECK(p != nullptr);
  CHECK(fake::injection_left("cuDeviceGetAttribute"));
  fake::clear_injections();
  uvm_free(p, 2 << 20, 1, nullptr);
}

TEST_CASE("a releasable allocation whose mapping cannot be made leaves nothing behind and says which call failed",
          "[releasable][errors]") {
  FakeMachine machine;
  const size_t reservations = fake::live_reservations(), handles = fake::physical_handles();
  const uvm_stats before = stats_of(0);
  for (const char* call : {"cuMemAddressReserve", "cuMemSetAccess", "cuMemMap"}) {
    CAPTURE(call);
    fake::fail_next(call, cudaErrorLaunchFailure);
    uvm_clear_last_error();
    CHECK(uvm_malloc_releasable(2 << 20, 0, nullptr) == nullptr);
    CHECK(uvm_last_status() == UVM_ERROR_CUDA);
    CHECK_THAT(last_error(), Has(std::string(call) + "("));
    CHECK(uvm_last_cuda_error() == CUDA_ERROR_LAUNCH_FAILED);
    CHECK(no_cuda_error_pending());
    CHECK(fake::live_reservations() == reservations);  // the range went back
    CHECK(fake::physical_handles() == handles);        // and the physical memory
    const uvm_stats after = stats_of(0);
    CHECK(after.live_bytes == before.live_bytes);      // and the limit's room
  }
  void* p = uvm_malloc_releasable(2 << 20, 0, nullptr);  // the next one works
  REQUIRE(p != nullptr);
  uvm_free(p, 2 << 20, 0, nullptr);
}

TEST_CASE("a free whose unmap, release or address free fails keeps the allocation recorded and counted for a second free",
          "[releasable][errors]") {
  // Issue 58 item 5: the record and its counts went before the memory, so a failure there left an
  // address range and physical memory that nothing could free any more.
  FakeMachine machine;
  const size_t reservations = fake::live_reservations(), handles = fake::physical_handles();
  const size_t live = stats_of(0).live_bytes;
  for (const char* call : {"cuMemUnmap", "cuMemRelease", "cuMemAddressFree"}) {
    CAPTURE(call);
    void* p = uvm_malloc_releasable(2 << 20, 0, nullptr);
    REQUIRE(p != nullptr);
    std::memset(p, 0x5a, 2 << 20);
    fake::fail_next(call, cudaErrorLaunchFailure);
    uvm_clear_last_error();
    uvm_free(p, 2 << 20, 0, nullptr);
    CHECK(uvm_last_status() == UVM_ERROR_CUDA);
    CHECK_THAT(last_error(), Has("uvm_free(") && Has(std::string(call) + "(") && Has("CUDA_ERROR_LAUNCH_FAILED"));
    CHECK(uvm_last_cuda_error() == CUDA_ERROR_LAUNCH_FAILED);
    CHECK(no_cuda_error_pending());
    void* base = nullptr;
    size_t size = 0;
    int device = -1;
    CHECK(uvm_allocation_info(p, &base, &size, &device) == UVM_OK);  // still uvm's
    CHECK(stats_of(0).live_bytes == live + (2 << 20));               // and still counted
    CHECK(fake::live_reservations() == reservations + 1);
    uvm_clear_last_error();
    uvm_free(p, 2 << 20, 0, nullptr);  // the second free finishes what the first began
    CHECK(uvm_last_status() == UVM_OK);
    CHECK(fake::live_reservations() == reservations);
    CHECK(fake::physical_handles() == handles);
    CHECK(stats_of(0).live_bytes == live);
  }
}

TEST_CASE("physical memory the driver would not take back stays uvm's: mapped again, freed with its allocation",
          "[releasable][spare][errors]") {
  FakeMachine machine;
  const size_t handles = fake::physical_handles();
  Releasable a(kSize, 0, 1);
  const uvm_range ra = a.whole();
  SECTION("an offload's release") {
    fake::fail_next("cuMemRelease", cudaErrorLaunchFailure);
    CHECK(uvm_offload_ranges(&ra, 1, UVM_STRATEGY_STAGED, nullptr) == UVM_ERROR_CUDA);
    CHECK_THAT(last_error(), Has("cuMemRelease(") && Has("CUDA_ERROR_LAUNCH_FAILED"));
    CHECK(no_cuda_error_pending());
    CHECK(fake::physical_handles() == handles + 1);  // still there, and still a's
    fake::reset_ops();
    REQUIRE(uvm_onload_ranges(&ra, 1, nullptr) == UVM_OK);
    CHECK(FakeMachine::ops_named(fake::OpKind::vmm_create).empty());  // its own memory, mapped again
    CHECK(a.intact());
  }
  SECTION("a spare's release when the limit falls") {
    SpareLimit limit(0, reserved_of(kSize));
    REQUIRE(uvm_offload_ranges(&ra, 1, UVM_STRATEGY_STAGED, nullptr) == UVM_OK);
    CHECK(stats_of(0).spare_bytes == reserved_of(kSize));
    fake::fail_next("cuMemRelease", cudaErrorLaunchFailure);
    CHECK(uvm_set_spare_limit(0, 0) == UVM_ERROR_CUDA);
    CHECK_THAT(last_error(), Has("cuMemRelease(") && Has("spare memory"));
    CHECK(stats_of(0).spare_bytes == reserved_of(kSize));  // kept, for the next try
    CHECK(fake::physical_handles() == handles + 1);
    REQUIRE(uvm_set_spare_limit(0, 0) == UVM_OK);
    CHECK(stats_of(0).spare_bytes == 0);
    CHECK(fake::physical_handles() == handles);
    REQUIRE(uvm_onload_ranges(&ra, 1, nullptr) == UVM_OK);
    CHECK(a.intact());
  }
}
