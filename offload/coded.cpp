#include "coded.hpp"

#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <mutex>
#include <set>
#include <string>

#include "../alloc/cuda_compat.hpp"
#include "disk.hpp"
#include "pinned.hpp"
#include "spill.hpp"
#include "staging.hpp"

namespace uvm {
namespace {

size_t round_up(size_t n, size_t to) { return (n + to - 1) / to * to; }

// Pinned staging for each copy's stored bytes, in order: its parts and leases. A block pinned in
// steps may hold a copy in parts, and the room may come in rounds as its steps are pinned; where no
// block has room, one is pinned at once (ensure_capacity, holding only the caller's moves lock).
// `stream` waits for the copies that may still read the bytes reserved.
uvm_status reserve_pinned(const Call& call, cudaStream_t stream, std::vector<CodedCopy>* copies) {
  std::vector<Span> wanted;  // each copy's bytes, one after the other
  uintptr_t offset = 0;
  for (const CodedCopy& copy : *copies) {
    wanted.push_back(Span{offset, offset + copy.stored});
    offset += copy.stored;
  }
  const Staging::RoomClaim claim(staging());  // made room stays until it is reserved
  size_t next = 0;        // the first copy not wholly placed
  uintptr_t placed = 0;   // the bytes placed so far
  while (next < wanted.size()) {
    std::vector<Span> rest(wanted.begin() + static_cast<std::ptrdiff_t>(next), wanted.end());
    rest.front().begin = placed;
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
    size_t owner = next;
    for (size_t i = 0; i < reserved.spans.size(); ++i) {
      while (wanted[owner].end <= reserved.spans[i].begin) ++owner;
      CodedCopy& copy = (*copies)[owner];
      copy.parts.push_back(HostPart{reserved.leases[i].get(), reserved.spans[i].size()});
      copy.leases.push_back(reserved.leases[i]);
      placed = reserved.spans[i].end;
    }
    while (next < wanted.size() && wanted[next].end <= placed) ++next;
    // Nothing fits yet: wait for the pinning in progress; if there is none, another move took the
    // room, and the next round makes more.
    if (reserved.spans.empty()) staging().wait_for_pinning();
  }
  return UVM_OK;
}

}  // namespace

uvm_status code_out(const Call& call, int device, cudaStream_t stream, const std::vector<HintRange>& pieces, Kept kept,
                    std::vector<StagedPiece>* out) {
  // Out of date once these bytes are copied again; dropped first, a staging block whose leases are
  // all gone rewinds, and the new copies take its bytes instead of more.
  for (const HintRange& piece : pieces) unstage_copies(piece.begin, piece.end);
  CodecScratch scratch;
  std::vector<CodedCopy> copies(pieces.size());
  std::vector<ChooseJob> choices;
  for (size_t i = 0; i < pieces.size(); ++i) {
    CodedCopy& copy = copies[i];
    copy.raw = Span{pieces[i].begin, pieces[i].end};
    copy.kept = kept;
    copy.flags.resize(codec::chunks_in(copy.raw.size()));
    choices.push_back(ChooseJob{reinterpret_cast<const void*>(copy.raw.begin), copy.raw.size(), copy.flags.data()});
  }
  if (uvm_status s = choose_chunk_flags(call, device, scratch, choices, stream)) return s;
  for (CodedCopy& copy : copies) copy.stored = codec::compressed_bytes(copy.flags.data(), copy.raw.size());
  if (kept == Kept::pinned) {
    if (uvm_status s = reserve_pinned(call, stream, &copies)) return s;
  }
  // Pinned and pageable copies are coded in one pipeline; a disk copy goes through pageable memory
  // to its file one at a time (written whole: O_DIRECT takes aligned lengths from aligned memory,
  // as a mapping is), so the host holds one copy's bytes at most.
  const size_t together = kept == Kept::disk ? 1 : copies.size();
  for (size_t first = 0; first < copies.size(); first += together) {
    const size_t end = std::min(first + together, copies.size());
    std::vector<EncodeJob> jobs;
    std::shared_ptr<char> on_the_way;  // a disk copy's bytes before its file
    for (size_t i = first; i < end; ++i) {
      CodedCopy& copy = copies[i];
      if (kept != Kept::pinned) {
        std::shared_ptr<char> mapping;
        if (uvm_status s = map_pageable(call, round_up(copy.stored, kDiskAlign), &mapping)) return s;
        copy.parts = {HostPart{mapping.get(), copy.stored}};
        (kept == Kept::pageable ? copy.leases.emplace_back() : on_the_way) = mapping;
      }
      jobs.push_back(EncodeJob{reinterpret_cast<const void*>(copy.raw.begin), copy.raw.size(), copy.flags.data(), copy.parts});
    }
    if (uvm_status s = encode_to_host(call, device, scratch, jobs, stream)) return s;
    if (kept == Kept::disk) {
      CodedCopy& copy = copies[first];
      const size_t mapped = round_up(copy.stored, kDiskAlign);
      copy.parts.clear();
      if (uvm_status s = BackupFile::create(call, mapped, &copy.file)) return s;
      if (uvm_status s = write_file(call, *copy.file, copy.file->fd(), on_the_way.get(), mapped, 0)) return s;
      if (uvm_status s = copy.file->seal(call)) return s;
    }
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
                   const std::vector<bool>& managed) {
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
  CodecScratch scratch;
  std::vector<DecodeJob> jobs;
  const auto job_of = [](const StagedPiece& piece, HostParts parts) {
    const CodedCopy& copy = *piece.coded;
    return DecodeJob{std::move(parts), copy.flags.data(), copy.raw.size(), piece.span.begin - copy.raw.begin,
                     piece.span.end - copy.raw.begin, reinterpret_cast<void*>(piece.span.begin)};
  };
  for (const StagedPiece& piece : pieces) {
    const CodedCopy& copy = *piece.coded;
    if (copy.kept != Kept::disk) {
      jobs.push_back(job_of(piece, copy.parts));  // decoded together below
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
    if (uvm_status s = decode_from_host(call, device, scratch, {job_of(piece, {HostPart{read_back.get(), copy.stored}})},
                                        stream)) {
      return s;
    }
  }
  if (uvm_status s = decode_from_host(call, device, scratch, jobs, stream)) return s;
  if (uvm_status s = prefetch_managed("undoing the discard after the decode")) return s;
  if (cudaError_t e = cudaStreamSynchronize(stream)) return fail_cuda(call, e, "cudaStreamSynchronize(after decoding)");
  return UVM_OK;
}

bool coder_usable(int device) {
  std::string why;
  if (coder_loads(device, &why)) return true;
  static auto* mutex = new std::mutex();  // never destroyed: no code runs from static destructors
  static auto* told = new std::set<int>();
  std::lock_guard<std::mutex> lock(*mutex);
  if (told->insert(device).second) {
    std::fprintf(stderr, "uvm: compressed backups are off on device %d (%s); uvm_pause keeps plain copies there\n",
                 device, why.c_str());
  }
  return false;
}

}  // namespace uvm
