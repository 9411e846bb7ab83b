// uvm_pause and uvm_resume (offload/pause.cpp): whole tags off the GPU and back, each allocation
// kept or dropped as the backup recorded with it says.
#include <cstring>
#include <memory>

#include "fixture.hpp"

namespace {
constexpr size_t kMiB = size_t{1} << 20;

// A releasable allocation made under `tag` with `backup`, the thread's settings restored after.
std::unique_ptr<Releasable> made(const char* tag, uvm_backup backup, unsigned seed, int device = 0) {
  REQUIRE(uvm_set_thread_tag(tag) == UVM_OK);
  REQUIRE(uvm_set_thread_backup(backup) == UVM_OK);
  auto memory = std::make_unique<Releasable>(kMiB, device, seed);
  REQUIRE(uvm_set_thread_tag(nullptr) == UVM_OK);
  REQUIRE(uvm_set_thread_backup(UVM_BACKUP_NONE) == UVM_OK);
  return memory;
}

size_t paused(int device, const char* tag) {
  size_t count = 0;
  REQUIRE(uvm_paused_count(device, tag, &count) == UVM_OK);
  return count;
}
}  // namespace

TEST_CASE("pause keeps what has a host backup, drops the rest, frees both; resume brings the kept bytes back",
          "[pause][cuda13]") {
  FakeMachine machine;
  auto kept = made("weights", UVM_BACKUP_HOST, 1);
  auto dropped = made("weights", UVM_BACKUP_NONE, 2);
  auto other = made("kv", UVM_BACKUP_HOST, 3);
  const size_t mapped = fake::mapped_reservations();
  REQUIRE(uvm_pause(UVM_ANY_DEVICE, "weights") == UVM_OK);
  CHECK(paused(UVM_ANY_DEVICE, "weights") == 2);
  CHECK(paused(UVM_ANY_DEVICE, "kv") == 0);
  CHECK(fake::mapped_reservations() == mapped - 2);  // both given back to the driver
  CHECK(residency(0, "weights").staged_bytes == kMiB);  // only the kept one has a copy
  CHECK(residency(0, "weights").released_bytes == 2 * kMiB);
  CHECK(residency(0, "kv").device_bytes == kMiB);  // another tag: untouched
  CHECK(other->intact());
  CHECK(FakeMachine::ops_named(fake::OpKind::device_sync).size() >= 2);  // before the moves and after

  fake::reset_ops();
  REQUIRE(uvm_pause(UVM_ANY_DEVICE, "weights") == UVM_OK);  // paused already: nothing to do
  CHECK(fake::ops().empty());

  REQUIRE(uvm_resume(UVM_ANY_DEVICE, "weights") == UVM_OK);
  CHECK(paused(UVM_ANY_DEVICE, nullptr) == 0);
  CHECK(fake::mapped_reservations() == mapped);
  CHECK(kept->intact());
  CHECK(residency(0, "weights").staged_bytes == 0);
  CHECK(residency(0, "weights").device_bytes == 2 * kMiB);
  CHECK(cudaPeekAtLastError() == cudaSuccess);
}

TEST_CASE("pause and resume select by device and tag; an allocation made while paused is not paused",
          "[pause][cuda13]") {
  FakeMachine machine;
  auto on0 = made("weights", UVM_BACKUP_HOST, 1, 0);
  fake::set_thread_context(1);
  auto on1 = made("weights", UVM_BACKUP_HOST, 2, 1);
  fake::set_thread_context(0);
  REQUIRE(uvm_pause(1, "weights") == UVM_OK);
  CHECK(paused(0, "weights") == 0);
  CHECK(paused(1, "weights") == 1);
  CHECK(fake::current_context() == 0);  // the caller's context, restored
  auto late = made("weights", UVM_BACKUP_HOST, 4, 1);
  CHECK(paused(1, "weights") == 1);
  REQUIRE(uvm_pause(UVM_ANY_DEVICE, nullptr) == UVM_OK);  // every tag, every device
  CHECK(paused(UVM_ANY_DEVICE, nullptr) == 3);
  on1.reset();  // freed while paused: its mark goes with it
  CHECK(paused(UVM_ANY_DEVICE, nullptr) == 2);
  REQUIRE(uvm_resume(UVM_ANY_DEVICE, "weights") == UVM_OK);
  CHECK(on0->intact());
  CHECK(late->intact());
  CHECK(paused(UVM_ANY_DEVICE, nullptr) == 0);
  REQUIRE(uvm_pause(0, "never used") == UVM_OK);  // a tag nothing carries: nothing selected
  REQUIRE(uvm_resume(0, "") == UVM_OK);
}

TEST_CASE("managed memory pauses too: kept bytes staged, dropped ones discarded", "[pause][cuda13]") {
  FakeMachine machine;
  REQUIRE(uvm_set_thread_tag("grad") == UVM_OK);
  REQUIRE(uvm_set_thread_backup(UVM_BACKUP_HOST) == UVM_OK);
  auto* kept = static_cast<unsigned char*>(uvm_malloc(kMiB, 0, nullptr));
  REQUIRE(uvm_set_thread_backup(UVM_BACKUP_NONE) == UVM_OK);
  auto* dropped = static_cast<unsigned char*>(uvm_malloc(kMiB, 0, nullptr));
  REQUIRE(uvm_set_thread_tag(nullptr) == UVM_OK);
  REQUIRE((kept && dropped));
  std::memset(kept, 0x5a, kMiB);
  REQUIRE(uvm_pause(0, "grad") == UVM_OK);
  CHECK(residency(0, "grad").staged_bytes == kMiB);
  CHECK(residency(0, "grad").discarded_bytes == kMiB);
  REQUIRE(uvm_resume(0, "grad") == UVM_OK);
  size_t wrong = 0;
  for (size_t i = 0; i < kMiB; ++i) wrong += kept[i] != 0x5a;
  CHECK(wrong == 0);
  CHECK(residency(0, "grad").device_bytes == 2 * kMiB);
  uvm_free(kept, kMiB, 0, nullptr);
  uvm_free(dropped, kMiB, 0, nullptr);
}

TEST_CASE("a pause whose copy fails names it, keeps those bytes on the device and can be done again",
          "[pause][cuda13]") {
  FakeMachine machine;
  auto kept = made("weights", UVM_BACKUP_HOST, 1);
  auto dropped = made("weights", UVM_BACKUP_NONE, 2);
  fake::fail_next("cudaMemcpyAsync", cudaErrorInvalidValue);
  CHECK(uvm_pause(0, "weights") == UVM_ERROR_CUDA);
  CHECK_THAT(last_error(), Has("uvm_pause(device=0): uvm_offload_ranges(count=1)"));
  CHECK_THAT(last_error(), Has("cudaMemcpyAsync"));
  CHECK(cudaPeekAtLastError() == cudaSuccess);
  CHECK(paused(0, "weights") == 1);  // the dropped one: its bytes are gone either way
  CHECK(kept->intact());             // still on the device
  REQUIRE(uvm_pause(0, "weights") == UVM_OK);
  CHECK(paused(0, "weights") == 2);
  REQUIRE(uvm_resume(0, "weights") == UVM_OK);
  CHECK(kept->intact());
}

TEST_CASE("bad arguments are refused by name", "[pause]") {
  FakeMachine machine;
  CHECK(uvm_pause(7, nullptr) == UVM_ERROR_INVALID_ARGUMENT);
  CHECK_THAT(last_error(), Has("uvm_pause(device=7)"));
  CHECK(uvm_resume(-5, nullptr) == UVM_ERROR_INVALID_ARGUMENT);
  CHECK(uvm_paused_count(0, nullptr, nullptr) == UVM_ERROR_INVALID_ARGUMENT);
  CHECK_THAT(last_error(), Has("count is NULL"));
  uvm_backup bad = UVM_BACKUP_NONE;
  const int four = 4;
  std::memcpy(&bad, &four, sizeof bad);
  CHECK(uvm_set_thread_backup(bad) == UVM_ERROR_INVALID_ARGUMENT);
  CHECK_THAT(last_error(), Has("backup 4 is not a uvm_backup (UVM_BACKUP_NONE … UVM_BACKUP_DISK)"));
  CHECK(uvm_get_thread_backup() == UVM_BACKUP_NONE);
}
