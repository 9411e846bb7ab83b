// uvm_pause and uvm_resume (offload/moves/pause.cpp): whole tags off the GPU and back, each allocation
// kept or dropped as the backup recorded with it says.
#include <unistd.h>

#include <algorithm>
#include <cstring>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "fixture.hpp"

namespace {
constexpr size_t kMiB = size_t{1} << 20;

size_t paused(int device, const char* tag) {
  size_t count = 0;
  REQUIRE(uvm_paused_count(device, tag, &count) == UVM_OK);
  return count;
}
}  // namespace

TEST_CASE("pause keeps what has a host backup, drops the rest, frees both; resume brings the kept bytes back",
          "[pause][cuda13]") {
  FakeMachine machine;
  auto kept = releasable_under("weights", UVM_BACKUP_HOST, 1);
  auto dropped = releasable_under("weights", UVM_BACKUP_NONE, 2);
  auto other = releasable_under("kv", UVM_BACKUP_HOST, 3);
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
  auto on0 = releasable_under("weights", UVM_BACKUP_HOST, 1, kMiB, 0);
  fake::set_thread_context(1);
  auto on1 = releasable_under("weights", UVM_BACKUP_HOST, 2, kMiB, 1);
  fake::set_thread_context(0);
  REQUIRE(uvm_pause(1, "weights") == UVM_OK);
  CHECK(paused(0, "weights") == 0);
  CHECK(paused(1, "weights") == 1);
  CHECK(fake::current_context() == 0);  // the caller's context, restored
  auto late = releasable_under("weights", UVM_BACKUP_HOST, 4, kMiB, 1);
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
  auto kept = releasable_under("weights", UVM_BACKUP_HOST, 1);
  auto dropped = releasable_under("weights", UVM_BACKUP_NONE, 2);
  fake::fail_next("cudaMemcpyAsync", cudaErrorInvalidValue);
  CHECK(uvm_pause(0, "weights") == UVM_ERROR_CUDA);
  CHECK_THAT(last_error(), Has("uvm_pause(device=0, tag=\"weights\")"));
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
  CHECK_THAT(last_error(), Has("uvm_pause(device=7, tag=any)"));
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

namespace {
// uvm_set_retain_backups(1) for one test, 0 again after it (the setting is process-wide).
struct Retaining {
  Retaining() { REQUIRE(uvm_set_retain_backups(1) == UVM_OK); }
  ~Retaining() { uvm_set_retain_backups(0); }
};

const unsigned char* host_copy(const Releasable& memory) {
  const void* host = nullptr;
  REQUIRE(uvm_get_staged_copy(memory.ptr, memory.size, &host) == UVM_OK);
  return static_cast<const unsigned char*>(host);
}
}  // namespace

TEST_CASE("a resume that retains keeps the pinned copy at its address; the next pause writes it there",
          "[pause][retain][cuda13]") {
  FakeMachine machine;
  auto weights = releasable_under("weights", UVM_BACKUP_HOST, 1);
  REQUIRE(uvm_pause(0, "weights") == UVM_OK);
  const unsigned char* first = host_copy(*weights);
  REQUIRE(first != nullptr);
  {
    Retaining retain;
    CHECK(uvm_get_retain_backups() == 1);
    REQUIRE(uvm_resume(0, "weights") == UVM_OK);
    CHECK(weights->intact());
    CHECK(host_copy(*weights) == first);  // still there, at the same address, holding the bytes
    CHECK(weights->held_by(first));
    CHECK(residency(0, "weights").staged_bytes == 0);  // not staged: the device has the bytes
    CHECK(kept_copies(0, "weights").retained_bytes == kMiB);

    weights->seed = 9;  // the program changes them
    weights->fill();
    fake::device_wrote(weights->ptr, weights->size);
    REQUIRE(uvm_pause(0, "weights") == UVM_OK);
    CHECK(host_copy(*weights) == first);  // written again in place
    CHECK(weights->held_by(first));
    CHECK(kept_copies(0, "weights").retained_bytes == 0);  // staged again
    CHECK(kept_copies(0, "weights").pinned_bytes == kMiB);
  }
  REQUIRE(uvm_resume(0, "weights") == UVM_OK);  // without retaining: the copy goes
  CHECK(weights->intact());
  CHECK(host_copy(*weights) == nullptr);
  CHECK(kept_copies(0, "weights").retained_bytes == 0);
  CHECK(uvm_get_retain_backups() == 0);
}

TEST_CASE("a retained copy in parts (cut where a step of its first pinning ended) is written again in place, "
          "so a steady pause pins nothing", "[scenario][pause][retain][steps][cuda13]") {
  FakeMachine machine;
  REQUIRE(uvm_release_staging() == UVM_OK);  // the first pause pins its block in 256 MiB steps
  Retaining retain;
  // 3 × 100 MiB: the third lies across the end of the first step, so its copy is in two parts.
  std::vector<std::unique_ptr<Releasable>> weights;
  for (unsigned seed = 1; seed <= 3; ++seed) weights.push_back(releasable_under("weights", UVM_BACKUP_HOST, seed, 100 * kMiB));
  REQUIRE(uvm_pause(0, "weights") == UVM_OK);
  std::vector<const unsigned char*> copies;
  for (const auto& w : weights) copies.push_back(host_copy(*w));
  REQUIRE(uvm_resume(0, "weights") == UVM_OK);
  CHECK(kept_copies(0, "weights").retained_bytes == 300 * kMiB);

  for (const auto& w : weights) {  // the program changes them all
    w->seed += 10;
    w->fill();
    fake::device_wrote(w->ptr, w->size);
  }
  fake::reset_ops();
  REQUIRE(uvm_pause(0, "weights") == UVM_OK);
  CHECK(FakeMachine::pinnings() == 0);  // every byte went to the copy it had
  for (size_t i = 0; i < weights.size(); ++i) {
    INFO("allocation " << i);
    CHECK(host_copy(*weights[i]) == copies[i]);
    CHECK(weights[i]->held_by(copies[i]));  // the new bytes, in place
  }
  CHECK(kept_copies(0, "weights").retained_bytes == 0);
  REQUIRE(uvm_resume(0, "weights") == UVM_OK);
  for (const auto& w : weights) CHECK(w->intact());
}

TEST_CASE("a retained copy dies with its allocation, its block and a discard; the pinned memory goes with the allocation",
          "[pause][retain][cuda13]") {
  FakeMachine machine;
  Retaining retain;
  SECTION("freed, or its block taken back, while retained or while paused: no pinned staging is left") {
    const bool while_paused = GENERATE(false, true);
    const bool block_only = GENERATE(false, true);
    auto weights = releasable_under("weights", UVM_BACKUP_HOST, 1);
    REQUIRE(uvm_pause(0, "weights") == UVM_OK);
    if (!while_paused) REQUIRE(uvm_resume(0, "weights") == UVM_OK);
    CHECK(fake::pinned_blocks() > 0);
    if (block_only) {
      REQUIRE(uvm_block_freed(weights->ptr, weights->size) == UVM_OK);
    } else {
      weights.reset();
    }
    CHECK(fake::pinned_blocks() == 0);
    CHECK(kept_copies().retained_bytes == 0);
    CHECK(kept_copies().pinned_bytes == 0);
  }
  SECTION("a block handed out, or taken back, over it") {
    const bool handed_out = GENERATE(false, true);
    auto weights = releasable_under("weights", UVM_BACKUP_HOST, 1);
    REQUIRE(uvm_pause(0, "weights") == UVM_OK);
    REQUIRE(uvm_resume(0, "weights") == UVM_OK);
    REQUIRE(host_copy(*weights) != nullptr);
    const uvm_status status = handed_out ? uvm_block_allocated(weights->ptr, 4096) : uvm_block_freed(weights->ptr, 4096);
    REQUIRE(status == UVM_OK);
    CHECK(host_copy(*weights) == nullptr);  // not in one piece any more
    CHECK(kept_copies().retained_bytes == kMiB - 4096);  // the rest is still the last owner's
    const void* rest = nullptr;
    REQUIRE(uvm_get_staged_copy(weights->ptr + 4096, kMiB - 4096, &rest) == UVM_OK);
    CHECK(rest != nullptr);
  }
  SECTION("discarded") {
    auto weights = releasable_under("weights", UVM_BACKUP_HOST, 1);
    REQUIRE(uvm_pause(0, "weights") == UVM_OK);
    REQUIRE(uvm_resume(0, "weights") == UVM_OK);
    const uvm_range whole = weights->whole();
    REQUIRE(uvm_discard_ranges(&whole, 1, nullptr) == UVM_OK);
    CHECK(host_copy(*weights) == nullptr);
    CHECK(kept_copies().retained_bytes == 0);
    REQUIRE(uvm_onload_ranges(&whole, 1, nullptr) == UVM_OK);
  }
}

TEST_CASE("an mmap copy is retained too and replaced at the next pause", "[pause][retain][spill][cuda13]") {
  FakeMachine machine;
  Retaining retain;
  auto mapped = releasable_under("mapped", UVM_BACKUP_MMAP, 1);
  REQUIRE(uvm_pause(UVM_ANY_DEVICE, nullptr) == UVM_OK);
  const unsigned char* first = host_copy(*mapped);
  REQUIRE(first != nullptr);
  REQUIRE(uvm_resume(UVM_ANY_DEVICE, nullptr) == UVM_OK);
  CHECK(mapped->intact());
  CHECK(host_copy(*mapped) == first);
  CHECK(mapped->held_by(first));
  CHECK(kept_copies(0, "mapped").retained_bytes == kMiB);
  REQUIRE(uvm_pause(0, "mapped") == UVM_OK);
  CHECK(kept_copies(0, "mapped").retained_bytes == 0);
  CHECK(kept_copies(0, "mapped").pageable_bytes == kMiB);
  REQUIRE(uvm_set_retain_backups(0) == UVM_OK);
  REQUIRE(uvm_resume(0, "mapped") == UVM_OK);
  CHECK(mapped->intact());
  CHECK(host_copy(*mapped) == nullptr);
}

TEST_CASE("a retained disk copy keeps its file, written again in place by the next pause, until a resume without "
          "retaining or a free", "[pause][retain][spill][cuda13]") {
  FakeMachine machine;
  const std::string& dir = test_disk_dir();
  REQUIRE(uvm_set_disk_backup_dir(dir.c_str()) == UVM_OK);
  Retaining retain;
  auto first = releasable_under("on disk", UVM_BACKUP_DISK, 2);
  auto second = releasable_under("on disk", UVM_BACKUP_DISK, 3);
  auto mapped = releasable_under("mapped", UVM_BACKUP_MMAP, 4);  // the same pause, another kind of copy
  REQUIRE(uvm_pause(UVM_ANY_DEVICE, nullptr) == UVM_OK);
  const std::vector<std::string> files = backup_files(dir);
  REQUIRE(files.size() == 2);
  REQUIRE(uvm_resume(UVM_ANY_DEVICE, nullptr) == UVM_OK);
  CHECK(first->intact());
  CHECK(second->intact());
  CHECK(backup_files(dir) == files);  // kept, with their blocks
  CHECK(kept_copies(0, "on disk").retained_bytes == 2 * kMiB);
  CHECK(host_copy(*first) == nullptr);  // a file is not host memory

  first->seed = 9;  // the program changes one of them
  first->fill();
  fake::device_wrote(first->ptr, first->size);
  REQUIRE(uvm_pause(UVM_ANY_DEVICE, nullptr) == UVM_OK);
  CHECK(backup_files(dir) == files);  // written again in place: no new file
  CHECK(kept_copies(0, "on disk").retained_bytes == 0);
  CHECK(kept_copies(0, "on disk").disk_bytes == 2 * kMiB);
  CHECK(kept_copies(0, "on disk").disk_files == 2);
  REQUIRE(uvm_resume(UVM_ANY_DEVICE, nullptr) == UVM_OK);
  CHECK(first->intact());  // the new bytes came back
  CHECK(second->intact());
  CHECK(mapped->intact());

  SECTION("a resume without retaining removes them") {
    REQUIRE(uvm_pause(0, "on disk") == UVM_OK);
    REQUIRE(uvm_set_retain_backups(0) == UVM_OK);
    REQUIRE(uvm_resume(0, "on disk") == UVM_OK);
    CHECK(first->intact());
    CHECK(backup_files(dir).empty());
    CHECK(kept_copies().retained_bytes == kMiB);  // the mmap copy, until its next pause or resume
  }
  SECTION("freeing an allocation removes its file") {
    second.reset();
    CHECK(backup_files(dir).size() == 1);
    first.reset();
    CHECK(backup_files(dir).empty());
  }
  SECTION("a file removed meanwhile is not written again: the next pause makes another") {
    for (const std::string& name : files) REQUIRE(unlink((dir + "/" + name).c_str()) == 0);
    REQUIRE(uvm_pause(0, "on disk") == UVM_OK);
    const auto made_again = backup_files(dir);
    CHECK(made_again.size() == 2);
    for (const std::string& name : made_again) CHECK(std::find(files.begin(), files.end(), name) == files.end());
    REQUIRE(uvm_resume(0, "on disk") == UVM_OK);
    CHECK(first->intact());
    CHECK(second->intact());
  }
  first.reset();
  second.reset();
  CHECK(backup_files(dir).empty());
}

TEST_CASE("uvm_set_retain_backups takes 0 or 1", "[pause][retain]") {
  FakeMachine machine;
  CHECK(uvm_set_retain_backups(2) == UVM_ERROR_INVALID_ARGUMENT);
  CHECK_THAT(last_error(), Has("uvm_set_retain_backups(): retain is 2, not 0 or 1"));
  CHECK(uvm_get_retain_backups() == 0);
}

TEST_CASE("a pause never drops an allocation made, while it waits, at the address of one freed", "[pause][cuda13]") {
  // uvm_pause waits for the device before it moves anything. If, meanwhile, another thread frees an
  // allocation of the paused tag and the address goes to an allocation of another tag, the pause
  // must not drop the new one's bytes: it chooses what to move where the move begins.
  FakeMachine machine;
  // Small-pool segments (2 MiB) are slots of a slab (alloc/slabs.hpp): a freed slot, in a slab that a
  // neighbour keeps, is the next one handed out.
  constexpr size_t kSlot = 2 * kMiB;
  REQUIRE(uvm_set_thread_tag("scratch") == UVM_OK);
  void* freed = uvm_malloc(kSlot, 0, nullptr);
  REQUIRE(uvm_set_thread_tag(nullptr) == UVM_OK);
  REQUIRE(freed != nullptr);
  void* neighbour = uvm_malloc(kSlot, 0, nullptr);
  REQUIRE(neighbour != nullptr);
  fake::hold_next("cudaDeviceSynchronize");
  uvm_status paused_status = UVM_ERROR_CUDA;
  TestThread pauser([&] {
    fake::set_thread_context(0);
    paused_status = uvm_pause(0, "scratch");
  });
  REQUIRE(fake::wait_until_held());
  uvm_free(freed, kSlot, 0, nullptr);
  REQUIRE(uvm_set_thread_tag("weights") == UVM_OK);
  auto* kept = static_cast<unsigned char*>(uvm_malloc(kSlot, 0, nullptr));
  REQUIRE(uvm_set_thread_tag(nullptr) == UVM_OK);
  REQUIRE(kept != nullptr);
  INFO("the new allocation took the freed address: " << (kept == freed));
  std::memset(kept, 0x5a, kSlot);
  fake::release_held();
  pauser.join();
  CHECK(paused_status == UVM_OK);
  size_t wrong = 0;
  for (size_t i = 0; i < kSlot; ++i) wrong += kept[i] != 0x5a;
  CHECK(wrong == 0);
  CHECK(paused(0, "weights") == 0);
  CHECK(residency(0, "weights").discarded_bytes == 0);
  CHECK(cudaPeekAtLastError() == cudaSuccess);
  uvm_free(kept, kSlot, 0, nullptr);
  uvm_free(neighbour, kSlot, 0, nullptr);
}

TEST_CASE("uvm_set_backup chooses at the pause what each tag keeps; a paused allocation keeps its own",
          "[pause][set_backup][cuda13]") {
  FakeMachine machine;
  auto weights = releasable_under("weights", UVM_BACKUP_NONE, 1);  // made to be dropped, kept after all
  auto kv = releasable_under("kv", UVM_BACKUP_HOST, 2);            // made to be kept, dropped after all
  size_t changed = 7;
  REQUIRE(uvm_set_backup(UVM_ANY_DEVICE, "weights", UVM_BACKUP_HOST, 0, &changed) == UVM_OK);
  CHECK(changed == 1);
  REQUIRE(uvm_set_backup(0, "kv", UVM_BACKUP_NONE, 1, nullptr) == UVM_OK);  // compress: nothing to compress
  uvm_allocation_state state{};
  REQUIRE(uvm_get_allocation_state(kv->ptr + 100, &state) == UVM_OK);  // any byte of it
  CHECK(state.base == kv->ptr);
  CHECK(state.size == kMiB);
  CHECK(state.backup == UVM_BACKUP_NONE);
  CHECK(state.compressed == 0);
  CHECK(state.paused == 0);
  CHECK(state.released == 0);

  REQUIRE(uvm_pause(UVM_ANY_DEVICE, nullptr) == UVM_OK);
  CHECK(residency(0, "weights").staged_bytes == kMiB);
  CHECK(residency(0, "kv").staged_bytes == 0);
  REQUIRE(uvm_get_allocation_state(kv->ptr, &state) == UVM_OK);
  CHECK(state.paused == 1);
  CHECK(state.released == 1);
  // Paused: what it was paused with stays, so that resume brings back what was kept.
  REQUIRE(uvm_set_backup(UVM_ANY_DEVICE, nullptr, UVM_BACKUP_HOST, 1, &changed) == UVM_OK);
  CHECK(changed == 0);
  REQUIRE(uvm_get_allocation_state(weights->ptr, &state) == UVM_OK);
  CHECK(state.backup == UVM_BACKUP_HOST);
  CHECK(state.compressed == 0);
  REQUIRE(uvm_resume(UVM_ANY_DEVICE, nullptr) == UVM_OK);
  CHECK(weights->intact());
  REQUIRE(uvm_get_allocation_state(weights->ptr, &state) == UVM_OK);
  CHECK(state.paused == 0);
  CHECK(state.released == 0);
}

TEST_CASE("uvm_set_backup and uvm_get_allocation_state refuse bad arguments by name", "[pause][set_backup]") {
  FakeMachine machine;
  auto weights = releasable_under("weights", UVM_BACKUP_NONE, 1);
  CHECK(uvm_set_backup(0, "weights", static_cast<uvm_backup>(4), 0, nullptr) == UVM_ERROR_INVALID_ARGUMENT);
  CHECK_THAT(last_error(), Has("uvm_set_backup(device=0, tag=\"weights\")"));
  CHECK_THAT(last_error(), Has("backup is 4"));
  CHECK(uvm_set_backup(0, "weights", UVM_BACKUP_HOST, 2, nullptr) == UVM_ERROR_INVALID_ARGUMENT);
  CHECK_THAT(last_error(), Has("compress is 2"));
  CHECK(uvm_set_backup(7, "weights", UVM_BACKUP_HOST, 0, nullptr) == UVM_ERROR_INVALID_ARGUMENT);
  uvm_allocation_state state{};
  int stack = 0;
  CHECK(uvm_get_allocation_state(&stack, &state) == UVM_ERROR_NOT_MANAGED);
  CHECK_THAT(last_error(), Has("uvm_get_allocation_state"));
  CHECK(uvm_get_allocation_state(weights->ptr, nullptr) == UVM_ERROR_INVALID_ARGUMENT);
  CHECK(cudaPeekAtLastError() == cudaSuccess);
}

TEST_CASE("uvm_set_allocation_tag moves one allocation out of its tag's pauses; a paused one is refused",
          "[pause][set_backup][cuda13]") {
  FakeMachine machine;
  auto live = releasable_under("pool", UVM_BACKUP_HOST, 1);
  auto aside = releasable_under("pool", UVM_BACKUP_HOST, 2);
  REQUIRE(uvm_set_allocation_tag(aside->ptr + 5, "pool-aside") == UVM_OK);
  REQUIRE(uvm_pause(UVM_ANY_DEVICE, "pool") == UVM_OK);
  CHECK(paused(UVM_ANY_DEVICE, "pool") == 1);
  CHECK(paused(UVM_ANY_DEVICE, "pool-aside") == 0);
  CHECK(aside->intact());  // not moved: still on the device
  CHECK(uvm_set_allocation_tag(live->ptr, "elsewhere") == UVM_ERROR_INVALID_ARGUMENT);
  CHECK_THAT(last_error(), Has("paused"));
  REQUIRE(uvm_resume(UVM_ANY_DEVICE, "pool") == UVM_OK);
  CHECK(live->intact());
  REQUIRE(uvm_set_allocation_tag(live->ptr, nullptr) == UVM_OK);  // untagged
  CHECK(residency(0, "").device_bytes == kMiB);
  int stack = 0;
  CHECK(uvm_set_allocation_tag(&stack, "x") == UVM_ERROR_NOT_MANAGED);
  CHECK(uvm_set_allocation_tag(live->ptr, std::string(64, 'x').c_str()) == UVM_ERROR_INVALID_ARGUMENT);
  CHECK(cudaPeekAtLastError() == cudaSuccess);
}
