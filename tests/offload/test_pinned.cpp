// Pinned staging memory (offload/media/pinned.cpp): registered huge-page memory by default, cudaHostAlloc
// when registering fails or UVM_PINNED=hostalloc asks for it, one clear error when both fail. (The
// other CPU tests run with UVM_PINNED=hostalloc: see tests/meson.build.)
#include <chrono>
#include <cstring>
#include <thread>

#include "../../offload/media/pinned.hpp"
#include "fixture.hpp"

namespace {
constexpr size_t kBytes = size_t{8} << 20;
const uvm::Call kCall = uvm::Call::of("test");
}  // namespace

TEST_CASE("staging memory is mapped, faulted in and registered, and given back the same way", "[pinned]") {
  FakeMachine machine;
  uvm::PinnedMemory memory;
  REQUIRE(uvm::pin_host_memory(kCall, kBytes, uvm::PinnedKind::registered, &memory) == UVM_OK);
  CHECK(memory.kind == uvm::PinnedKind::registered);
  CHECK(memory.bytes == kBytes);
  REQUIRE(FakeMachine::ops_named(fake::OpKind::host_register).size() == 1);
  CHECK(FakeMachine::ops_named(fake::OpKind::host_register)[0].ptr == memory.host);
  CHECK(FakeMachine::ops_named(fake::OpKind::host_register)[0].size == kBytes);
  CHECK(FakeMachine::ops_named(fake::OpKind::host_alloc).empty());
  std::memset(memory.host, 0x5a, kBytes);  // all of it is there to write
  CHECK(static_cast<unsigned char>(memory.host[kBytes - 1]) == 0x5a);
  REQUIRE(uvm::unpin_host_memory(kCall, &memory) == UVM_OK);
  CHECK(FakeMachine::ops_named(fake::OpKind::host_unregister).size() == 1);
  CHECK(FakeMachine::ops_named(fake::OpKind::host_free).empty());
}

TEST_CASE("when registering fails, cudaHostAlloc serves, and cudaFreeHost gives it back", "[pinned]") {
  FakeMachine machine;
  fake::fail_next("cudaHostRegister", cudaErrorNotSupported);
  uvm::PinnedMemory memory;
  REQUIRE(uvm::pin_host_memory(kCall, kBytes, uvm::PinnedKind::registered, &memory) == UVM_OK);
  CHECK(memory.kind == uvm::PinnedKind::host_alloc);
  CHECK(FakeMachine::ops_named(fake::OpKind::host_alloc).size() == 1);
  CHECK(cudaPeekAtLastError() == cudaSuccess);  // the failed registration left nothing pending
  REQUIRE(uvm::unpin_host_memory(kCall, &memory) == UVM_OK);
  CHECK(FakeMachine::ops_named(fake::OpKind::host_free).size() == 1);
  CHECK(FakeMachine::ops_named(fake::OpKind::host_unregister).empty());
}

TEST_CASE("when both ways fail, the error names cudaHostAlloc and why registering did not serve", "[pinned]") {
  FakeMachine machine;
  const size_t blocks_before = fake::pinned_blocks();
  fake::fail_next("cudaHostRegister", cudaErrorNotSupported);
  fake::fail_next("cudaHostAlloc", cudaErrorMemoryAllocation);
  uvm::PinnedMemory memory;
  CHECK(uvm::pin_host_memory(kCall, kBytes, uvm::PinnedKind::registered, &memory) == UVM_ERROR_OUT_OF_MEMORY);
  CHECK_THAT(last_error(), Has("cudaHostAlloc(8388608 bytes of pinned staging memory, after cudaHostRegister: "
                               "cudaErrorNotSupported"));
  CHECK(cudaPeekAtLastError() == cudaSuccess);
  CHECK(fake::pinned_blocks() == blocks_before);  // nothing left pinned or mapped
}

TEST_CASE("hostalloc pins with cudaHostAlloc alone", "[pinned]") {
  FakeMachine machine;
  uvm::PinnedMemory memory;
  REQUIRE(uvm::pin_host_memory(kCall, kBytes, uvm::PinnedKind::host_alloc, &memory) == UVM_OK);
  CHECK(memory.kind == uvm::PinnedKind::host_alloc);
  CHECK(FakeMachine::ops_named(fake::OpKind::host_register).empty());
  REQUIRE(uvm::unpin_host_memory(kCall, &memory) == UVM_OK);
}

TEST_CASE("pinning in steps registers step by step on a thread of its own; copies may use each step done",
          "[pinned][steps]") {
  FakeMachine machine;
  const size_t bytes = 2 * uvm::kPinStepBytes + kBytes;
  fake::hold_next("cudaHostRegister", 1);  // the second step waits
  uvm::PinnedMemory memory;
  REQUIRE(uvm::pin_host_memory_in_steps(kCall, bytes, 0, &memory) == UVM_OK);  // returns at once
  CHECK(memory.kind == uvm::PinnedKind::registered);
  REQUIRE(memory.steps != nullptr);
  REQUIRE(fake::wait_until_held());
  CHECK(uvm::pinned_bytes_now(memory) == uvm::kPinStepBytes);  // the first step is usable already
  std::memset(memory.host, 0x5a, uvm::kPinStepBytes);
  fake::release_held();
  {
    std::unique_lock<std::mutex> lock(memory.steps->mutex);
    memory.steps->changed.wait(lock, [&] { return memory.steps->done; });
    CHECK(memory.steps->failure.empty());
  }
  CHECK(uvm::pinned_bytes_now(memory) == bytes);
  const auto registered = FakeMachine::ops_named(fake::OpKind::host_register);
  REQUIRE(registered.size() == 3);
  CHECK(registered[0].ptr == memory.host);
  CHECK(registered[1].size == uvm::kPinStepBytes);
  CHECK(registered[2].size == kBytes);
  CHECK(static_cast<unsigned char>(memory.host[bytes - 1]) == 0);  // faulted in, never written
  REQUIRE(uvm::unpin_host_memory(kCall, &memory) == UVM_OK);
  CHECK(FakeMachine::ops_named(fake::OpKind::host_unregister).size() == 3);
}

namespace {
size_t registrations() { return FakeMachine::ops_named(fake::OpKind::host_register).size(); }

// Waits until `pinning` has pinned `bytes` or ended; true if it pinned them.
bool wait_for_pinned(uvm::StepPinning& pinning, size_t bytes) {
  std::unique_lock<std::mutex> lock(pinning.mutex);
  pinning.changed.wait(lock, [&] { return pinning.done || pinning.pinned >= bytes; });
  return pinning.pinned >= bytes;
}

// Three steps (two whole, one of kBytes) pinned paced, the caller its first pacer.
uvm::PinnedMemory paced_three_steps() {
  uvm::PinnedMemory memory;
  REQUIRE(uvm::pin_host_memory_in_steps(kCall, 2 * uvm::kPinStepBytes + kBytes, 0, &memory,
                                        uvm::StepPacing::copies_first) == UVM_OK);
  REQUIRE(memory.steps != nullptr);
  return memory;
}

// Whether the pinning thread registers step `count` before it parks (uvm::pinning_parked_count
// passes `parked_before`), waiting for copies: once parked it registers nothing until the test lets
// it. No time is given: a slow host only makes the wait longer. Unpaced, it registers and never parks.
bool registers_before_parking(size_t count, uint64_t parked_before) {
  while (registrations() < count && uvm::pinning_parked_count() <= parked_before) {
    std::this_thread::sleep_for(std::chrono::microseconds(200));
  }
  return registrations() >= count;
}
}  // namespace

TEST_CASE("a paced pinning registers the next step once the copies reserved in the steps before it are issued",
          "[pinned][steps][threads]") {
  FakeMachine machine;
  uvm::PinnedMemory memory = paced_three_steps();
  const size_t bytes = memory.bytes;
  uvm::StepPinning& pinning = *memory.steps;
  const uint64_t parked_before = uvm::pinning_parked_count();
  uvm::note_steps_reserved(pinning, uvm::kPinStepBytes / 2);  // an offload took half the first step
  REQUIRE(wait_for_pinned(pinning, uvm::kPinStepBytes));
  CHECK_FALSE(registers_before_parking(2, parked_before));  // its copies are not issued yet
  const uint64_t parked_once = uvm::pinning_parked_count();
  uvm::note_copies_issued(pinning, uvm::kPinStepBytes / 2);
  REQUIRE(wait_for_pinned(pinning, 2 * uvm::kPinStepBytes));  // no more reserved: past kPaceWaitMs it goes on
  uvm::note_steps_reserved(pinning, 2 * uvm::kPinStepBytes);
  CHECK_FALSE(registers_before_parking(3, parked_once));
  uvm::end_pacing(pinning);  // the offload ends, its copies never issued (it failed)
  REQUIRE(wait_for_pinned(pinning, bytes));
  CHECK(registrations() == 3);
  REQUIRE(uvm::unpin_host_memory(kCall, &memory) == UVM_OK);
}

TEST_CASE("a pinning with no pacer, or two whose one ends, registers its steps without waiting",
          "[pinned][steps][threads]") {
  FakeMachine machine;
  uvm::PinnedMemory memory = paced_three_steps();
  const size_t bytes = memory.bytes;
  uvm::StepPinning& pinning = *memory.steps;
  const uint64_t parked_before = uvm::pinning_parked_count();
  uvm::begin_pacing(pinning);  // a second offload takes steps
  uvm::note_steps_reserved(pinning, uvm::kPinStepBytes);
  REQUIRE(wait_for_pinned(pinning, uvm::kPinStepBytes));
  uvm::end_pacing(pinning);  // the first ends; the second still paces
  CHECK_FALSE(registers_before_parking(2, parked_before));
  uvm::end_pacing(pinning);
  REQUIRE(wait_for_pinned(pinning, bytes));
  CHECK(registrations() == 3);
  REQUIRE(uvm::unpin_host_memory(kCall, &memory) == UVM_OK);
}

TEST_CASE("a step that cannot be registered ends the pinning, saying why; what was pinned is given back",
          "[pinned][steps]") {
  FakeMachine machine;
  fake::fail_next("cudaHostRegister", cudaErrorNotSupported);
  uvm::PinnedMemory memory;
  REQUIRE(uvm::pin_host_memory_in_steps(kCall, kBytes, 0, &memory) == UVM_OK);
  {
    std::unique_lock<std::mutex> lock(memory.steps->mutex);
    memory.steps->changed.wait(lock, [&] { return memory.steps->done; });
    CHECK(memory.steps->failure == "cudaHostRegister: cudaErrorNotSupported");
    CHECK(memory.steps->pinned == 0);
  }
  CHECK(cudaPeekAtLastError() == cudaSuccess);
  REQUIRE(uvm::unpin_host_memory(kCall, &memory) == UVM_OK);
  CHECK(FakeMachine::ops_named(fake::OpKind::host_unregister).empty());  // nothing was registered
}

TEST_CASE("pageable staging memory is mapped and faulted in, never pinned, and unmapped", "[pinned]") {
  FakeMachine machine;
  uvm::PinnedMemory memory;
  REQUIRE(uvm::pin_host_memory(kCall, kBytes, uvm::PinnedKind::pageable, &memory) == UVM_OK);
  CHECK(memory.kind == uvm::PinnedKind::pageable);
  CHECK(FakeMachine::pinnings() == 0);
  std::memset(memory.host, 0x5a, kBytes);
  REQUIRE(uvm::unpin_host_memory(kCall, &memory) == UVM_OK);
  CHECK(FakeMachine::ops_named(fake::OpKind::host_unregister).empty());
  CHECK(FakeMachine::ops_named(fake::OpKind::host_free).empty());
}

TEST_CASE("an unpinning that fails names the call, leaves nothing pending, and a second one gives all back",
          "[pinned][errors]") {
  // Issue 58 item 5: a failed unregistration in steps left the steps before it unregistered, and the
  // next try unregistered them again, failing for ever: the memory could never go back.
  FakeMachine machine;
  const size_t blocks_before = fake::pinned_blocks();
  uvm::PinnedMemory memory;
  SECTION("registered at once") {
    REQUIRE(uvm::pin_host_memory(kCall, kBytes, uvm::PinnedKind::registered, &memory) == UVM_OK);
    fake::fail_next("cudaHostUnregister", cudaErrorInvalidValue);
    CHECK(uvm::unpin_host_memory(kCall, &memory) == UVM_ERROR_CUDA);
    CHECK_THAT(last_error(), Has("cudaHostUnregister(") && Has("cudaErrorInvalidValue"));
  }
  SECTION("by cudaHostAlloc") {
    REQUIRE(uvm::pin_host_memory(kCall, kBytes, uvm::PinnedKind::host_alloc, &memory) == UVM_OK);
    fake::fail_next("cudaFreeHost", cudaErrorInvalidValue);
    CHECK(uvm::unpin_host_memory(kCall, &memory) == UVM_ERROR_CUDA);
    CHECK_THAT(last_error(), Has("cudaFreeHost(") && Has("cudaErrorInvalidValue"));
  }
  SECTION("in steps, failing at the second") {
    REQUIRE(uvm::pin_host_memory_in_steps(kCall, 2 * uvm::kPinStepBytes + kBytes, 0, &memory) == UVM_OK);
    REQUIRE(wait_for_pinned(*memory.steps, 2 * uvm::kPinStepBytes + kBytes));
    fake::fail_next("cudaHostUnregister", cudaErrorInvalidValue, 1);
    CHECK(uvm::unpin_host_memory(kCall, &memory) == UVM_ERROR_CUDA);
    CHECK_THAT(last_error(), Has("cudaHostUnregister(") && Has("cudaErrorInvalidValue"));
    CHECK(fake::pinned_blocks() == blocks_before + 2);  // the first step went; the second and third stay
  }
  CHECK(cudaPeekAtLastError() == cudaSuccess);
  CHECK(fake::pinned_blocks() > blocks_before);
  REQUIRE(uvm::unpin_host_memory(kCall, &memory) == UVM_OK);
  CHECK(fake::pinned_blocks() == blocks_before);
}
