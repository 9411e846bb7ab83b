// uvm_offload_ranges: moving memory off a GPU, by migration (prefetch to the CPU) or by staging
// (copy out to pinned memory, then discard on the device).
#include <algorithm>
#include <memory>
#include <vector>

#include "../../alloc/registry.hpp"
#include "../../hints/discard_batch.hpp"
#include "../../hints/moves/accounting.hpp"
#include "../../hints/moves/begin.hpp"
#include "../../hints/moves/order.hpp"
#include "../../hints/moves/release.hpp"
#include "../../hints/moves/trace.hpp"
#include "../../hints/prefetch.hpp"
#include "../media/coded.hpp"
#include "../media/copies.hpp"
#include "../media/plan.hpp"
#include "../media/spill.hpp"
#include "../media/staging.hpp"
#include "group.hpp"
#include "offload.hpp"

namespace uvm {
namespace {

// What an offload still has to move (bytes already staged are off the device), split by how, and
// the free space it drops instead (bytes outside every block the allocation's runtime handed out).
struct OffloadPieces {
  std::vector<HintRange> staged;
  std::vector<HintRange> migrated;
  std::vector<HintRange> free;
};

// Only uvm's own allocations are staged, since a host copy must die with its memory and uvm cannot
// see a cudaFree of memory it did not allocate. Releasable memory is not managed, so it is always
// staged. Free space holds nothing to keep: it is discarded where the device can (releasable memory
// needs no driver call), so that a pool's offload copies its tensors only and leaves no pinned copy
// of free blocks behind.
OffloadPieces pieces_to_move(const std::vector<HintRange>& merged, bool staging_wanted, bool discard_supported) {
  OffloadPieces pieces;
  for (const HintRange& range : merged) {
    // A released allocation's bytes are all staged or discarded already, none mapped to copy from.
    if (range.releasable && registry().released(range.allocation)) continue;
    const bool stage = range.releasable || (staging_wanted && range.allocation != 0);
    std::vector<Span> staged, free;
    for (const StagedPiece& piece : staged_copies(range.begin, range.end)) staged.push_back(piece.span);
    if (range.allocation != 0 && (range.releasable || discard_supported)) {
      free = registry().free_space(range.allocation, range.begin, range.end);
    }
    const RangeSplit split = split_range(Span{range.begin, range.end}, std::move(staged), std::move(free));
    for (const Span& span : split.free) pieces.free.push_back(clipped(range, span));
    for (const Span& span : split.rest) (stage ? pieces.staged : pieces.migrated).push_back(clipped(range, span));
  }
  return pieces;
}

// Drops the free space of an offload: discarded on the device (managed memory), no copy kept.
uvm_status drop_free_space(const Call& call, const std::vector<HintRange>& free, cudaStream_t stream) {
  if (free.empty()) return UVM_OK;
  if (uvm_status s = discard_batch(call, free, stream)) return s;
  for (const HintRange& piece : free) account_discard(piece);
  return set_last_moves(call, free, stream);
}

size_t placed_bytes(const std::vector<Span>& spans) {
  size_t total = 0;
  for (const Span& span : spans) total += span.size();
  return total;
}

// The staged pieces cut as staging placed them (`placed`, in order, each inside one piece).
std::vector<HintRange> pieces_placed(const std::vector<HintRange>& pieces, const std::vector<Span>& placed) {
  std::vector<HintRange> cut;
  size_t p = 0;
  for (const Span& span : placed) {
    while (pieces[p].end <= span.begin) ++p;
    cut.push_back(clipped(pieces[p], span));
  }
  return cut;
}

// What a copying strategy's copy is called in messages; null for one that keeps no copy (MIGRATE).
const char* copy_name(int strategy) {
  switch (strategy) {
    case UVM_STRATEGY_STAGED: return "staged";
    case UVM_STRATEGY_MMAP: return "mmap";
    case UVM_STRATEGY_DISK: return "disk";
    default: return nullptr;
  }
}

// Whether the strategy the caller asked for (`requested`; `strategy` is what it resolves to) can
// move these ranges, before anything is reserved or issued. A strategy that keeps a copy does so
// for uvm's own allocations only (the copy must die with its memory), and discards managed pages
// after copying, which needs discard support.
uvm_status check_strategy_fits(const Call& call, int requested, uvm_strategy strategy, const MoveScope& move) {
  for (const HintRange& range : move.ranges) {
    if (requested == UVM_STRATEGY_MIGRATE && range.releasable) {
      // MIGRATE moves managed pages; releasable memory is device memory, which only staging moves.
      return fail(call, UVM_ERROR_INVALID_ARGUMENT,
                  "the range at %p is in a releasable allocation (device memory, not managed), which "
                  "cannot migrate; offload it with UVM_STRATEGY_AUTO or UVM_STRATEGY_STAGED",
                  reinterpret_cast<void*>(range.begin));
    }
    if (copy_name(strategy) != nullptr && !move.caps.discard_supported && !range.releasable) {
      return fail(call, UVM_ERROR_UNSUPPORTED,
                  "a %s offload discards the device pages, which needs a CUDA 13 runtime and driver; "
                  "use UVM_STRATEGY_AUTO or UVM_STRATEGY_MIGRATE",
                  copy_name(strategy));
    }
    if (copy_name(requested) != nullptr && range.allocation == 0) {
      return fail(call, UVM_ERROR_INVALID_ARGUMENT,
                  "the range at %p (%zu bytes) is managed memory not allocated by uvm: a %s copy must die with its "
                  "memory, and uvm cannot see such memory freed; offload it with UVM_STRATEGY_AUTO or "
                  "UVM_STRATEGY_MIGRATE",
                  reinterpret_cast<void*>(range.begin), static_cast<size_t>(range.end - range.begin),
                  copy_name(requested));
    }
  }
  return UVM_OK;
}

// Copies every piece into its reserved staging bytes, then discards it on the device, all in
// `stream` order: several times faster than a prefetch to the CPU (docs/performance.md). Marks in
// `done` where each releasable allocation's copies end, so that its memory can go back before the
// later copies finish.
uvm_status offload_staged(const Call& call, const std::vector<HintRange>& pieces, const Reservation& reserved,
                          cudaStream_t stream, CopiesDone* done) {
  const std::vector<Span>& spans = reserved.spans;
  // On a failure, copies already issued may still be writing into the reserved host bytes: wait for
  // them before the bytes can go back (with the reservation, once the caller drops it). The data
  // stays where it was, on the device.
  auto give_up = [&](uvm_status status) {
    clear_cuda_error(cudaStreamSynchronize(stream));
    return status;
  };
  for (const EventRef& read : reserved.reused) {
    if (cudaError_t e = cudaStreamWaitEvent(stream, read->handle, 0)) {
      return give_up(fail_cuda(call, e, "cudaStreamWaitEvent (staging memory still being read)"));
    }
  }
  StreamPhase copies(Phase::copy, stream, 0, spans.empty() ? 0 : spans.front().begin);
  size_t copied_bytes = 0;
  std::vector<CopyPiece> placed;  // each piece where it lies in staging
  for (size_t i = 0; i < pieces.size(); ++i) {
    placed.push_back(CopyPiece{spans[i], pieces[i].allocation, reserved.leases[i].get(), pieces[i].memory});
  }
  const auto one_registration = [](const char* host, size_t bytes) { return staging().one_registration(host, bytes); };
  std::vector<uintptr_t> ended;  // the releasable allocations whose copies this call ends
  for (const CopyRun& run : copy_runs(placed, one_registration)) {
    const void* ptr = reinterpret_cast<const void*>(spans[run.first].begin);
    if (cudaError_t e = cudaMemcpyAsync(reserved.leases[run.first].get(), ptr, run.bytes, cudaMemcpyDefault, stream)) {
      return give_up(fail_cuda(call, e, "cudaMemcpyAsync(%p → pinned staging, %zu bytes)", ptr, run.bytes));
    }
    copied_bytes += run.bytes;
    // A releasable allocation never shares a driver allocation, so its last piece ends a copy.
    const size_t last = run.end - 1;
    const bool last_of_allocation = run.end == pieces.size() || pieces[run.end].allocation != pieces[last].allocation;
    if (pieces[last].releasable && last_of_allocation) {
      if (EventRef copied = try_record(stream)) {
        (*done)[pieces[last].allocation] = CopiesEnd{copied, nullptr};
        ended.push_back(pieces[last].allocation);
      }
    }
  }
  copies.finish(copied_bytes);
  if (uvm_status s = discard_batch(call, pieces, stream)) return give_up(s);
  // Issued in stream order, the copies come before the discard: from here on the host copy is all
  // there is of these bytes, so it is kept even if waiting for it fails.
  EventRef written;
  const uvm_status marked = mark_or_wait(call, stream, &written);
  for (uintptr_t base : ended) (*done)[base].moved = written;  // set_last_moves below leaves it there
  for (const StepsTaken& taken : reserved.steps_taken) note_copies_issued(*taken.pinning, taken.through);
  std::vector<StagedPiece> staged;
  std::vector<const char*> hosts;
  for (size_t i = 0; i < spans.size(); ++i) {
    StagedPiece piece;
    piece.span = spans[i];
    piece.host = reserved.leases[i].get();
    piece.lease = reserved.leases[i];
    piece.written = written;
    staged.push_back(std::move(piece));
    hosts.push_back(reserved.leases[i].get());
  }
  staging().note_use(hosts, written);  // dropped before its copy ends, a piece's bytes still wait for it
  // Counted on the host first: the books never show more bytes staged than on the host.
  for (const HintRange& piece : pieces) account_move(piece, Move::staged, 0);
  stage_copies(std::move(staged));
  set_last_moves(pieces, written);
  return marked;
}

// When an offload's round gives back the physical memory of the releasable allocations it emptied.
// A round that copies into the steps pinned so far while the rest is still being registered does
// not: the driver held each cuMemUnmap and cuMemRelease behind the registrations, up to a step's
// registration each, and the call waited there instead of copying the steps pinned meanwhile
// (docs/measurements.md, "A pause without retained memory: the wall"). Such a round gives back,
// before its copies, what earlier rounds emptied (offload_in_rounds).
enum class Release { now, after_pinning };

// Issues the moves under the moves lock, staging reserved: stages, migrates, then gives back the
// physical memory of releasable allocations left empty (`release`). `done` carries, from round to
// round, where each releasable allocation's copies end.
uvm_status issue_offload(const Call& call, const MoveScope& move, const OffloadPieces& pieces,
                         const Reservation& reserved, Release release, CopiesDone* done) {
  const cudaStream_t stream = move.stream;
  for (const auto* part : {&pieces.staged, &pieces.migrated, &pieces.free}) {
    for (const HintRange& piece : *part) trace_move_bytes(piece.end - piece.begin);
  }
  if (!pieces.staged.empty()) {
    if (uvm_status s = offload_staged(call, pieces.staged, reserved, stream, done)) return s;
  }
  if (!pieces.migrated.empty()) {
    if (uvm_status s = prefetch_each(call, pieces.migrated, UVM_LOCATION_CPU, stream)) return s;
    if (uvm_status s = set_last_moves(call, pieces.migrated, stream)) return s;
  }
  if (uvm_status s = drop_free_space(call, pieces.free, stream)) return s;
  if (release == Release::after_pinning) return UVM_OK;
  return release_emptied(call, move.ranges, stream, *done);
}

// The offload that keeps plain copies in `kept` memory.
uvm_strategy strategy_keeping(Kept kept) {
  switch (kept) {
    case Kept::pageable: return UVM_STRATEGY_MMAP;
    case Kept::disk: return UVM_STRATEGY_DISK;
    default: return UVM_STRATEGY_STAGED;
  }
}

// Where each releasable allocation's copies end: the event of its last piece's copy (`copied[i]`,
// piece i's; null where the copy was waited for already).
CopiesDone copies_done(const std::vector<HintRange>& pieces, const std::vector<EventRef>& copied) {
  CopiesDone done;
  for (size_t i = 0; i < pieces.size(); ++i) {
    if (pieces[i].releasable && copied[i]) done[pieces[i].allocation] = CopiesEnd{copied[i], nullptr};
  }
  return done;
}

// UVM_STRATEGY_MMAP and UVM_STRATEGY_DISK, and compressed copies (`coded`, in any memory): once
// `stream` has reached the call, the bytes are copied out — through bounce buffers (spill.hpp), or
// coded on the GPU (coded.hpp) — and only then, on `stream`, discarded; the call waits for the
// copies. A releasable allocation's compressed copy is waited for by its own event before its
// memory goes back (as offload_staged's is), not by the stream, else once all are. A copy
// that fails leaves the device as it was. A compressed offload that cannot run here (the coder does
// not load, or managed pages cannot be discarded) does nothing but set `*plain`: the caller
// offloads with plain copies instead.
uvm_status offload_kept(const Call& call, const MoveArgs& args, Kept kept, cudaStream_t stream, bool coded = false,
                        bool* plain = nullptr) {
  const uvm_strategy strategy = strategy_keeping(kept);
  MoveScope move;
  if (uvm_status s = begin_move(call, MoveKind::offload, args, stream, &move)) return s;
  if (move.ranges.empty()) return UVM_OK;
  if (coded && (!move.caps.discard_supported || !coder_usable(move.device))) {
    *plain = true;
    return UVM_OK;
  }
  if (uvm_status s = check_strategy_fits(call, strategy, strategy, move)) return s;
  const OffloadPieces pieces = pieces_to_move(move.ranges, true, move.caps.discard_supported);
  CodecScratch scratch;  // the coder's, until its copies end (its end waits for them)
  if (coded && !coder_scratch_ready(call, move.device, move.stream, pieces.staged, scratch)) {
    *plain = true;  // nothing moved yet
    return UVM_OK;
  }
  for (const auto* part : {&pieces.staged, &pieces.free}) {
    for (const HintRange& piece : *part) trace_move_bytes(piece.end - piece.begin);
  }
  const auto copy_out_and_release = [&]() -> uvm_status {
    CopiesDone done;
    if (!pieces.staged.empty()) {
      std::vector<StagedPiece> copies;
      std::vector<EventRef> copied;
      const uvm_status issued = coded ? code_out(call, move.device, move.stream, pieces.staged, kept, scratch, &copies, &copied)
                                      : spill_out(call, move.device, move.stream, pieces.staged, kept, &copies);
      if (issued != UVM_OK) return issued;
      // From the discard on, the copy is all there is of these bytes: it is recorded first.
      for (const HintRange& piece : pieces.staged) account_move(piece, Move::staged, 0);  // as offload_staged
      stage_copies(std::move(copies));
      if (coded) done = copies_done(pieces.staged, copied);
      if (uvm_status s = discard_batch(call, pieces.staged, move.stream)) return s;
      if (uvm_status s = set_last_moves(call, pieces.staged, move.stream)) return s;
    }
    if (uvm_status s = drop_free_space(call, pieces.free, move.stream)) return s;
    return release_emptied(call, move.ranges, move.stream, done);
  };
  uvm_status status = copy_out_and_release();
  // Whatever happened, the copies end before the call returns: their host memory may go back after.
  if (const cudaError_t e = cudaStreamSynchronize(move.stream); e != cudaSuccess) {
    if (status != UVM_OK) clear_cuda_error(e);  // the first failure is the one to report
    else status = fail_cuda(call, e, "cudaStreamSynchronize (the %s copies out, device %d)",
                                  coded ? "compressed" : copy_name(strategy), move.device);
  }
  return finish_move(status, args, move);
}

// Host bytes for the pieces that retained pinned copies cover exactly (uvm_set_retain_backups):
// they are written again in place, at the addresses the copies had. A piece's copy may be in
// several parts (a first offload cuts a span where a step of its pinning ends): each part is a span
// of its own, so no copy crosses two registrations. Retained copies come from uvm_resume, which
// waits for its copies back to end, so nothing still reads them.
Reservation retained_room(const std::vector<HintRange>& pieces) {
  Reservation room;
  for (const HintRange& piece : pieces) {
    const std::vector<StagedPiece> kept = retained_copies(piece.begin, piece.end);
    uintptr_t covered = piece.begin;  // the parts, in address order, must tile the piece
    for (const StagedPiece& part : kept) {
      if (part.kept != Kept::pinned || part.coded || part.span.begin != covered) break;
      covered = part.span.end;
    }
    if (kept.empty() || covered != piece.end) continue;
    for (const StagedPiece& part : kept) {
      room.spans.push_back(part.span);
      room.leases.emplace_back(part.lease, part.host);  // the part's lease, at its bytes
    }
  }
  return room;
}

// The pinnings in steps an offload paces (StepPinning): the one it started, whose first pacer it
// is, and those it took steps of. When it returns, however it returns, it stops pacing them, so
// that no step waits for copies that will not come.
class PacedPinnings {
 public:
  PacedPinnings() = default;
  PacedPinnings(const PacedPinnings&) = delete;
  PacedPinnings& operator=(const PacedPinnings&) = delete;
  ~PacedPinnings() {
    for (const auto& pinning : pinnings_) end_pacing(*pinning);
  }
  // A pinning ensure_capacity started for this offload: paced by it already.
  void adopt(const std::shared_ptr<StepPinning>& pinning) {
    if (pinning) pinnings_.push_back(pinning);
  }
  // A pinning this offload reserved steps of.
  void take(const std::shared_ptr<StepPinning>& pinning) {
    if (std::find(pinnings_.begin(), pinnings_.end(), pinning) != pinnings_.end()) return;
    begin_pacing(*pinning);
    pinnings_.push_back(pinning);
  }

 private:
  std::vector<std::shared_ptr<StepPinning>> pinnings_;
};

uvm_status offload_in_rounds(const Call& call, const MoveArgs& args, int requested, cudaStream_t stream,
                             bool* staged) {
  if (requested == UVM_STRATEGY_MMAP) return offload_kept(call, args, Kept::pageable, stream);
  if (requested == UVM_STRATEGY_DISK) return offload_kept(call, args, Kept::disk, stream);
  if (!is_strategy(requested)) return fail(call, UVM_ERROR_INVALID_ARGUMENT, "strategy %d is not a uvm_strategy", requested);
  // The room made for this offload stays until it is reserved: a release_staging loop on another
  // thread would take it every time before the offload's next round.
  const Staging::RoomClaim claim(staging());
  PacedPinnings paced;
  int device = -1;
  // Where each releasable allocation's copies end, over the rounds. The memory a round leaves to
  // the last one stays held if a round after it fails (its bytes are on the host); the next offload
  // of those ranges, or their free, gives it back.
  CopiesDone done;
  for (;;) {
    MoveScope move;
    if (uvm_status s = begin_move(call, MoveKind::offload, args, stream, &move)) return s;
    if (move.ranges.empty()) return UVM_OK;
    if (device >= 0 && move.device != device) {  // a round after the first, the lock let go between
      return fail(call, UVM_ERROR_INVALID_ARGUMENT, "the ranges were freed and reallocated on device %d meanwhile",
                  move.device);
    }
    forget_moved_meanwhile(&done);
    device = move.device;
    const bool discard_supported = move.caps.discard_supported;
    const uvm_strategy strategy = choose_strategy(static_cast<uvm_strategy>(requested), discard_supported);
    if (uvm_status s = check_strategy_fits(call, requested, strategy, move)) return s;
    OffloadPieces pieces = pieces_to_move(move.ranges, strategy == UVM_STRATEGY_STAGED, discard_supported);
    const Reservation in_place = retained_room(pieces.staged);
    note_staging_reserved(placed_bytes(in_place.spans));  // staged, as if reserved: none to pin ahead
    if (!in_place.spans.empty()) {  // those first; the next round moves the rest
      OffloadPieces rewrite;
      rewrite.staged = pieces_placed(pieces.staged, in_place.spans);
      *staged = true;
      if (uvm_status s = issue_offload(call, move, rewrite, in_place, Release::now, &done)) return s;
      continue;
    }
    const std::vector<Span> wanted = spans_of(pieces.staged);
    if (!staging().has_room(wanted)) {
      // Pinned memory is allocated with no lock held, so that it holds up no uvm_free or move on
      // another thread; a first offload's block is pinned in steps on a thread of its own, and each
      // round copies into the steps done while the rest is pinned. Then the offload begins again:
      // an allocation may have been freed, or its bytes moved, meanwhile.
      move.unlock();
      const size_t ahead = staging_to_pin_ahead(placed_bytes(wanted));
      std::shared_ptr<StepPinning> pinning;
      const uvm_status grown = staging().ensure_capacity(call, wanted, true, ahead, &pinning);
      paced.adopt(pinning);
      if (grown != UVM_OK) return grown;
      continue;
    }
    Reservation reserved = staging().reserve_prefix(wanted);
    for (const StepsTaken& taken : reserved.steps_taken) paced.take(taken.pinning);
    note_staging_reserved(placed_bytes(reserved.spans));
    const bool all_placed = placed_bytes(reserved.spans) == placed_bytes(wanted);
    pieces.staged = pieces_placed(pieces.staged, reserved.spans);
    *staged = *staged || !pieces.staged.empty();
    if (all_placed) return finish_move(issue_offload(call, move, pieces, reserved, Release::now, &done), args, move);
    if (!reserved.spans.empty()) {
      // The steps pinned so far hold these: copy them now; the next round takes the rest. First,
      // what earlier rounds emptied goes back: the pinning thread waits for these copies before it
      // registers the next step, so no registration runs beside the releases, and they do not all
      // come in one burst at the end, right before the program's next allocation.
      if (uvm_status s = release_copied_already(call, move.ranges, done)) return s;
      pieces.migrated.clear();
      pieces.free.clear();
      if (uvm_status s = issue_offload(call, move, pieces, reserved, Release::after_pinning, &done)) return s;
      continue;
    }
    // Nothing fits yet: wait, with the lock let go, for the pinning in progress; if there is none,
    // another offload took the room: the next round grows again.
    move.unlock();
    staging().wait_for_pinning();
  }
}

}  // namespace

bool is_strategy(int strategy) {
  switch (strategy) {
    case UVM_STRATEGY_AUTO: case UVM_STRATEGY_MIGRATE: case UVM_STRATEGY_STAGED: case UVM_STRATEGY_MMAP:
    case UVM_STRATEGY_DISK:
      return true;
    default:
      return false;
  }
}

// Host memory stays near what is offloaded: once an offload has staged its pieces, staging blocks
// left with nothing in them are freed (in the background; at the end of a group of moves). An
// offload that staged nothing (a migration) leaves them for the next staged one.
uvm_status offload_moves(const Call& call, const MoveArgs& args, int strategy, cudaStream_t stream) {
  bool staged = false;
  const uvm_status status = offload_in_rounds(call, args, strategy, stream, &staged);
  if (status == UVM_OK && staged) free_unused_staging_after_offload();
  return status;
}

uvm_status offload_compressed(const Call& call, const MoveArgs& args, Kept kept, cudaStream_t stream) {
  bool plain = false;
  const uvm_status status = offload_kept(call, args, kept, stream, true, &plain);
  if (plain) return offload_moves(call, args, kept == Kept::pinned ? UVM_STRATEGY_AUTO : strategy_keeping(kept), stream);
  if (status == UVM_OK && kept == Kept::pinned) free_unused_staging_after_offload();
  return status;
}

}  // namespace uvm

extern "C" uvm_status uvm_offload_ranges(const uvm_range* ranges, size_t count, uvm_strategy strategy,
                                         cudaStream_t stream) {
  const uvm::Call call = uvm::Call::of("uvm_offload_ranges").with_count(count);
  uvm::MoveRecord record(call.name);
  return record.done(uvm::guarded(call, [&] {
    return uvm::offload_moves(call, uvm::MoveArgs::of(ranges, count), uvm::raw_enum(strategy), stream);
  }));
}
