// The host copies of an allocation's bytes: offload/'s part of its registry record
// (alloc/registry.hpp's RoomPart). An offload stages copies (in pinned staging memory, pageable host
// memory or a file); a resume that retains them keeps them as what the bytes were at their last
// pause. They live as long as the bytes they copy: freeing the allocation, discarding the bytes or
// a runtime's new block over them drops them.
#pragma once

#include <cstddef>
#include <cstdint>
#include <map>
#include <memory>
#include <vector>

#include "../../alloc/registry.hpp"

namespace uvm {

class BackupFile;  // disk.hpp: a file of offloaded bytes, removed with its last piece
struct CodedCopy;  // coded.hpp: a compressed copy

// Where a staged copy lives: in uvm's pinned staging memory (kept across cycles), in pageable host
// memory mapped for it alone (given back once its last piece goes), or in a file on disk (removed
// then). Only pinned copies are reused by the staging store; the others are written and read
// through pinned bounce buffers (spill.hpp).
enum class Kept : uint8_t { pinned, pageable, disk };

// A staged copy of some of an allocation's bytes: `span`'s bytes are at `host` (pinned, pageable)
// or at `file_offset` in `file` (disk) once `written` has completed (null: complete). `lease`
// holds the host bytes (the staging store's lease, or the pageable mapping); when the last piece
// holding a lease or a file is dropped, its bytes go back. A compressed one has neither: `coded`
// holds its bytes, coded (coded.hpp), and `kept` says where they are.
struct StagedPiece {
  Span span;
  char* host = nullptr;
  std::shared_ptr<char> lease;
  EventRef written;
  Kept kept = Kept::pinned;
  std::shared_ptr<BackupFile> file;
  uint64_t file_offset = 0;
  std::shared_ptr<const CodedCopy> coded;
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

// One allocation's copies (Allocation::offload).
struct HostCopies final : RoomPart {
  PieceMap staged;  // disjoint, inside the record's `host` offsets
  // Copies kept after their bytes came back (uvm_resume with uvm_set_retain_backups(1)): what the
  // bytes were at their last pause, readable (uvm_get_staged_copy, host memory only) and, for
  // pinned ones and files, written again in place by the next offload that keeps those bytes the
  // same way. Never copied back. Disjoint; on the device (not inside `host`).
  PieceMap retained;

  bool keeps(uintptr_t begin, uintptr_t end) const override;
  std::unique_ptr<RoomPart> forget(uintptr_t begin, uintptr_t end) override;
};

// The copies of the allocation `record` describes (null: it has none).
const HostCopies* copies_in(const Allocation& record);

// Whether a copy of the allocation's bytes (staged or retained) is in pinned staging memory.
bool holds_pinned_copy(const Allocation& record);

// `pieces` (each inside one live allocation) now hold their bytes; a piece of bytes already staged
// replaces it, and a retained copy of them goes (written in place, or out of date). Pieces of an
// allocation freed meanwhile are dropped.
void stage_copies(std::vector<StagedPiece> pieces);

// The staged copies overlapping [begin, end), clipped to it, by address.
std::vector<StagedPiece> staged_copies(uintptr_t begin, uintptr_t end);

// The retained copies overlapping [begin, end), clipped to it, by address.
std::vector<StagedPiece> retained_copies(uintptr_t begin, uintptr_t end);

// Drops the staged copies of [begin, end) (in any allocation), and the retained ones; what lies
// outside stays. Returns the staged bytes dropped. With `retain`, the staged copies (pinned,
// pageable, disk) become the retained copies of their bytes instead of going.
// `dropped_pinned` (if given): whether a copy in pinned staging memory went.
size_t unstage_copies(uintptr_t begin, uintptr_t end, bool retain = false, bool* dropped_pinned = nullptr);

// The retained copies of [begin, end) become its staged copies again (uvm_drop_clean_ranges: the
// device bytes go, the host copy still holds them). Returns the bytes restaged.
size_t restage_copies(uintptr_t begin, uintptr_t end);

// Every byte of every allocation staged in `kept` memory.
size_t staged_copy_bytes(Kept kept = Kept::pinned);

// The selected allocations' staged bytes in each kind of memory (uvm_get_kept_copies).
uvm_kept_copies kept_copies_of(const Selection& selection);

// The raw and stored bytes of the selected allocations' compressed copies, each counted once
// however many pieces hold it (uvm_get_compressed_copies).
void compressed_copies_of(const Selection& selection, size_t* raw, size_t* stored);

}  // namespace uvm
