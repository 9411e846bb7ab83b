#include "spill.hpp"

#include <pthread.h>
#include <sched.h>
#include <sys/mman.h>
#include <sys/resource.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cstring>
#include <map>
#include <mutex>
#include <thread>

#include "../../alloc/cuda_compat.hpp"
#include "../../alloc/devices.hpp"
#include "../../alloc/options.hpp"
#include "../../alloc/stats.hpp"
#include "../../hints/moves/trace.hpp"
#include "disk.hpp"
#include "pinned.hpp"
#include "plan.hpp"

namespace uvm {
namespace {

// Pinned buffers kept between moves: pinning 16 MiB takes milliseconds, a move of a few MiB less.
// They are carved from blocks pinned the registered way (pinned.hpp), one block for all the
// buffers a move lacks: cudaHostAlloc faults its pages in one at a time, so 16 buffers pinned that
// way added more than half the copy's own time to every mmap pause that followed a
// uvm_release_staging (a pause after a resume that gave its staging back).
struct BouncePool {
  struct Block {
    PinnedMemory memory;
    size_t buffer_bytes;  // the size of each buffer carved from it
  };
  std::mutex mutex;
  std::map<size_t, std::vector<char*>> idle;  // by buffer size
  std::vector<Block> blocks;                  // every buffer lies in one of them
};

BouncePool& bounce_pool() {
  static auto* pool = [] {
    auto* made = new BouncePool();  // never destroyed: no CUDA calls from static destructors
    // The blocks are not inherited by a child process (MADV_DONTFORK: pinned pages would be
    // copied at every fork), so a child starts with none; the lock is held across the fork so
    // that the child's copy of it is free.
    pthread_atfork([] { bounce_pool().mutex.lock(); }, [] { bounce_pool().mutex.unlock(); },
                   [] {
                     BouncePool& child = bounce_pool();
                     child.idle.clear();
                     child.blocks.clear();
                     child.mutex.unlock();
                   });
    return made;
  }();
  return *pool;
}

// `count` idle buffers of `bytes` each, pinning one block for those the pool lacks.
uvm_status take_buffers(const Call& call, size_t count, size_t bytes, std::vector<char*>* out) {
  BouncePool& pool = bounce_pool();
  {
    std::lock_guard<std::mutex> lock(pool.mutex);
    std::vector<char*>& idle = pool.idle[bytes];
    while (out->size() < count && !idle.empty()) {
      out->push_back(idle.back());
      idle.pop_back();
    }
  }
  const size_t missing = count - out->size();
  if (missing == 0) return UVM_OK;
  // Pinned memory either way; UVM_PINNED=hostalloc asks for cudaHostAlloc.
  const PinnedKind kind = configured_pinned_kind() == PinnedKind::host_alloc ? PinnedKind::host_alloc : PinnedKind::registered;
  PinnedMemory block;
  int device = -1;  // the buffers go on the NUMA node of the device moved for first
  clear_cuda_error(cudaGetDevice(&device));
  if (uvm_status s = pin_host_memory(call, missing * bytes, kind, &block, device)) return s;
  for (size_t i = 0; i < missing; ++i) out->push_back(block.host + i * bytes);
  std::lock_guard<std::mutex> lock(pool.mutex);
  pool.blocks.push_back(BouncePool::Block{block, bytes});
  return UVM_OK;
}

void give_back(const std::vector<char*>& buffers, size_t bytes) {
  BouncePool& pool = bounce_pool();
  std::lock_guard<std::mutex> lock(pool.mutex);
  std::vector<char*>& idle = pool.idle[bytes];
  idle.insert(idle.end(), buffers.begin(), buffers.end());
}

// What a spill's workers do, which decides how many there are and how big their buffers.
enum class SpillWork { memory, disk_write, disk_read };

// The worker threads of a spill: UVM_BACKUP_THREADS, else by their work. Copies in memory are CPU
// work (the kernel faulting in and zeroing the mapping's pages, memcpy): 16 threads wrote a fresh
// mapping at the speed of the pinned backup's pause and 8 did not (bench/probes/mmap_probe.cpp), so one
// per CPU this process may run on, 8 to 16. Disk writes: 8 (16 paused slower). Disk reads: 4
// requests of kDiskReadBytes in flight (docs/measurements.md, "Backups in mmap'ed memory").
size_t worker_threads(SpillWork work) {
  if (options().backup_threads > 0) return static_cast<size_t>(options().backup_threads);
  constexpr size_t kDiskWriteThreads = 8, kDiskReadThreads = 4;
  if (work == SpillWork::disk_write) return kDiskWriteThreads;
  if (work == SpillWork::disk_read) return kDiskReadThreads;
  cpu_set_t cpus;
  const size_t usable = sched_getaffinity(0, sizeof cpus, &cpus) == 0 ? static_cast<size_t>(CPU_COUNT(&cpus)) : 0;
  return std::clamp<size_t>(usable, 8, kMaxBackupThreads);
}

// The bounce buffer of each worker: disk reads take bigger requests, which read faster than more
// smaller ones (docs/measurements.md, "Disk resume: which reads this disk wants").
size_t buffer_bytes(SpillWork work) { return work == SpillWork::disk_read ? kDiskReadBytes : kBounceBytes; }

// Runs `per_batch(call, stream, buffer, index)` for every batch index on the threads `kind` gets
// (no more than there are batches), each in `device`'s context with a stream and a bounce buffer
// of its own. The first failure stops the batches not begun and becomes the call's.
template <typename PerBatch>
uvm_status run_workers(const Call& call, int device, size_t batches, SpillWork kind, PerBatch per_batch) {
  if (batches == 0) return UVM_OK;
  const size_t threads = std::min(batches, worker_threads(kind));
  const size_t bytes = buffer_bytes(kind);
  std::vector<char*> buffers;
  const uvm_status took = take_buffers(call, threads, bytes, &buffers);
  if (took != UVM_OK) {
    give_back(buffers, bytes);
    return took;
  }
  std::atomic<size_t> next{0};
  std::atomic<bool> failed{false};
  std::mutex first_mutex;
  Failure first;
  auto note = [&](uvm_status status) {
    if (status == UVM_OK) return;
    std::lock_guard<std::mutex> lock(first_mutex);
    if (!failed.exchange(true)) first = last_failure();
  };
  auto work = [&](char* buffer) noexcept {
    note(guarded(call, [&] {
      ContextScope scope;
      if (uvm_status s = scope.enter(call, device, ContextScope::When::always)) return s;
      cudaStream_t stream = nullptr;
      if (cudaError_t e = cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking)) {
        return fail_cuda(call, e, "cudaStreamCreateWithFlags for a backup worker");
      }
      uvm_status status = UVM_OK;
      for (size_t i = next++; i < batches && !failed; i = next++) {
        status = per_batch(call, stream, buffer, i);
        if (status != UVM_OK) break;
      }
      clear_cuda_error(cudaStreamSynchronize(stream));  // nothing of a failed batch runs on after
      clear_cuda_error(cudaStreamDestroy(stream));
      return status;
    }));
  };
  std::vector<std::thread> workers;
  try {
    for (size_t t = 1; t < threads; ++t) workers.emplace_back(work, buffers[t]);
  } catch (...) {
    failed = true;  // the threads started stop at their next batch
    for (std::thread& worker : workers) worker.join();
    give_back(buffers, bytes);
    return fail(call, UVM_ERROR_INTERNAL, "could not start %zu backup threads", threads);
  }
  work(buffers[0]);  // the calling thread is a worker too
  for (std::thread& worker : workers) worker.join();
  give_back(buffers, bytes);
  return failed ? adopt(first) : UVM_OK;
}

// Runs `io(chunk_first, bounce, io_begin, io_bytes)` for each run of chunks that follow each other
// both in their target and in the buffer, so that a batch's I/O to one file is one request.
template <typename Io>
uvm_status each_io_run(const SpillBatch& batch, Io io) {
  const std::vector<SpillChunk>& chunks = batch.chunks;
  for (size_t first = 0; first < chunks.size();) {
    size_t end = first + 1;
    size_t bytes = chunks[first].io_bytes;
    while (end < chunks.size() && chunks[end].target == chunks[first].target &&
           chunks[end].io_begin == chunks[first].io_begin + bytes && chunks[end].bounce == chunks[first].bounce + bytes) {
      bytes += chunks[end].io_bytes;
      ++end;
    }
    if (uvm_status s = io(chunks[first], chunks[first].bounce, chunks[first].io_begin, bytes)) return s;
    first = end;
  }
  return UVM_OK;
}

// Where a chunk's own bytes sit in its batch's buffer.
char* chunk_bytes_in(char* buffer, const SpillChunk& chunk) {
  return buffer + chunk.bounce + (chunk.offset - chunk.io_begin);
}


// The caller's work on `stream` (and the moves before, which begin_move ordered there) ends before
// the workers, on streams of their own, touch the bytes.
uvm_status wait_for_caller(const Call& call, cudaStream_t stream) {
  HostPhase waited(Phase::wait);
  if (cudaError_t e = cudaStreamSynchronize(stream)) return fail_cuda(call, e, "cudaStreamSynchronize");
  waited.finish(0);
  return UVM_OK;
}

// The copies an offload writes to: a mapping or a file for each target of `layout`.
struct Targets {
  std::vector<std::shared_ptr<char>> mappings;
  std::vector<std::shared_ptr<BackupFile>> files;
};

// The whole parts of one retained file that tile `piece` exactly, in order (uvm_set_retain_backups:
// the next pause writes them again in place, each at its offset, so its file and blocks stay);
// empty when it has none, or they are cut, in other files or the file was replaced. Read over a
// byte more on each side: a part the piece cuts shows there as reaching past it.
std::vector<StagedPiece> retained_file_parts(const HintRange& piece) {
  std::vector<StagedPiece> parts;
  for (StagedPiece& part : retained_copies(piece.begin - 1, piece.end + 1)) {
    if (part.span.end > piece.begin && part.span.begin < piece.end) parts.push_back(std::move(part));
  }
  uintptr_t covered = piece.begin;
  for (const StagedPiece& part : parts) {
    if (part.kept != Kept::disk || part.coded || part.file != parts.front().file || part.span.begin != covered ||
        part.file_offset % kDiskAlign != 0) {
      return {};
    }
    covered = part.span.end;
  }
  if (parts.empty() || covered != piece.end || !parts.front().file->still_there()) return {};
  return parts;
}

// Where a disk offload's copies go: in place into the retained files that hold them whole
// (`reused`, the first targets), the rest laid out in new files after them.
struct DiskLayout {
  CopyLayout layout;
  std::vector<std::shared_ptr<BackupFile>> reused;
};

DiskLayout lay_out_disk_copies(const std::vector<HintRange>& pieces) {
  DiskLayout out;
  std::map<const BackupFile*, size_t> target_of;
  std::vector<Span> fresh;
  std::vector<uintptr_t> fresh_allocations;
  for (const HintRange& piece : pieces) {
    const std::vector<StagedPiece> parts = retained_file_parts(piece);
    if (parts.empty()) {
      fresh.push_back(Span{piece.begin, piece.end});
      fresh_allocations.push_back(piece.allocation);
      continue;
    }
    auto found = target_of.emplace(parts.front().file.get(), out.reused.size()).first;
    if (found->second == out.reused.size()) {
      out.reused.push_back(parts.front().file);
      out.layout.target_allocations.push_back(piece.allocation);
      out.layout.target_bytes.push_back(parts.front().file->bytes());
    }
    for (const StagedPiece& part : parts) out.layout.items.push_back(SpillItem{part.span, found->second, part.file_offset});
  }
  const CopyLayout rest = lay_out_copies(fresh, fresh_allocations, kDiskAlign);
  const size_t first_new = out.reused.size();
  for (const SpillItem& item : rest.items) out.layout.items.push_back(SpillItem{item.span, first_new + item.target, item.offset});
  out.layout.target_allocations.insert(out.layout.target_allocations.end(), rest.target_allocations.begin(),
                                       rest.target_allocations.end());
  out.layout.target_bytes.insert(out.layout.target_bytes.end(), rest.target_bytes.begin(), rest.target_bytes.end());
  return out;
}

// Makes the targets [first, end) of `layout`, appended to `out` (which holds those before): the
// files of `reused` (its first targets) opened again, new mappings or files for the rest.
uvm_status make_targets(const Call& call, const CopyLayout& layout, const std::vector<std::shared_ptr<BackupFile>>& reused,
                        size_t first, size_t end, Kept kept, Targets* out) {
  for (size_t target = first; target < end; ++target) {
    const uint64_t bytes = layout.target_bytes[target];
    if (target < reused.size()) {
      out->files.push_back(reused[target]);
      if (uvm_status s = reused[target]->reopen(call)) return s;
    } else if (kept == Kept::pageable) {
      out->mappings.emplace_back();
      if (uvm_status s = map_pageable(call, bytes, &out->mappings.back())) return s;
    } else {
      out->files.emplace_back();
      if (uvm_status s = BackupFile::create(call, bytes, &out->files.back())) return s;
    }
  }
  return UVM_OK;
}

std::atomic<size_t> files_at_once_for_test{0};  // set_files_at_once_for_test's, 0 when unset

// How many backup files a move holds open at once. An open file takes a descriptor (from its
// creation until sealed, and while it is read back), a process may hold no more than its limit
// (1,024 by default), and a model may have thousands of tensors, each with a file of its own: a
// quarter of the limit, at most 256, the rest left to the caller (or what a test set instead).
size_t files_at_once() {
  if (const size_t most = files_at_once_for_test.load()) return most;
  constexpr size_t kMost = 256;
  struct rlimit limit {};
  if (getrlimit(RLIMIT_NOFILE, &limit) != 0 || limit.rlim_cur == RLIM_INFINITY) return kMost;
  return std::clamp<size_t>(static_cast<size_t>(limit.rlim_cur) / 4, 1, kMost);
}

// The items of `items` whose targets lie in [first, end).
std::vector<SpillItem> items_of(const std::vector<SpillItem>& items, size_t first, size_t end) {
  std::vector<SpillItem> found;
  for (const SpillItem& item : items) {
    if (item.target >= first && item.target < end) found.push_back(item);
  }
  return found;
}

}  // namespace

uvm_status spill_out(const Call& call, int device, cudaStream_t stream, const std::vector<HintRange>& pieces,
                     Kept kept, std::vector<StagedPiece>* out) {
  if (uvm_status s = wait_for_caller(call, stream)) return s;
  const size_t align = kept == Kept::disk ? kDiskAlign : 64;
  std::vector<Span> spans;
  std::vector<uintptr_t> allocations;
  size_t total = 0;
  for (const HintRange& piece : pieces) {
    spans.push_back(Span{piece.begin, piece.end});
    allocations.push_back(piece.allocation);
    total += piece.end - piece.begin;
  }
  const DiskLayout disk = kept == Kept::disk ? lay_out_disk_copies(pieces) : DiskLayout{};
  const CopyLayout layout = kept == Kept::disk ? disk.layout : lay_out_copies(spans, allocations, align);
  // A retained file written again in place holds a mix of old and new bytes if this fails: its
  // retained copy goes then (and with it the file, unless the caller's copy is staged in it).
  bool done = false;
  struct DropRewrittenOnFailure {
    const std::vector<HintRange>& pieces;
    const DiskLayout& disk;
    const bool& done;
    ~DropRewrittenOnFailure() {
      if (done || disk.reused.empty()) return;
      for (const HintRange& piece : pieces) unstage_copies(piece.begin, piece.end);  // not staged: the retained go
    }
  } drop_rewritten{pieces, disk, done};
  HostPhase phase(Phase::write);
  Targets targets;  // what was made goes with it on a failure: no mapping or file is left
  std::vector<SpillBatch> batches;  // of the group of targets being written
  auto write_batch = [&](const Call& c, cudaStream_t stream, char* buffer, size_t index) {
    const SpillBatch& batch = batches[index];
    for (const SpillChunk& chunk : batch.chunks) {
      const void* from = reinterpret_cast<const void*>(chunk.span.begin);
      if (cudaError_t e = cudaMemcpyAsync(chunk_bytes_in(buffer, chunk), from, chunk.span.size(),
                                          cudaMemcpyDefault, stream)) {
        return fail_cuda(c, e, "cudaMemcpyAsync(%p → bounce buffer, %zu bytes)", from, chunk.span.size());
      }
    }
    if (cudaError_t e = cudaStreamSynchronize(stream)) return fail_cuda(c, e, "cudaStreamSynchronize (copies to a bounce buffer)");
    if (kept == Kept::pageable) {
      for (const SpillChunk& chunk : batch.chunks) {
        std::memcpy(targets.mappings[chunk.target].get() + chunk.offset, chunk_bytes_in(buffer, chunk), chunk.span.size());
      }
      return UVM_OK;
    }
    for (const SpillChunk& chunk : batch.chunks) {  // the padding to the next aligned offset: zeros
      char* end = chunk_bytes_in(buffer, chunk) + chunk.span.size();
      std::memset(end, 0, buffer + chunk.bounce + chunk.io_bytes - end);
    }
    return each_io_run(batch, [&](const SpillChunk& first, size_t bounce, uint64_t io_begin, size_t bytes) {
      const BackupFile& file = *targets.files[first.target];
      return write_file(c, file, file.fd(), buffer + bounce, bytes, io_begin);
    });
  };
  const SpillWork work = kept == Kept::pageable ? SpillWork::memory : SpillWork::disk_write;
  // Files a group at a time: each is open from its creation until sealed (files_at_once).
  const size_t targets_count = layout.target_bytes.size();
  const size_t group = kept == Kept::disk ? files_at_once() : targets_count;
  for (size_t first = 0; first < targets_count; first += group) {
    const size_t end = std::min(first + group, targets_count);
    if (uvm_status s = make_targets(call, layout, disk.reused, first, end, kept, &targets)) return s;
    batches = plan_spill(items_of(layout.items, first, end), kBounceBytes, align);
    if (uvm_status s = run_workers(call, device, batches.size(), work, write_batch)) return s;
    for (size_t target = first; target < end && kept == Kept::disk; ++target) {
      if (uvm_status s = targets.files[target]->seal(call)) return s;
    }
  }
  phase.finish(total);
  done = true;
  out->clear();
  for (const SpillItem& item : layout.items) {
    StagedPiece piece;
    piece.span = item.span;
    piece.kept = kept;
    piece.file_offset = item.offset;
    if (kept == Kept::pageable) {
      piece.lease = targets.mappings[item.target];
      piece.host = piece.lease.get() + item.offset;
    } else {
      piece.file = targets.files[item.target];
    }
    out->push_back(std::move(piece));
  }
  return UVM_OK;
}

uvm_status spill_in(const Call& call, int device, cudaStream_t stream, const std::vector<StagedPiece>& pieces,
                    const std::vector<bool>& managed) {
  if (uvm_status s = wait_for_caller(call, stream)) return s;
  // Disk pieces read their files; pageable pieces read their own host bytes, each its own target
  // at offset 0. Every file is checked before anything moves, then read a group at a time
  // (files_at_once): a changed file fails the onload with nothing moved.
  std::vector<const BackupFile*> files;         // each file once, in the order first met
  std::map<const BackupFile*, size_t> index_of;  // its index there
  std::vector<size_t> file_of(pieces.size());   // a disk piece's index in `files`
  std::vector<SpillItem> in_memory;             // planned apart: only file I/O is widened to kDiskAlign
  std::vector<size_t> memory_piece;
  size_t total = 0;
  for (size_t i = 0; i < pieces.size(); ++i) {
    const StagedPiece& piece = pieces[i];
    total += piece.span.size();
    if (piece.kept != Kept::disk) {
      memory_piece.push_back(i);
      in_memory.push_back(SpillItem{piece.span, i, 0});
      continue;
    }
    auto known = index_of.find(piece.file.get());
    if (known == index_of.end()) {
      int fd = -1;
      if (uvm_status s = piece.file->open_unchanged(call, &fd)) return s;
      close(fd);
      known = index_of.emplace(piece.file.get(), files.size()).first;
      files.push_back(piece.file.get());
    }
    file_of[i] = known->second;
  }
  HostPhase phase(Phase::read);
  std::atomic<uint64_t> prefetches{0};
  // `piece_of` maps the batch's items to pieces; a disk batch's targets index `fds`.
  auto read_batch = [&](const Call& c, cudaStream_t stream, char* buffer, const SpillBatch& batch,
                        const std::vector<size_t>& piece_of, const std::vector<int>* fds, size_t first_file) {
    uvm_status read = each_io_run(batch, [&](const SpillChunk& first, size_t bounce, uint64_t io_begin, size_t bytes) {
      if (fds == nullptr) {
        std::memcpy(buffer + bounce, pieces[first.target].host + io_begin, bytes);
        return UVM_OK;
      }
      return read_file(c, *files[first_file + first.target], (*fds)[first.target], buffer + bounce, bytes, io_begin);
    });
    if (read != UVM_OK) return read;
    for (const SpillChunk& chunk : batch.chunks) {
      void* to = reinterpret_cast<void*>(chunk.span.begin);
      const size_t bytes = chunk.span.size();
      const bool is_managed = managed[piece_of[chunk.item]];
      if (is_managed) {
        if (cudaError_t e = prefetch_to(to, bytes, device, stream)) {
          return fail_cuda(c, e, "cudaMemPrefetchAsync(%p, %zu bytes) populating before the copy", to, bytes);
        }
      }
      if (cudaError_t e = cudaMemcpyAsync(to, chunk_bytes_in(buffer, chunk), bytes, cudaMemcpyDefault, stream)) {
        return fail_cuda(c, e, "cudaMemcpyAsync(bounce buffer → %p, %zu bytes)", to, bytes);
      }
      if (is_managed) {
        if (cudaError_t e = prefetch_to(to, bytes, device, stream)) {
          return fail_cuda(c, e, "cudaMemPrefetchAsync(%p, %zu bytes) undoing the discard after the copy", to, bytes);
        }
        prefetches += 2;
      }
    }
    if (cudaError_t e = cudaStreamSynchronize(stream)) return fail_cuda(c, e, "cudaStreamSynchronize (copies from a bounce buffer)");
    return UVM_OK;
  };
  // Apart: memory copies on many threads with small buffers, then file reads on a few with big ones.
  const std::vector<SpillBatch> memory_batches = plan_spill(in_memory, buffer_bytes(SpillWork::memory), 1);
  uvm_status status = run_workers(call, device, memory_batches.size(), SpillWork::memory,
                                  [&](const Call& c, cudaStream_t stream, char* buffer, size_t index) {
                                    return read_batch(c, stream, buffer, memory_batches[index], memory_piece, nullptr, 0);
                                  });
  const size_t group = files_at_once();
  for (size_t first = 0; status == UVM_OK && first < files.size(); first += group) {
    const size_t end = std::min(first + group, files.size());
    std::vector<int> fds;
    for (size_t f = first; f < end && status == UVM_OK; ++f) {
      fds.push_back(-1);
      status = files[f]->open_unchanged(call, &fds.back());
      if (status != UVM_OK) fds.pop_back();
    }
    std::vector<SpillItem> on_disk;
    std::vector<size_t> disk_piece;
    for (size_t i = 0; i < pieces.size(); ++i) {
      if (pieces[i].kept != Kept::disk || file_of[i] < first || file_of[i] >= end) continue;
      disk_piece.push_back(i);
      on_disk.push_back(SpillItem{pieces[i].span, file_of[i] - first, pieces[i].file_offset});
    }
    if (status == UVM_OK) {
      const std::vector<SpillBatch> batches = plan_spill(on_disk, buffer_bytes(SpillWork::disk_read), kDiskAlign);
      status = run_workers(call, device, batches.size(), SpillWork::disk_read,
                           [&](const Call& c, cudaStream_t stream, char* buffer, size_t index) {
                             return read_batch(c, stream, buffer, batches[index], disk_piece, &fds, first);
                           });
    }
    for (int fd : fds) close(fd);
  }
  record_prefetch_calls(device, prefetches);
  if (status == UVM_OK) phase.finish(total);
  return status;
}

void set_files_at_once_for_test(size_t most) { files_at_once_for_test = most; }

uvm_status free_bounce_buffers(const Call& call) {
  std::vector<BouncePool::Block> unused;  // blocks none of whose buffers is in use
  {
    BouncePool& pool = bounce_pool();
    std::lock_guard<std::mutex> lock(pool.mutex);
    for (auto block = pool.blocks.begin(); block != pool.blocks.end();) {
      std::vector<char*>& idle = pool.idle[block->buffer_bytes];
      const PinnedMemory& memory = block->memory;
      auto inside = [&](char* buffer) { return buffer >= memory.host && buffer < memory.host + memory.bytes; };
      const size_t idle_here = static_cast<size_t>(std::count_if(idle.begin(), idle.end(), inside));
      if (idle_here * block->buffer_bytes < memory.bytes) {
        ++block;
        continue;
      }
      idle.erase(std::remove_if(idle.begin(), idle.end(), inside), idle.end());
      unused.push_back(*block);
      block = pool.blocks.erase(block);
    }
  }
  uvm_status status = UVM_OK;
  for (BouncePool::Block& block : unused) {
    const uvm_status freed = unpin_host_memory(call, &block.memory);
    if (freed == UVM_OK) continue;
    if (status == UVM_OK) status = freed;
    // Still pinned: back in the pool, its buffers idle, for the next spill or the next try.
    BouncePool& pool = bounce_pool();
    std::lock_guard<std::mutex> lock(pool.mutex);
    for (size_t at = 0; at + block.buffer_bytes <= block.memory.bytes; at += block.buffer_bytes) {
      pool.idle[block.buffer_bytes].push_back(block.memory.host + at);
    }
    pool.blocks.push_back(block);
  }
  return status;
}

uvm_status map_pageable(const Call& call, size_t bytes, std::shared_ptr<char>* out) {
  void* host = mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
  if (host == MAP_FAILED) return fail_errno(call, errno, "mmap of %zu bytes of pageable memory for a copy", bytes);
  if (bytes >= (size_t{2} << 20)) madvise(host, bytes, MADV_HUGEPAGE);
  *out = std::shared_ptr<char>(static_cast<char*>(host), [bytes](char* mapped) { munmap(mapped, bytes); });
  return UVM_OK;
}

}  // namespace uvm
