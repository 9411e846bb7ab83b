// The registry: one record per live uvm allocation, holding everything uvm knows about it — its
// size, device, tag and backing, the slab it came from, the physical memory of a releasable one,
// where uvm last moved each of its bytes, the staged host copies of those bytes, and the event its
// last move ends with. Freeing an allocation erases its record, and with it all of that: a host
// copy or an ordering event never outlives the memory it describes.
#pragma once

#include <cstddef>
#include <cstdint>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <vector>

#include "events.hpp"
#include "span_set.hpp"
#include "tags.hpp"
#include "uvm.h"
#include "vmm.hpp"

namespace uvm {

// managed: cudaMallocManaged (uvm_malloc). releasable: device memory mapped through CUDA virtual
// memory management (uvm_malloc_releasable), whose physical memory uvm returns to the driver once
// all of its bytes are off the device (alloc/vmm.hpp).
enum class Backing : uint8_t { managed, releasable };

// to_host: migrated to the CPU. staged: copied to pinned staging and discarded on the device
// (host-resident, like to_host). discarded: no copy kept. to_device: back where it was allocated.
enum class Move { to_device, to_host, staged, discarded };

class BackupFile;  // offload/disk.hpp: a file of offloaded bytes, removed with its last piece

// Where a staged copy lives: in uvm's pinned staging memory (kept across cycles), in pageable host
// memory mapped for it alone (given back once its last piece goes), or in a file on disk (removed
// then). Only pinned copies are reused by the staging store; the others are written and read
// through pinned bounce buffers (offload/spill.hpp).
enum class Kept : uint8_t { pinned, pageable, disk };

// A staged copy of some of an allocation's bytes: `span`'s bytes are at `host` (pinned, pageable)
// or at `file_offset` in `file` (disk) once `written` has completed (null: complete). `lease`
// holds the host bytes (the staging store's lease, or the pageable mapping); when the last piece
// holding a lease or a file is dropped, its bytes go back.
struct StagedPiece {
  Span span;
  char* host = nullptr;
  std::shared_ptr<char> lease;
  EventRef written;
  Kept kept = Kept::pinned;
  std::shared_ptr<BackupFile> file;
  uint64_t file_offset = 0;
  // The bytes [from, to) of this piece (inside its span), kept in the same place.
  StagedPiece part(uintptr_t from, uintptr_t to) const {
    StagedPiece piece = *this;
    piece.span = Span{from, to};
    if (host != nullptr) piece.host = host + (from - span.begin);
    piece.file_offset = file_offset + (from - span.begin);
    return piece;
  }
};

// Copies of an allocation's bytes, by address.
using PieceMap = std::map<uintptr_t, StagedPiece>;

// Everything uvm knows about one live allocation.
struct Allocation {
  size_t size = 0;
  int device = 0;
  TagId tag = kUntagged;
  uvm_backup backup = UVM_BACKUP_NONE;  // what uvm_pause keeps of it
  bool paused = false;                  // by uvm_pause, until uvm_resume
  Backing backing = Backing::managed;
  uintptr_t slab = 0;       // the slab holding it (alloc/slabs.hpp), 0 if it is a driver allocation of its own
  Mapping mapping;          // releasable only: its physical memory; released while not mapped
  SpanSet host;             // offsets whose last move by uvm was to the host (staged ones included)
  SpanSet discarded;        // offsets discarded with no copy kept
  // Managed offsets discarded on the device that no prefetch to the device has followed since: the
  // driver still counts them as discarded once written again (measured for copies into them,
  // bench/transfer_probe.cu hazard), and a prefetch to the CPU would drop what was written.
  SpanSet marked;
  // Made after uvm_report_blocks: a runtime that cuts it into blocks reports every one of them.
  bool reported_runtime = false;
  // Offsets a runtime handed out as blocks (uvm_block_allocated) and has not taken back, once it
  // reported any of a reported_runtime allocation: the rest is free space, which an offload drops
  // instead of copying.
  bool blocks_reported = false;
  SpanSet blocks;
  PieceMap staged;          // disjoint, inside `host`
  // Copies kept after their bytes came back (uvm_resume with uvm_set_retain_backups(1)): what the
  // bytes were at their last pause, readable (uvm_get_staged_copy, host memory only) and, for
  // pinned ones and files, written again in place by the next offload that keeps those bytes the
  // same way. Never copied back. By address; disjoint; on the device (not inside `host`).
  PieceMap retained;
  EventRef last_move;       // where its last move ends on the GPU (null: nothing pending)
  bool released() const { return backing == Backing::releasable && !mapping.mapped; }
  // Whether a staged or retained copy of its bytes is in pinned staging memory.
  bool holds_pinned_copy() const {
    for (const PieceMap* pieces : {&staged, &retained}) {
      for (const auto& [begin, piece] : *pieces) {
        if (piece.kept == Kept::pinned) return true;
      }
    }
    return false;
  }
};

// What a caller outside the registry needs of an allocation: a copy of its identity.
struct AllocationView {
  uintptr_t base = 0;
  size_t size = 0;
  int device = 0;
  Backing backing = Backing::managed;
  uintptr_t slab = 0;
  uvm_backup backup = UVM_BACKUP_NONE;
  bool paused = false;
  // The driver allocation holding it: where one prefetch or copy may reach.
  uintptr_t memory() const { return slab != 0 ? slab : base; }
};

// The allocations a C call selects: those of `device` (UVM_ANY_DEVICE: all) with one of `tags`
// (any_tag: any). Tags never set are left out of `tags`, since nothing carries them: with none left,
// nothing is selected.
struct Selection {
  int device = UVM_ANY_DEVICE;
  bool any_tag = true;
  std::vector<TagId> tags;
  // Narrower, for uvm_pause and uvm_resume: only allocations with this backup, only those paused
  // (or not).
  std::optional<uvm_backup> backup;
  std::optional<bool> paused;
};

// Reads a C call's (device, tag) arguments, as uvm.h's "Registry queries" define them: the device
// is checked unless it is UVM_ANY_DEVICE; tag NULL means any tag, "" untagged.
uvm_status select_arguments(const Call& call, int device, const char* tag, Selection* out);

// The same with a list of tags (the selection moves): `count` of them at `tags`, "" for untagged;
// none (tags NULL, count 0) means any tag.
uvm_status select_arguments(const Call& call, int device, const char* const* tags, size_t count, Selection* out);

// A block a runtime hands out or takes back (blocks.cpp), as the registry records it.
enum class BlockChange : uint8_t { none, allocated, freed };

// What uvm keeps about the bytes of a block a runtime hands out or takes back (blocks.cpp).
struct BlockState {
  AllocationView allocation;  // the allocation holding the block
  bool staged = false;        // some of its bytes have a staged copy
  bool retained = false;      // some of its bytes have a retained copy (Allocation::retained)
  bool moved = false;         // some of its bytes are off the device (to the host, staged or discarded)
  bool released = false;      // the allocation's physical memory is given back
  EventRef last_move;         // the allocation's last move (null: nothing pending)
};

class Registry {
 public:
  // Allocations: inserted by uvm_malloc, erased by uvm_free (the record is handed back, so that
  // its memory can be freed with what it says; its staged pieces go back to staging with it).
  void insert(uintptr_t base, Allocation allocation);
  std::optional<Allocation> erase(uintptr_t base);
  // The allocation holding byte `ptr`, if any.
  bool find(const void* ptr, AllocationView* found) const;
  // The selected allocations, by address.
  std::vector<AllocationView> select(const Selection& selection) const;
  // The devices holding selected allocations, in order.
  std::vector<int> devices_of(const Selection& selection) const;

  // Where bytes are. Records that [begin, end) of the allocation at `base` moved (nothing if it
  // was freed meanwhile); returns the signed change in its host-resident bytes. Staged copies are
  // not touched: unstage() drops them.
  long long record_placement(uintptr_t base, uintptr_t begin, uintptr_t end, Move move);
  // True if uvm moved every byte of the allocation at `base` off its device (offloaded, staged or
  // discarded): its device copy holds nothing anyone asked to keep.
  bool all_off_device(uintptr_t base) const;
  // Discard marks (Allocation::marked): set by a discard, read before a prefetch to the CPU, and
  // cleared by the prefetch to the device that follows a write.
  void mark_discarded(uintptr_t base, uintptr_t begin, uintptr_t end);
  std::vector<Span> marked(uintptr_t base, uintptr_t begin, uintptr_t end) const;
  void unmark(uintptr_t base, uintptr_t begin, uintptr_t end);

  // Staged copies. `pieces` (each inside one live allocation) now hold their bytes; a piece of
  // bytes already staged replaces it. Pieces of an allocation freed meanwhile are dropped.
  void stage(std::vector<StagedPiece> pieces);
  // The staged pieces overlapping [begin, end), clipped to it, by address.
  std::vector<StagedPiece> staged(uintptr_t begin, uintptr_t end) const;
  // Drops the staged copies of [begin, end) (in any allocation), and the retained ones; what lies
  // outside stays. Returns the staged bytes dropped. With `retain`, the staged copies (pinned,
  // pageable, disk) become the retained copies of their bytes instead of going.
  // `dropped_pinned` (if given): whether a copy in pinned staging memory went.
  size_t unstage(uintptr_t begin, uintptr_t end, bool retain = false, bool* dropped_pinned = nullptr);
  // The retained copies overlapping [begin, end), clipped to it, by address.
  std::vector<StagedPiece> retained(uintptr_t begin, uintptr_t end) const;
  // The retained copies of [begin, end) become its staged copies again (uvm_drop_clean_ranges: the
  // device bytes go, the host copy still holds them). Returns the bytes restaged.
  size_t restage(uintptr_t begin, uintptr_t end);
  // Every byte of every allocation staged in `kept` memory.
  size_t staged_bytes(Kept kept = Kept::pinned) const;
  // The selected allocations' staged bytes in each kind of memory (uvm_get_kept_copies).
  uvm_kept_copies kept_copies(const Selection& selection) const;

  // The last move of each allocation: the distinct events the allocations at `bases` wait for,
  // and the event that now ends the last move of each (null: nothing to wait for).
  std::vector<EventRef> last_move_events(const std::vector<uintptr_t>& bases) const;
  void set_last_move(const std::vector<uintptr_t>& bases, const EventRef& done);

  // The state of [begin, end) in the allocation holding `begin` (false if none holds it), after
  // recording `change` to its blocks.
  bool block_state(uintptr_t begin, uintptr_t end, BlockState* out, BlockChange change = BlockChange::none);
  // The free space in [begin, end) of the allocation at `base`: bytes outside every block its
  // runtime handed out, once it reported blocks at all (none before: all of it may hold data).
  std::vector<Span> free_space(uintptr_t base, uintptr_t begin, uintptr_t end) const;

  // Marks the allocations at `bases` paused or not (those freed meanwhile are skipped).
  void set_paused(const std::vector<uintptr_t>& bases, bool paused);

  // Whether the allocation at `base` is releasable memory given back to the driver.
  bool released(uintptr_t base) const;
  // The physical memory of the releasable allocation at `base`, read and written under the moves
  // lock (alloc/vmm.hpp). false if no releasable allocation starts there.
  bool mapping(uintptr_t base, Mapping* out) const;
  void set_mapping(uintptr_t base, const Mapping& mapping);

  // Totals over the selected allocations.
  uvm_residency residency(const Selection& selection) const;
  // Bytes of managed allocations on `device` that uvm moved off it (to the host, staged or
  // discarded): the driver reclaims them when someone allocates.
  size_t reclaimable_managed_bytes(int device) const;

 private:
  static bool selected(const Allocation& allocation, const Selection& selection);
  static AllocationView view_of(uintptr_t base, const Allocation& allocation);
  // The record holding byte `address`, or null. Under mutex_.
  Allocation* holding(uintptr_t address);
  // Calls `visit` with each record that may hold bytes of [begin, end), by address. Under mutex_.
  template <class Visit>
  void each_overlapping(uintptr_t begin, uintptr_t end, Visit&& visit);
  // Moves the staged pieces of `allocation` inside [begin, end) into `dropped`, keeping what lies
  // outside; returns the bytes moved. Under mutex_; the caller lets the pieces go after unlocking
  // (the end of a lease takes the staging store's lock).
  static size_t unstage_locked(Allocation& allocation, uintptr_t begin, uintptr_t end,
                               std::vector<StagedPiece>* dropped);
  // The same for the pieces of one map (staged or retained).
  static size_t cut_out(PieceMap& pieces, uintptr_t begin, uintptr_t end, std::vector<StagedPiece>* dropped);
  // The pieces of map `which` (staged or retained) overlapping [begin, end), clipped to it.
  std::vector<StagedPiece> pieces_of(PieceMap Allocation::*which, uintptr_t begin, uintptr_t end) const;

  mutable std::mutex mutex_;
  std::map<uintptr_t, Allocation> allocations_;
};

// The process-wide registry (never destroyed: frees may arrive from static destructors at exit).
Registry& registry();

// True if CUDA reports `ptr` as managed memory (any allocator). Leaves no CUDA error pending.
bool cuda_reports_managed(const void* ptr);

}  // namespace uvm
