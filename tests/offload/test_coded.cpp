// Compressed backups in uvm_pause and uvm_resume (offload/media/coded.cpp): bf16 weights kept in fewer
// bytes, pinned, mapped or on disk, and brought back bit for bit, beside neighbours that must not
// change; a failure at any step loses nothing; where the coder cannot load, plain copies.
#include <algorithm>
#include <cstring>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "../../offload/coder/codec.hpp"
#include "../../offload/coder/kernels.hpp"
#include "codec_data.hpp"
#include "fixture.hpp"

namespace {
using codec_data::Bytes;
using codec_data::first_difference;
constexpr size_t kChunk = uvm::codec::kChunkBytes;
constexpr size_t kMiB = size_t{1} << 20;

// bf16 weights of `bytes` with a chunk of random bytes (kept raw) and one of NaNs, infinities, -0
// and denormals, which the coder must keep exactly too.
Bytes weights(size_t bytes, unsigned seed) {
  Bytes data = codec_data::gaussian_bf16(bytes, seed);
  const Bytes noise = codec_data::random_bytes(kChunk, seed + 1), special = codec_data::special_values(kChunk);
  std::memcpy(&data[5 * kChunk], noise.data(), kChunk);
  std::memcpy(&data[9 * kChunk], special.data(), kChunk);
  return data;
}

// An allocation made under `tag` with `backup`, compressed (uvm_set_thread_compression), holding
// `data`: releasable device memory, or managed memory.
struct Compressed {
  Compressed(const char* tag, uvm_backup backup, Bytes bytes, bool managed = false)
      : data(std::move(bytes)), size(data.size()) {
    REQUIRE(uvm_set_thread_tag(tag) == UVM_OK);
    REQUIRE(uvm_set_thread_backup(backup) == UVM_OK);
    REQUIRE(uvm_set_thread_compression(1) == UVM_OK);
    ptr = static_cast<uint8_t*>(managed ? uvm_malloc(size, 0, nullptr) : uvm_malloc_releasable(size, 0, nullptr));
    REQUIRE(uvm_set_thread_compression(0) == UVM_OK);
    REQUIRE(uvm_set_thread_backup(UVM_BACKUP_NONE) == UVM_OK);
    REQUIRE(uvm_set_thread_tag(nullptr) == UVM_OK);
    REQUIRE(ptr != nullptr);
    std::memcpy(ptr, data.data(), size);
  }
  ~Compressed() { uvm_free(ptr, size, 0, nullptr); }
  // The first byte in [from, to) that differs from what it must hold; SIZE_MAX for none.
  size_t differs(size_t from = 0, size_t to = 0) const {
    to = to ? to : size;
    return first_difference(Bytes(ptr + from, ptr + to), Bytes(data.begin() + from, data.begin() + to));
  }
  Bytes data;
  size_t size;
  uint8_t* ptr = nullptr;
};

struct CompressedBytes {
  size_t raw = 0, stored = 0;
};
CompressedBytes compressed_copies(const char* tag) {
  CompressedBytes c;
  REQUIRE(uvm_get_compressed_copies(UVM_ANY_DEVICE, tag, &c.raw, &c.stored) == UVM_OK);
  return c;
}

size_t paused(const char* tag) {
  size_t count = 0;
  REQUIRE(uvm_paused_count(UVM_ANY_DEVICE, tag, &count) == UVM_OK);
  return count;
}

const void* host_copy(const void* ptr, size_t size) {
  const void* host = nullptr;
  REQUIRE(uvm_get_staged_copy(ptr, size, &host) == UVM_OK);
  return host;
}

// What uvm_set_retain_backups says, set for one test.
struct Retaining {
  Retaining() { REQUIRE(uvm_set_retain_backups(1) == UVM_OK); }
  ~Retaining() { uvm_set_retain_backups(0); }
};

// The bytes the "code" phase of this thread's last move reports (uvm_last_move); 0 for none.
size_t code_phase_bytes() {
  uvm_move_report report{};
  REQUIRE(uvm_last_move(UVM_ANY_DEVICE, &report) == UVM_OK);
  for (size_t i = 0; i < report.phase_count; ++i) {
    if (std::string(report.phases[i].name) == "code") return report.phases[i].bytes;
  }
  return 0;
}

// Bytes that are neither a whole number of chunks nor one chunk: 33 chunks and a tail.
constexpr size_t kWeightBytes = 33 * kChunk + 1000;
}  // namespace

TEST_CASE("a compressed pause keeps bf16 weights in at most 0.75 of their bytes and resume brings every bit back",
          "[pause][codec][cuda13]") {
  FakeMachine machine;
  Compressed packed("weights", UVM_BACKUP_HOST, weights(kWeightBytes, 1));
  auto plain = releasable_under("weights", UVM_BACKUP_HOST, 2);  // the same pause, kept as it is
  auto other = releasable_under("kv", UVM_BACKUP_HOST, 3);
  const size_t mapped = fake::mapped_reservations();
  REQUIRE(uvm_pause(UVM_ANY_DEVICE, "weights") == UVM_OK);
  CHECK(paused("weights") == 2);
  CHECK(fake::mapped_reservations() == mapped - 2);
  const CompressedBytes kept = compressed_copies("weights");
  CHECK(kept.raw == kWeightBytes);  // the plain one is not compressed
  // 31 chunks coded (47,104 bytes each), 2 raw and the tail: 0.736.
  CHECK(kept.stored == 31 * uvm::codec::kCodedBytes + 2 * kChunk + 1000);
  CHECK(kept.stored <= kWeightBytes * 3 / 4);
  CHECK(kept_copies(0, "weights").pinned_bytes == kWeightBytes + kMiB);
  CHECK(host_copy(packed.ptr, packed.size) == nullptr);  // coded: nothing to read in place
  CHECK(host_copy(plain->ptr, plain->size) != nullptr);
  CHECK(!FakeMachine::ops_named(fake::OpKind::codec_kernel).empty());
  CHECK(other->intact());
  CHECK(code_phase_bytes() == kWeightBytes);  // the compressed one's, in the pause's report

  REQUIRE(uvm_resume(UVM_ANY_DEVICE, "weights") == UVM_OK);
  CHECK(code_phase_bytes() == kWeightBytes);
  CHECK(packed.differs() == SIZE_MAX);
  CHECK(plain->intact());
  CHECK(paused("weights") == 0);
  CHECK(compressed_copies("weights").raw == 0);  // given back with the resume
  CHECK(kept_copies(0, "weights").pinned_bytes == 0);
  CHECK(cudaPeekAtLastError() == cudaSuccess);
}

// The coder's kernels read and write 16 bytes at a time from a piece's start; a pause's pieces are
// what is left of an allocation after bytes already offloaded, so they can start and end anywhere
// (issue 73: on an H200, `uvm.offload(w[:1])` then a compressed pause lost the GPU context).
TEST_CASE("a compressed pause of pieces that start and end at any byte codes them and brings every bit back",
          "[pause][codec][cuda13]") {
  FakeMachine machine;
  const bool managed = GENERATE(false, true);
  const uvm_backup backup = GENERATE(UVM_BACKUP_HOST, UVM_BACKUP_MMAP);
  CAPTURE(managed, backup);
  Compressed packed("unaligned", backup, weights(kWeightBytes, 21), managed);
  auto neighbour = releasable_under("unaligned neighbour", UVM_BACKUP_HOST, 22);
  // Offloaded first: one bf16 word at the start, and a run from inside chunk 3 to inside chunk 4,
  // so the pause's pieces start at bytes 2 and 4 * kChunk + 3 and one ends at 3 * kChunk + 5.
  const uvm_range offloaded[] = {{packed.ptr, 2}, {packed.ptr + 3 * kChunk + 5, kChunk - 2}};
  REQUIRE(uvm_offload_ranges(offloaded, 2, UVM_STRATEGY_AUTO, nullptr) == UVM_OK);
  REQUIRE(uvm_pause(UVM_ANY_DEVICE, "unaligned") == UVM_OK);
  CHECK(cudaPeekAtLastError() == cudaSuccess);
  const CompressedBytes kept = compressed_copies("unaligned");
  CHECK(kept.raw == kWeightBytes - 2 - (kChunk - 2));
  CHECK(kept.stored <= kept.raw * 3 / 4);  // still coded, not kept raw for its odd start
  REQUIRE(uvm_resume(UVM_ANY_DEVICE, "unaligned") == UVM_OK);
  const uvm_range whole = {packed.ptr, packed.size};
  REQUIRE(uvm_onload_ranges(&whole, 1, nullptr) == UVM_OK);
  CHECK(packed.differs() == SIZE_MAX);
  CHECK(neighbour->intact());
  CHECK(compressed_copies("unaligned").raw == 0);
  CHECK(cudaPeekAtLastError() == cudaSuccess);
}

TEST_CASE("managed memory pauses compressed; an onload of part of it writes only that part, across chunk edges",
          "[pause][codec][cuda13]") {
  FakeMachine machine;
  Compressed first("managed", UVM_BACKUP_HOST, weights(kWeightBytes, 4), true);
  Compressed second("managed", UVM_BACKUP_HOST, weights(kWeightBytes, 5), true);
  REQUIRE(uvm_pause(UVM_ANY_DEVICE, "managed") == UVM_OK);
  CHECK(compressed_copies("managed").raw == 2 * kWeightBytes);
  // From inside chunk 3 to inside chunk 7, then a part of one chunk, then a part of the tail.
  const size_t from = 3 * kChunk + 100, to = 7 * kChunk + 5;
  uvm_range parts[] = {{first.ptr + from, to - from}, {first.ptr + 12 * kChunk + 7, 300},
                       {first.ptr + 33 * kChunk + 10, 500}};
  // The double keeps discarded bytes as they were: marked, they show a byte written outside.
  std::memset(first.ptr, 0xEE, first.size);
  REQUIRE(uvm_onload_ranges(parts, 3, nullptr) == UVM_OK);
  CHECK(first.differs(from, to) == SIZE_MAX);
  CHECK(first.differs(12 * kChunk + 7, 12 * kChunk + 307) == SIZE_MAX);
  CHECK(first.differs(33 * kChunk + 10, 33 * kChunk + 510) == SIZE_MAX);
  CHECK(first.ptr[from - 1] == 0xEE);
  CHECK(first.ptr[to] == 0xEE);
  CHECK(first.ptr[12 * kChunk + 6] == 0xEE);
  CHECK(first.ptr[12 * kChunk + 307] == 0xEE);
  CHECK(first.ptr[33 * kChunk + 9] == 0xEE);
  CHECK(first.ptr[33 * kChunk + 510] == 0xEE);
  CHECK(compressed_copies("managed").raw == 2 * kWeightBytes);  // the rest still holds the whole copy
  REQUIRE(uvm_resume(UVM_ANY_DEVICE, "managed") == UVM_OK);
  CHECK(first.differs() == SIZE_MAX);
  CHECK(second.differs() == SIZE_MAX);
  CHECK(compressed_copies("managed").raw == 0);
  // Decoded pages the driver still counts as discarded would be dropped by a move to the CPU.
  const uvm_range both[] = {{first.ptr, first.size}, {second.ptr, second.size}};
  REQUIRE(uvm_offload_ranges(both, 2, UVM_STRATEGY_MIGRATE, nullptr) == UVM_OK);
  REQUIRE(uvm_onload_ranges(both, 2, nullptr) == UVM_OK);
  CHECK(first.differs() == SIZE_MAX);
  CHECK(second.differs() == SIZE_MAX);
  CHECK(cudaPeekAtLastError() == cudaSuccess);
}

TEST_CASE("compressed copies kept in mapped memory and on disk come back bit for bit; the file goes with the resume",
          "[pause][codec][spill][cuda13]") {
  FakeMachine machine;
  const std::string& dir = test_disk_dir();
  REQUIRE(uvm_set_disk_backup_dir(dir.c_str()) == UVM_OK);
  const size_t files_before = backup_files(dir).size();
  Compressed mapped("coded mapped", UVM_BACKUP_MMAP, weights(kWeightBytes, 6));
  Compressed on_disk("coded disk", UVM_BACKUP_DISK, weights(kWeightBytes + 4096, 7), true);
  REQUIRE(uvm_pause(UVM_ANY_DEVICE, nullptr) == UVM_OK);
  CHECK(kept_copies(0, "coded mapped").pageable_bytes == kWeightBytes);
  CHECK(kept_copies(0, "coded disk").disk_bytes == kWeightBytes + 4096);
  CHECK(kept_copies(0, "coded disk").disk_files == 1);
  CHECK(backup_files(dir).size() == files_before + 1);
  CHECK(compressed_copies("coded disk").stored < (kWeightBytes + 4096) * 3 / 4);
  REQUIRE(uvm_resume(UVM_ANY_DEVICE, nullptr) == UVM_OK);
  CHECK(mapped.differs() == SIZE_MAX);
  CHECK(on_disk.differs() == SIZE_MAX);
  CHECK(backup_files(dir).size() == files_before);
  CHECK(compressed_copies(nullptr).raw == 0);
}

TEST_CASE("a retained compressed copy stays until the next pause, which codes the bytes as they are then",
          "[pause][codec][retain][cuda13]") {
  FakeMachine machine;
  Retaining retain;
  Compressed packed("retained", UVM_BACKUP_HOST, weights(kWeightBytes, 8));
  REQUIRE(uvm_pause(UVM_ANY_DEVICE, "retained") == UVM_OK);
  REQUIRE(uvm_resume(UVM_ANY_DEVICE, "retained") == UVM_OK);
  CHECK(packed.differs() == SIZE_MAX);
  CHECK(kept_copies(0, "retained").retained_bytes == kWeightBytes);
  CHECK(compressed_copies("retained").raw == kWeightBytes);
  // The program changes the weights; the next pause must keep the new ones.
  packed.data = weights(kWeightBytes, 9);
  std::memcpy(packed.ptr, packed.data.data(), packed.size);
  REQUIRE(uvm_pause(UVM_ANY_DEVICE, "retained") == UVM_OK);
  CHECK(kept_copies(0, "retained").retained_bytes == 0);
  CHECK(compressed_copies("retained").raw == kWeightBytes);  // one copy, the new one
  REQUIRE(uvm_resume(UVM_ANY_DEVICE, "retained") == UVM_OK);
  CHECK(packed.differs() == SIZE_MAX);
}

// Where in the op log `wanted` first comes at or after `from` (ops.size() if never).
size_t find_op(const std::vector<fake::Op>& ops, size_t from, const std::function<bool(const fake::Op&)>& wanted) {
  for (size_t i = from; i < ops.size(); ++i) {
    if (wanted(ops[i])) return i;
  }
  return ops.size();
}

TEST_CASE("a compressed pause chooses one allocation ahead and gives its memory back once its own copy ends",
          "[pause][codec][cuda13]") {
  FakeMachine machine;
  Compressed first("overlap", UVM_BACKUP_HOST, weights(kWeightBytes, 12));
  Compressed second("overlap", UVM_BACKUP_HOST, weights(kWeightBytes, 13));
  Compressed* const earlier = first.ptr < second.ptr ? &first : &second;  // coded and copied first
  Compressed* const later = earlier == &first ? &second : &first;
  fake::reset_ops();
  REQUIRE(uvm_pause(UVM_ANY_DEVICE, "overlap") == UVM_OK);
  const std::vector<fake::Op> ops = fake::ops();
  const auto tail_of = [&](const Compressed* c) {  // the copy of its raw tail: the last of its copy
    return find_op(ops, 0, [&](const fake::Op& op) {
      return op.call == fake::OpKind::copy_to_host && op.ptr == c->ptr + 33 * kChunk;
    });
  };
  const size_t earlier_tail = tail_of(earlier), later_tail = tail_of(later);
  REQUIRE(earlier_tail < later_tail);
  REQUIRE(later_tail < ops.size());
  // The later one is chosen (its first kernel) once the earlier one's copies are issued, not before
  // them: the copies out begin after one allocation's choosing.
  const size_t later_chosen = find_op(ops, 0, [&](const fake::Op& op) {
    return op.call == fake::OpKind::codec_kernel && op.ptr == later->ptr;
  });
  CHECK(later_chosen > earlier_tail);
  // Its flags reach the host with no copy on the choosing's stream: one there would queue behind
  // the copies out on the copy engine, and the host would wait for them to learn the room it takes.
  for (const fake::Op& op : ops) {
    if (op.stream != ops[later_chosen].stream) continue;
    INFO("on the choosing's stream: " << op.call << " of " << op.size << " bytes");
    CHECK(op.call != fake::OpKind::copy_to_host);
  }
  // Its copy's end is marked before the later allocation's copy is done.
  const size_t end_mark = find_op(ops, earlier_tail, [](const fake::Op& op) { return op.call == fake::OpKind::event_record; });
  REQUIRE(end_mark < later_tail);
  const size_t unmapped = find_op(ops, 0, [&](const fake::Op& op) {
    return op.call == fake::OpKind::vmm_unmap && op.ptr == earlier->ptr;
  });
  REQUIRE(unmapped < ops.size());
  // Released after waiting for that mark alone: no wait for the stream (all copies) before it.
  size_t waited = unmapped;
  while (waited > later_tail && ops[waited].call != fake::OpKind::event_sync) --waited;
  REQUIRE(ops[waited].call == fake::OpKind::event_sync);
  CHECK(ops[waited].ptr == ops[end_mark].ptr);
  for (size_t i = later_tail; i < unmapped; ++i) {
    INFO("op " << i << ": " << ops[i].call);
    CHECK(ops[i].call != fake::OpKind::stream_sync);
    CHECK(ops[i].call != fake::OpKind::device_sync);
  }
  REQUIRE(uvm_resume(UVM_ANY_DEVICE, "overlap") == UVM_OK);
  CHECK(first.differs() == SIZE_MAX);
  CHECK(second.differs() == SIZE_MAX);
}

TEST_CASE("a compressed resume maps each allocation as its decode is issued, not all before the first",
          "[pause][codec][cuda13]") {
  FakeMachine machine;
  Compressed first("mapping", UVM_BACKUP_HOST, weights(kWeightBytes, 14));
  Compressed second("mapping", UVM_BACKUP_HOST, weights(kWeightBytes, 15));
  Compressed* const later = first.ptr < second.ptr ? &second : &first;  // decoded second
  REQUIRE(uvm_pause(UVM_ANY_DEVICE, "mapping") == UVM_OK);
  fake::reset_ops();
  REQUIRE(uvm_resume(UVM_ANY_DEVICE, "mapping") == UVM_OK);
  const std::vector<fake::Op> ops = fake::ops();
  const size_t first_decode = find_op(ops, 0, [](const fake::Op& op) { return op.call == fake::OpKind::codec_kernel; });
  const size_t later_mapped = find_op(ops, 0, [&](const fake::Op& op) {
    return op.call == fake::OpKind::vmm_map && op.ptr == later->ptr;
  });
  REQUIRE(later_mapped < ops.size());
  // The earlier allocation's decode runs while the later one is mapped.
  CHECK(first_decode < later_mapped);
  // Nothing writes into the later one before it is mapped: its bytes all came back.
  CHECK(first.differs() == SIZE_MAX);
  CHECK(second.differs() == SIZE_MAX);
}

TEST_CASE("a compressed pause or resume that fails at any step names it, loses nothing and can be done again",
          "[pause][codec][cuda13]") {
  FakeMachine machine;
  Compressed packed("faults", UVM_BACKUP_HOST, weights(kWeightBytes, 10));
  auto neighbour = releasable_under("faults", UVM_BACKUP_HOST, 11);
  struct Failure {
    const char* call;
    int skip;
    const char* named;
  };
  // The plain neighbour is paused first, in a move of its own: its copy is one cudaMemcpyAsync.
  // (The coder's scratch failing is no failure: the pause keeps plain copies, tested below.)
  for (const Failure& f : {Failure{"cuLaunchKernel", 0, "uvm_codec_choose"},
                           Failure{"cuLaunchKernel", 1, "uvm_codec_encode"},
                           Failure{"cudaMemcpyAsync", 1, "coded bytes to the host"}}) {
    INFO(f.call << " failing after " << f.skip);
    fake::fail_next(f.call, cudaErrorInvalidValue, f.skip);
    CHECK(uvm_pause(UVM_ANY_DEVICE, "faults") == UVM_ERROR_CUDA);
    CHECK(!fake::injection_left(f.call));
    CHECK(mentions(uvm_last_error(), f.named));
    CHECK(cudaPeekAtLastError() == cudaSuccess);
    CHECK(packed.differs() == SIZE_MAX);  // still on the device: the copy failed before the discard
    CHECK(compressed_copies("faults").raw == 0);
    REQUIRE(uvm_resume(UVM_ANY_DEVICE, "faults") == UVM_OK);  // the neighbour, paused before the failure
    CHECK(neighbour->intact());
    CHECK(paused("faults") == 0);
  }
  REQUIRE(uvm_pause(UVM_ANY_DEVICE, "faults") == UVM_OK);
  const CompressedBytes kept = compressed_copies("faults");
  // First the compressed allocation's own mapping, which stays after the failures past it.
  for (const Failure& f : {Failure{"cuMemMap", 0, "cuMemMap"}, Failure{"cuLaunchKernel", 0, "uvm_codec_decode"},
                           Failure{"cudaMemcpyAsync", 1, "coded bytes from the host"}}) {
    INFO(f.call << " failing after " << f.skip);
    fake::fail_next(f.call, cudaErrorInvalidValue, f.skip);
    CHECK(uvm_resume(UVM_ANY_DEVICE, "faults") == UVM_ERROR_CUDA);
    CHECK(!fake::injection_left(f.call));
    CHECK(mentions(uvm_last_error(), f.named));
    CHECK(cudaPeekAtLastError() == cudaSuccess);
    CHECK(paused("faults") == 2);  // still paused, the copy whole: the next resume has it all
    CHECK(compressed_copies("faults").stored == kept.stored);
  }
  REQUIRE(uvm_resume(UVM_ANY_DEVICE, "faults") == UVM_OK);
  CHECK(packed.differs() == SIZE_MAX);
  CHECK(neighbour->intact());
}

// Issue 73, item 8: the coder's scratch (2 x 32 MiB, flags, streams) was made inside every move,
// so a GPU with room for the paused bytes and not for the scratch failed where plain copies work.
TEST_CASE("with no room for the coder's scratch a compressed pause keeps plain copies and a resume decodes on the CPU",
          "[pause][codec][cuda13]") {
  FakeMachine machine;
  Compressed packed("cramped", UVM_BACKUP_HOST, weights(kWeightBytes, 14));
  auto neighbour = releasable_under("cramped", UVM_BACKUP_HOST, 15);
  struct Failure {
    const char* call;
    int skip;
  };
  for (const Failure& f : {Failure{"cudaMalloc", 0}, Failure{"cudaMalloc", 1}, Failure{"cudaMalloc", 2},
                           Failure{"cudaStreamCreateWithFlags", 0}, Failure{"cudaStreamCreateWithFlags", 1},
                           Failure{"cudaHostAlloc", 0}}) {
    CAPTURE(f.call, f.skip);
    fake::fail_next(f.call, cudaErrorMemoryAllocation, f.skip);
    REQUIRE(uvm_pause(UVM_ANY_DEVICE, "cramped") == UVM_OK);
    CHECK(!fake::injection_left(f.call));
    CHECK(cudaPeekAtLastError() == cudaSuccess);
    CHECK(paused("cramped") == 2);
    CHECK(compressed_copies("cramped").raw == 0);  // plain copies
    CHECK(host_copy(packed.ptr, packed.size) != nullptr);
    REQUIRE(uvm_resume(UVM_ANY_DEVICE, "cramped") == UVM_OK);
    CHECK(packed.differs() == SIZE_MAX);
    CHECK(neighbour->intact());
  }
  // Compressed, then resumed where no scratch can be had: every bit back (the double fills new
  // physical memory with a byte of its own), and no kernel decoded it.
  for (const Failure& f : {Failure{"cudaMalloc", 0}, Failure{"cudaMalloc", 1}, Failure{"cudaStreamCreateWithFlags", 0}}) {
    CAPTURE(f.call, f.skip);
    REQUIRE(uvm_pause(UVM_ANY_DEVICE, "cramped") == UVM_OK);
    CHECK(compressed_copies("cramped").raw == kWeightBytes);
    fake::reset_ops();
    fake::fail_next(f.call, cudaErrorMemoryAllocation, f.skip);
    REQUIRE(uvm_resume(UVM_ANY_DEVICE, "cramped") == UVM_OK);
    CHECK(!fake::injection_left(f.call));
    CHECK(cudaPeekAtLastError() == cudaSuccess);
    CHECK(FakeMachine::ops_named(fake::OpKind::codec_kernel).empty());
    CHECK(packed.differs() == SIZE_MAX);
    CHECK(neighbour->intact());
    CHECK(paused("cramped") == 0);
  }
}

TEST_CASE("where the coder cannot load, a compressed pause keeps plain copies", "[pause][codec][cuda13]") {
  FakeMachine machine;
  Compressed packed("no coder", UVM_BACKUP_HOST, weights(kWeightBytes, 12));
  uvm::forget_loaded_kernels_for_test();
  fake::fail_next("cuModuleLoadData", cudaErrorInvalidPtx);  // a driver too old for the PTX
  REQUIRE(uvm_pause(UVM_ANY_DEVICE, "no coder") == UVM_OK);
  CHECK(!fake::injection_left("cuModuleLoadData"));
  CHECK(cudaPeekAtLastError() == cudaSuccess);
  CHECK(compressed_copies("no coder").raw == 0);
  CHECK(kept_copies(0, "no coder").pinned_bytes == kWeightBytes);
  CHECK(host_copy(packed.ptr, packed.size) != nullptr);  // a plain copy
  CHECK(FakeMachine::ops_named(fake::OpKind::codec_kernel).empty());
  REQUIRE(uvm_resume(UVM_ANY_DEVICE, "no coder") == UVM_OK);
  CHECK(packed.differs() == SIZE_MAX);
  REQUIRE(uvm_pause(UVM_ANY_DEVICE, "no coder") == UVM_OK);  // it loads now
  CHECK(compressed_copies("no coder").raw == kWeightBytes);
  REQUIRE(uvm_resume(UVM_ANY_DEVICE, "no coder") == UVM_OK);
  CHECK(packed.differs() == SIZE_MAX);
}

TEST_CASE("uvm_prepare_pause loads the coder ahead, whatever the backup: the first compressed pause loads nothing",
          "[pause][codec][prepare][cuda13]") {
  FakeMachine machine;
  Compressed packed("ahead", UVM_BACKUP_MMAP, weights(kWeightBytes, 14));
  uvm::forget_loaded_kernels_for_test();
  REQUIRE(uvm_prepare_pause(UVM_ANY_DEVICE, "ahead", 0, nullptr) == UVM_OK);
  fake::fail_next("cuModuleLoadData", cudaErrorInvalidPtx);  // a load now would fall back to plain copies
  REQUIRE(uvm_pause(UVM_ANY_DEVICE, "ahead") == UVM_OK);
  CHECK(fake::injection_left("cuModuleLoadData"));
  fake::clear_injections();
  CHECK(compressed_copies("ahead").raw == kWeightBytes);
  REQUIRE(uvm_resume(UVM_ANY_DEVICE, "ahead") == UVM_OK);
  CHECK(packed.differs() == SIZE_MAX);
}

TEST_CASE("a compressed copy cut by a discard or a free keeps the rest; the host memory goes with its last piece",
          "[pause][codec][cuda13]") {
  FakeMachine machine;
  auto packed = std::make_unique<Compressed>("cut", UVM_BACKUP_HOST, weights(kWeightBytes, 13), true);
  REQUIRE(uvm_pause(UVM_ANY_DEVICE, "cut") == UVM_OK);
  // The program drops a middle part of it, across chunk edges: the copy stays for the rest.
  const size_t from = 2 * kChunk + 333, to = 6 * kChunk + 17;
  REQUIRE(uvm_discard(packed->ptr + from, to - from, nullptr) == UVM_OK);
  CHECK(compressed_copies("cut").raw == kWeightBytes);
  REQUIRE(uvm_resume(UVM_ANY_DEVICE, "cut") == UVM_OK);
  CHECK(packed->differs(0, from) == SIZE_MAX);
  CHECK(packed->differs(to) == SIZE_MAX);
  REQUIRE(uvm_pause(UVM_ANY_DEVICE, "cut") == UVM_OK);
  uvm_staging_info before{};
  REQUIRE(uvm_get_staging_info(&before) == UVM_OK);
  CHECK(before.staged_bytes >= kWeightBytes);
  packed.reset();  // freed while paused
  CHECK(compressed_copies("cut").raw == 0);
  uvm_staging_info after{};
  REQUIRE(uvm_get_staging_info(&after) == UVM_OK);
  CHECK(after.staged_bytes == before.staged_bytes - kWeightBytes);
}

TEST_CASE("uvm_set_thread_compression takes 0 or 1", "[pause][codec]") {
  CHECK(uvm_set_thread_compression(2) == UVM_ERROR_INVALID_ARGUMENT);
  CHECK(mentions(uvm_last_error(), "compress is 2, not 0 or 1"));
  CHECK(uvm_get_thread_compression() == 0);
  REQUIRE(uvm_set_thread_compression(1) == UVM_OK);
  CHECK(uvm_get_thread_compression() == 1);
  REQUIRE(uvm_set_thread_compression(0) == UVM_OK);
  size_t raw = 1;
  REQUIRE(uvm_get_compressed_copies(UVM_ANY_DEVICE, nullptr, &raw, nullptr) == UVM_OK);
  CHECK(raw == 0);
}
