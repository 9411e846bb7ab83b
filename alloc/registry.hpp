// The registry: one record per live uvm allocation, holding what uvm knows about it — its size,
// device, tag and backing, the slab it came from, the physical memory of a releasable one, where uvm
// last moved each of its bytes, and the event its last move ends with — and the part of it a room
// above alloc/ keeps there (offload/: the host copies of its bytes, offload/media/copies.hpp). Freeing an
// allocation erases its record, and with it all of that: a host copy or an ordering event never
// outlives the memory it describes.
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

// The part of an allocation's record that a room above alloc/ keeps there (offload/: the host
// copies of its bytes, offload/media/copies.hpp). The registry holds it under its lock and frees it with
// the record; of what it holds, the registry asks only what every such part answers.
struct RoomPart {
  virtual ~RoomPart() = default;
  // Whether it keeps something of the bytes [begin, end).
  virtual bool keeps(uintptr_t begin, uintptr_t end) const = 0;
  // The bytes [begin, end) were discarded: what it keeps of them goes. What it let go comes back
  // (null: nothing), to be destroyed once the registry's lock is released (the end of a staging
  // lease takes the staging store's lock).
  virtual std::unique_ptr<RoomPart> forget(uintptr_t begin, uintptr_t end) = 0;
};

// Everything uvm knows about one live allocation.
struct Allocation {
  size_t size = 0;
  int device = 0;
  // What a C call selects it by (Selection), so kept here rather than in a room's part: its tag
  // and backup kind, both the allocating thread's (tags.hpp), and whether uvm_pause paused it.
  TagId tag = kUntagged;
  uvm_backup backup = UVM_BACKUP_NONE;  // what uvm_pause keeps of it
  bool compressed = false;              // whether uvm_pause compresses what it keeps
  bool paused = false;                  // by uvm_pause, until uvm_resume
  Backing backing = Backing::managed;
  uintptr_t slab = 0;       // the slab holding it (alloc/slabs.hpp), 0 if it is a driver allocation of its own
  Mapping mapping;          // releasable only: its physical memory; released while not mapped
  SpanSet host;             // offsets whose last move by uvm was to the host (staged ones included)
  SpanSet discarded;        // offsets discarded with no copy kept
  // Managed offsets discarded on the device that no prefetch to the device has followed since: the
  // driver still counts them as discarded once written again (measured for copies into them,
  // bench/probes/transfer_probe.cu hazard), and a prefetch to the CPU would drop what was written.
  SpanSet marked;
  // Made after uvm_report_blocks: a runtime that cuts it into blocks reports every one of them.
  bool reported_runtime = false;
  // Offsets a runtime handed out as blocks (uvm_block_allocated) and has not taken back, once it
  // reported any of a reported_runtime allocation: the rest is free space, which an offload drops
  // instead of copying.
  bool blocks_reported = false;
  SpanSet blocks;
  EventRef last_move;       // where its last move ends on the GPU (null: nothing pending)
  // offload/'s part: the host copies of its bytes (offload/media/copies.hpp), made by its first offload.
  std::unique_ptr<RoomPart> offload;
  bool released() const { return backing == Backing::releasable && !mapping.mapped; }
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
  bool compressed = false;
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
  // Narrower, for uvm_pause and uvm_resume: only allocations with this backup, compressed (or
  // not), only those paused (or not).
  std::optional<uvm_backup> backup;
  std::optional<bool> compressed;
  std::optional<bool> paused;
  // Whether it selects `allocation`.
  bool includes(const Allocation& allocation) const;
};

// Reads a C call's (device, tag) arguments, as uvm.h's "Registry queries" define them: the device
// is checked unless it is UVM_ANY_DEVICE; tag NULL means any tag, "" untagged.
uvm_status select_arguments(const Call& call, int device, const char* tag, Selection* out);

// The same with a list of tags (the selection moves): `count` of them at `tags`, "" for untagged;
// none (tags NULL, count 0) means any tag.
uvm_status select_arguments(const Call& call, int device, const char* const* tags, size_t count, Selection* out);

// A block a runtime hands out or takes back (offload/moves/free.cpp), as the registry records it.
enum class BlockChange : uint8_t { none, allocated, freed };

// What uvm keeps about the bytes of a block a runtime hands out or takes back (offload/moves/free.cpp).
struct BlockState {
  AllocationView allocation;  // the allocation holding the block
  bool copied = false;        // some of its bytes have a host copy (offload/media/copies.hpp: staged or retained)
  bool moved = false;         // some of its bytes are off the device (to the host, staged or discarded)
  bool on_host = false;       // some of its bytes are on the host (offloaded or staged): the device's are stale
  bool released = false;      // the allocation's physical memory is given back
  EventRef last_move;         // the allocation's last move (null: nothing pending)
};

class Registry {
 public:
  // Allocations: inserted by uvm_malloc, erased by uvm_free (the record is handed back, so that
  // its memory can be freed with what it says; its host copies go with it).
  void insert(uintptr_t base, Allocation allocation);
  std::optional<Allocation> erase(uintptr_t base);
  // The allocation holding byte `ptr`, if any.
  bool find(const void* ptr, AllocationView* found) const;
  // The selected allocations, by address.
  std::vector<AllocationView> select(const Selection& selection) const;
  // The devices holding selected allocations, in order.
  std::vector<int> devices_of(const Selection& selection) const;
  // For tests: whether no thread holds the registry's lock now (asked from a thread of its own,
  // which tries the lock without waiting: the answer takes no time and the caller may hold it).
  bool lock_is_free_for_test() const;

  // Where bytes are. Records that [begin, end) of the allocation at `base` moved (nothing if it
  // was freed meanwhile); returns the signed change in its host-resident bytes. Host copies are
  // not touched: forget() drops them.
  long long record_placement(uintptr_t base, uintptr_t begin, uintptr_t end, Move move);
  // True if uvm moved every byte of the allocation at `base` off its device (offloaded, staged or
  // discarded): its device copy holds nothing anyone asked to keep.
  bool all_off_device(uintptr_t base) const;
  // Discard marks (Allocation::marked): set by a discard, read before a prefetch to the CPU, and
  // cleared by the prefetch to the device that follows a write.
  void mark_discarded(uintptr_t base, uintptr_t begin, uintptr_t end);
  std::vector<Span> marked(uintptr_t base, uintptr_t begin, uintptr_t end) const;
  void unmark(uintptr_t base, uintptr_t begin, uintptr_t end);

  // The bytes [begin, end) (in any allocation) were discarded: what the rooms keep of them goes
  // (RoomPart::forget).
  void forget(uintptr_t begin, uintptr_t end);

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
  // Gives the allocation at `base` the tag `tag` (uvm_set_allocation_tag).
  void set_tag(uintptr_t base, TagId tag);
  // Sets the backup and compression of the selected allocations (uvm_set_backup); how many it set.
  size_t set_backup(const Selection& selection, uvm_backup backup, bool compressed);

  // Whether the allocation at `base` is releasable memory given back to the driver.
  bool released(uintptr_t base) const;
  // The physical memory of the releasable allocation at `base`, read and written under the moves
  // lock (alloc/vmm.hpp). false if no releasable allocation starts there.
  bool mapping(uintptr_t base, Mapping* out) const;
  void set_mapping(uintptr_t base, const Mapping& mapping);

  // Bytes of managed allocations on `device` that uvm moved off it (to the host, staged or
  // discarded): the driver reclaims them when someone allocates.
  size_t reclaimable_managed_bytes(int device) const;

  // The records themselves, for a room that keeps its part in them or totals what it keeps
  // (offload/media/copies.cpp, offload/moves/residency.cpp): with_records(use) calls use(Records&) under the
  // registry's lock. What `use` takes out of a record must be destroyed after it returns (see
  // RoomPart::forget), so it goes into something declared before the call.
  class Records {
   public:
    // The record holding byte `address`, or null.
    Allocation* holding(uintptr_t address);
    // Calls visit(record) for each record that may hold bytes of [begin, end), by address.
    template <class Visit>
    void each_overlapping(uintptr_t begin, uintptr_t end, Visit&& visit) {
      auto record = all_.upper_bound(begin);
      if (record != all_.begin()) --record;
      for (; record != all_.end() && record->first < end; ++record) visit(record->second);
    }
    // Calls visit(record) for each record `selection` includes, by address.
    template <class Visit>
    void each_selected(const Selection& selection, Visit&& visit) {
      for (auto& [base, allocation] : all_) {
        if (selection.includes(allocation)) visit(allocation);
      }
    }

   private:
    friend class Registry;
    explicit Records(std::map<uintptr_t, Allocation>& all) : all_(all) {}
    std::map<uintptr_t, Allocation>& all_;
  };
  template <class Use>
  decltype(auto) with_records(Use&& use) {
    std::lock_guard<std::mutex> lock(mutex_);
    Records records(allocations_);
    return use(records);
  }

 private:
  static AllocationView view_of(uintptr_t base, const Allocation& allocation);

  mutable std::mutex mutex_;
  std::map<uintptr_t, Allocation> allocations_;
};

// The process-wide registry (never destroyed: frees may arrive from static destructors at exit).
Registry& registry();

// Whether CUDA reports `ptr` as managed memory (any allocator), in `managed`; the query's error, if
// it failed (then `managed` is false). Leaves no CUDA error pending.
cudaError_t cuda_reports_managed(const void* ptr, bool* managed);

}  // namespace uvm
