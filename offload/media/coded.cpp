#include "coded.hpp"

#include <unistd.h>

#include <algorithm>
#include <set>
#include <string>

#include "../../alloc/cuda_compat.hpp"
#include "../../hints/moves/trace.hpp"
#include "disk.hpp"
#include "pinned.hpp"
#include "spill.hpp"
#include "staging.hpp"

namespace uvm {
namespace {

size_t round_up(size_t n, size_t to) { return (n + to - 1) / to * to; }

constexpr size_t kCoderAlignment = 16;  // codec_kernels.cu: one uint4 a thread

// Pinned staging for a copy's stored bytes: its parts and leases. A block pinned in steps may hold
// the copy in parts, and the room may come in rounds as its steps are pinned; where no block has
// room, one is pinned at once (ensure_capacity, holding only the caller's moves lock). `stream`
// waits for the copies that may still read the bytes reserved.
uvm_status reserve_pinned(const Call& call, cudaStream_t stream, CodedCopy* copy) {
  const Staging::RoomClaim claim(staging());  // made room stays until it is reserved
  uintptr_t placed = 0;  // the bytes placed so far
  while (placed < copy->stored) {
    const std::vector<Span> rest = {Span{placed, copy->stored}};
    if (!staging().has_room(rest)) {
      if (uvm_status s = staging().ensure_capacity(call, rest)) return s;
    }
    Reservation reserved = staging().reserve_prefix(rest);
    // The copies into these steps are issued next, and nothing waits for this call to say so.
    for (const StepsTaken& taken : reserved.steps_taken) note_copies_issued(*taken.pinning, taken.through);
    for (const EventRef& read : reserved.reused) {
      if (cudaError_t e = cudaStreamWaitEvent(stream, read->handle, 0)) {
        return fail_cuda(call, e, "cudaStreamWaitEvent (staging memory still being read)");
      }
    }
    for (size_t i = 0; i < reserved.spans.size(); ++i) {
      copy->parts.push_back(HostPart{reserved.leases[i].get(), reserved.spans[i].size()});
      copy->leases.push_back(reserved.leases[i]);
      placed = reserved.spans[i].end;
    }
    // Nothing fits yet: wait for the pinning in progress; if there is none, another move took the
    // room, and the next round makes more.
    if (reserved.spans.empty()) staging().wait_for_pinning();
  }
  return UVM_OK;
}

// Host memory for a copy's stored bytes, as kept: pinned staging, or a mapping of its own (a disk
// copy's on the way to its file, `*on_the_way`).
uvm_status place_copy(const Call& call, cudaStream_t stream, CodedCopy* copy, std::shared_ptr<char>* on_the_way) {
  if (copy->kept == Kept::pinned) return reserve_pinned(call, stream, copy);
  std::shared_ptr<char> mapping;
  if (uvm_status s = map_pageable(call, round_up(copy->stored, kDiskAlign), &mapping)) return s;
  copy->parts = {HostPart{mapping.get(), copy->stored}};
  (copy->kept == Kept::pageable ? copy->leases.emplace_back() : *on_the_way) = mapping;
  return UVM_OK;
}

// Writes a disk copy's coded bytes, complete in `on_the_way`, to a new file of its own (written
// whole: O_DIRECT takes aligned lengths from aligned memory, as a mapping is).
uvm_status write_to_file(const Call& call, CodedCopy* copy, const std::shared_ptr<char>& on_the_way) {
  const size_t mapped = round_up(copy->stored, kDiskAlign);
  copy->parts.clear();
  if (uvm_status s = BackupFile::create(call, mapped, &copy->file)) return s;
  if (uvm_status s = write_file(call, *copy->file, copy->file->fd(), on_the_way.get(), mapped, 0)) return s;
  return copy->file->seal(call);
}

}  // namespace

uvm_status code_out(const Call& call, int device, cudaStream_t stream, const std::vector<HintRange>& pieces, Kept kept,
                    CodecScratch& scratch, std::vector<StagedPiece>* out, std::vector<EventRef>* copied) {
  // Out of date once these bytes are copied again; dropped first, a staging block whose leases are
  // all gone rewinds, and the new copies take its bytes instead of more.
  for (const HintRange& piece : pieces) unstage_copies(piece.begin, piece.end);
  copied->assign(pieces.size(), nullptr);
  // The coder's kernels read and write 16 bytes at a time from a copy's start, and a piece can start
  // at any byte (what is left of an allocation after bytes offloaded before): its first bytes up to
  // a 16-byte boundary are a copy of their own, under a chunk, so kept raw and copied by the copy
  // engine. A misaligned kernel access would lose the context, and every byte on the device with it.
  std::vector<CodedCopy> copies;
  std::vector<size_t> piece_of;  // of each copy
  for (size_t i = 0; i < pieces.size(); ++i) {
    const uintptr_t aligned = std::min(round_up(pieces[i].begin, kCoderAlignment), pieces[i].end);
    for (const Span raw : {Span{pieces[i].begin, aligned}, Span{aligned, pieces[i].end}}) {
      if (raw.size() == 0) continue;
      copies.emplace_back();
      copies.back().raw = raw;
      copies.back().kept = kept;
      copies.back().flags.resize(codec::chunks_in(raw.size()));
      piece_of.push_back(i);
    }
  }
  // Every copy's flags stay on the device where the choosing left them, one copy's after the
  // other's, for its coding to read: room for all, made once. The choosing has a stream of its own,
  // which starts after the caller's work on `stream`.
  std::vector<size_t> flags_at;
  size_t all_chunks = 0;
  for (const CodedCopy& copy : copies) {
    flags_at.push_back(all_chunks);
    all_chunks += copy.flags.size();
  }
  if (all_chunks > 0) {
    if (uvm_status s = scratch.prepare(call, device, 0, stream)) return s;
    if (uvm_status s = scratch.prepare_choosing(call, device, all_chunks, true)) return s;
    EventRef reached;
    if (uvm_status s = record_event(call, stream, &reached)) return s;
    if (cudaError_t e = cudaStreamWaitEvent(scratch.chooser(), reached->handle, 0)) {
      return fail_cuda(call, e, "cudaStreamWaitEvent(choosing after the caller's work)");
    }
  }
  // Once copies are issued, a failure waits for them before their host memory can go back.
  const auto give_up = [&](uvm_status status) {
    for (cudaStream_t own : {scratch.copies(), scratch.chooser()}) {
      if (own != nullptr) clear_cuda_error(cudaStreamSynchronize(own));
    }
    clear_cuda_error(cudaStreamSynchronize(stream));
    return status;
  };
  // Each copy's flags (and so the room it takes) are chosen, on the choosing's stream, after the
  // copy before it is issued: the copies out begin after one copy's choosing, not after all of them
  // (docs/measurements.md, "Compressed backups: where the pause's time goes"). Its flags reach the
  // host through mapped memory, not behind the copies out queued on the copy engine, so the host
  // issues every copy long before the first ends. A disk copy is waited for, to be written to its
  // file, so the host holds one disk copy's bytes at most.
  const auto choose = [&](size_t i) {
    CodedCopy& copy = copies[i];
    const ChooseJob job{reinterpret_cast<const void*>(copy.raw.begin), copy.raw.size(), copy.flags.data()};
    if (uvm_status s = choose_chunk_flags(call, device, scratch, {job}, scratch.chooser(), flags_at[i])) return s;
    copy.stored = codec::compressed_bytes(copy.flags.data(), copy.raw.size());
    return UVM_OK;
  };
  if (!copies.empty()) {
    if (uvm_status s = choose(0)) return s;
  }
  for (size_t i = 0; i < copies.size(); ++i) {
    CodedCopy& copy = copies[i];
    std::shared_ptr<char> on_the_way;
    if (uvm_status s = place_copy(call, stream, &copy, &on_the_way)) return give_up(s);
    const std::vector<EncodeJob> job = {EncodeJob{reinterpret_cast<const void*>(copy.raw.begin), copy.raw.size(),
                                                  copy.flags.data(), copy.parts, scratch.chosen() + flags_at[i]}};
    if (kept == Kept::disk) {
      if (uvm_status s = encode_to_host(call, device, scratch, job, stream)) return give_up(s);
      if (uvm_status s = write_to_file(call, &copy, on_the_way)) return give_up(s);
    } else {
      std::vector<EventRef> end;
      if (uvm_status s = encode_to_host(call, device, scratch, job, stream, &end)) return give_up(s);
      (*copied)[piece_of[i]] = end.front();  // a piece's copies end in order: its last one's
    }
    if (i + 1 < copies.size()) {
      if (uvm_status s = choose(i + 1)) return give_up(s);
    }
  }
  // `stream` goes on once every copy is out (they end in order on the scratch's stream).
  for (auto end = copied->rbegin(); end != copied->rend(); ++end) {
    if (!*end) continue;
    if (cudaError_t e = cudaStreamWaitEvent(stream, (*end)->handle, 0)) {
      return give_up(fail_cuda(call, e, "cudaStreamWaitEvent(the coded bytes' copies to the host)"));
    }
    break;
  }
  for (CodedCopy& copy : copies) {
    StagedPiece piece;
    piece.span = copy.raw;
    piece.kept = kept;
    piece.coded = std::make_shared<const CodedCopy>(std::move(copy));
    out->push_back(std::move(piece));
  }
  return UVM_OK;
}

uvm_status code_in(const Call& call, int device, cudaStream_t stream, const std::vector<StagedPiece>& pieces,
                   const std::vector<bool>& managed, const std::function<uvm_status(size_t piece)>& make_ready) {
  // Managed pieces are populated on the device first and prefetched again after their decode.
  const auto prefetch_managed = [&](const char* why) {
    for (size_t i = 0; i < pieces.size(); ++i) {
      if (!managed[i]) continue;
      void* ptr = reinterpret_cast<void*>(pieces[i].span.begin);
      if (cudaError_t e = prefetch_to(ptr, pieces[i].span.size(), device, stream)) {
        return fail_cuda(call, e, "cudaMemPrefetchAsync(%p, %zu bytes) %s", ptr, pieces[i].span.size(), why);
      }
    }
    return UVM_OK;
  };
  if (uvm_status s = prefetch_managed("populating before the decode")) return s;
  StreamPhase decoding(Phase::code, stream, 0, pieces.empty() ? 0 : pieces.front().span.begin);
  CodecScratch scratch;
  std::vector<DecodeJob> jobs;
  std::vector<size_t> piece_of_job;  // of `jobs`
  const auto job_of = [](const StagedPiece& piece, HostParts parts) {
    const CodedCopy& copy = *piece.coded;
    return DecodeJob{std::move(parts), copy.flags.data(), copy.raw.size(), piece.span.begin - copy.raw.begin,
                     piece.span.end - copy.raw.begin, reinterpret_cast<void*>(piece.span.begin)};
  };
  for (size_t i = 0; i < pieces.size(); ++i) {
    const StagedPiece& piece = pieces[i];
    const CodedCopy& copy = *piece.coded;
    if (copy.kept != Kept::disk) {
      jobs.push_back(job_of(piece, copy.parts));  // decoded together below
      piece_of_job.push_back(i);
      continue;
    }
    // A disk copy is read whole into pageable memory and decoded before the next is read.
    std::shared_ptr<char> read_back;
    const size_t mapped = round_up(copy.stored, kDiskAlign);
    if (uvm_status s = map_pageable(call, mapped, &read_back)) return s;
    int fd = -1;
    if (uvm_status s = copy.file->open_unchanged(call, &fd)) return s;
    const uvm_status read = read_file(call, *copy.file, fd, read_back.get(), mapped, 0);
    close(fd);
    if (read != UVM_OK) return read;
    if (uvm_status s = make_ready(i)) return s;
    if (uvm_status s = decode_from_host(call, device, scratch, {job_of(piece, {HostPart{read_back.get(), copy.stored}})},
                                        stream)) {
      return s;
    }
  }
  // Each piece's memory is made ready as its first write is issued: mapping the next allocations
  // overlaps the decoding of the ones before (docs/measurements.md, "Compressed backups: where the
  // pause's time goes").
  const auto ready = [&](size_t job) { return make_ready(piece_of_job[job]); };
  if (uvm_status s = decode_from_host(call, device, scratch, jobs, stream, ready)) return s;
  size_t raw = 0;
  for (const StagedPiece& piece : pieces) raw += piece.span.size();
  decoding.finish(raw);
  if (uvm_status s = prefetch_managed("undoing the discard after the decode")) return s;
  if (cudaError_t e = cudaStreamSynchronize(stream)) return fail_cuda(call, e, "cudaStreamSynchronize(after decoding)");
  return UVM_OK;
}

bool coder_usable(int device) {
  std::string why;
  if (coder_loads(device, &why)) return true;
  static auto* told = new std::set<int>();  // never destroyed: no code runs from static destructors
  say_once_per_device(told, device, "uvm: compressed backups are off on device " + std::to_string(device) + " (" +
                                        why + "); uvm_pause keeps plain copies there");
  return false;
}

bool coder_scratch_ready(const Call& call, int device, cudaStream_t stream, const std::vector<HintRange>& pieces,
                         CodecScratch& scratch) {
  size_t chunks = 0;  // at least code_out's: cutting a piece's unaligned head off never adds a chunk
  for (const HintRange& piece : pieces) chunks += codec::chunks_in(piece.end - piece.begin);
  if (chunks == 0) return true;  // tails alone: copies, no scratch
  uvm_status s = scratch.prepare(call, device, 0, stream);
  if (s == UVM_OK) s = scratch.prepare_choosing(call, device, chunks, true);
  if (s == UVM_OK) return true;
  static auto* told = new std::set<int>();  // never destroyed: no code runs from static destructors
  say_once_per_device(told, device, "uvm: a compressed pause on device " + std::to_string(device) +
                                        " keeps plain copies: no room for the coder's scratch (" + uvm_last_error() + ")");
  uvm_clear_last_error();
  return false;
}

}  // namespace uvm
