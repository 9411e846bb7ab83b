#include "copies.hpp"

#include <algorithm>
#include <set>

#include "coded.hpp"

namespace uvm {
namespace {

// The record's copies, made the first time anything is staged for it. Only this file makes an
// allocation's offload part, so the part is always HostCopies.
HostCopies& copies_of(Allocation& record) {
  if (!record.offload) record.offload = std::make_unique<HostCopies>();
  return static_cast<HostCopies&>(*record.offload);
}

// The first piece of `pieces` (a PieceMap, const or not) that may hold bytes from `begin` on.
template <class Pieces>
auto first_reaching(Pieces& pieces, uintptr_t begin) {
  auto it = pieces.upper_bound(begin);
  if (it != pieces.begin() && std::prev(it)->second.span.end > begin) --it;
  return it;
}

// Moves the pieces of `pieces` inside [begin, end) into `dropped`, keeping what lies outside;
// returns the bytes moved. Under the registry's lock: the caller lets the pieces go after it
// (the end of a lease takes the staging store's lock).
size_t cut_out(PieceMap& pieces, uintptr_t begin, uintptr_t end, std::vector<StagedPiece>* dropped) {
  auto it = first_reaching(pieces, begin);
  size_t bytes = 0;
  while (it != pieces.end() && it->first < end) {
    StagedPiece piece = std::move(it->second);
    it = pieces.erase(it);
    const uintptr_t from = std::max(begin, piece.span.begin), to = std::min(end, piece.span.end);
    bytes += to - from;
    // Whatever lies outside [begin, end) stays, holding the same lease.
    if (piece.span.begin < from) {
      pieces.emplace(piece.span.begin, piece.part(piece.span.begin, from));
    }
    if (to < piece.span.end) {
      it = pieces.emplace(to, piece.part(to, piece.span.end)).first;
      ++it;
    }
    dropped->push_back(piece.part(from, to));
  }
  return bytes;
}

// Moves every copy of [begin, end) that `copies` holds, retained and staged, into `dropped` (as
// cut_out: under the registry's lock, let go after it).
void cut_out_copies(HostCopies& copies, uintptr_t begin, uintptr_t end, std::vector<StagedPiece>* dropped) {
  cut_out(copies.retained, begin, end, dropped);
  cut_out(copies.staged, begin, end, dropped);
}

// The record's copies if it has any (null: none), to change them.
HostCopies* existing_copies(Allocation& record) { return static_cast<HostCopies*>(record.offload.get()); }

// The pieces of map `which` (staged or retained) overlapping [begin, end), clipped to it.
std::vector<StagedPiece> pieces_of(PieceMap HostCopies::*which, uintptr_t begin, uintptr_t end) {
  std::vector<StagedPiece> pieces;
  registry().with_records([&](Registry::Records& records) {
    records.each_overlapping(begin, end, [&](const Allocation& record) {
      const HostCopies* copies = copies_in(record);
      if (copies == nullptr) return;
      const PieceMap& map = copies->*which;
      for (auto it = first_reaching(map, begin); it != map.end() && it->first < end; ++it) {
        const StagedPiece& piece = it->second;
        const uintptr_t from = std::max(begin, piece.span.begin), to = std::min(end, piece.span.end);
        if (from < to) pieces.push_back(piece.part(from, to));
      }
    });
  });
  return pieces;
}

// What HostCopies::forget took out, let go when the registry destroys it (after its lock).
struct ForgottenCopies final : RoomPart {
  std::vector<StagedPiece> pieces;
  bool keeps(uintptr_t, uintptr_t) const override { return false; }
  std::unique_ptr<RoomPart> forget(uintptr_t, uintptr_t) override { return nullptr; }
};

}  // namespace

bool HostCopies::keeps(uintptr_t begin, uintptr_t end) const {
  for (const PieceMap* pieces : {&staged, &retained}) {
    auto it = first_reaching(*pieces, begin);
    if (it != pieces->end() && it->first < end) return true;
  }
  return false;
}

std::unique_ptr<RoomPart> HostCopies::forget(uintptr_t begin, uintptr_t end) {
  std::vector<StagedPiece> dropped;
  cut_out_copies(*this, begin, end, &dropped);
  if (dropped.empty()) return nullptr;  // nothing of those bytes: nothing to let go
  auto gone = std::make_unique<ForgottenCopies>();
  gone->pieces = std::move(dropped);
  return gone;
}

const HostCopies* copies_in(const Allocation& record) {
  return static_cast<const HostCopies*>(record.offload.get());
}

bool holds_pinned_copy(const Allocation& record) {
  const HostCopies* copies = copies_in(record);
  if (copies == nullptr) return false;
  for (const PieceMap* pieces : {&copies->staged, &copies->retained}) {
    for (const auto& [begin, piece] : *pieces) {
      if (piece.kept == Kept::pinned) return true;
    }
  }
  return false;
}

void stage_copies(std::vector<StagedPiece> pieces) {
  std::vector<StagedPiece> dropped;  // let go after the registry's lock (see cut_out)
  registry().with_records([&](Registry::Records& records) {
    for (StagedPiece& piece : pieces) {
      Allocation* record = records.holding(piece.span.begin);
      if (record == nullptr) {
        dropped.push_back(std::move(piece));  // freed meanwhile
        continue;
      }
      // A racing offload of the same bytes; a retained copy, now out of date (or written in place).
      HostCopies& copies = copies_of(*record);
      cut_out_copies(copies, piece.span.begin, piece.span.end, &dropped);
      const uintptr_t begin = piece.span.begin;
      copies.staged.emplace(begin, std::move(piece));
    }
  });
}

std::vector<StagedPiece> staged_copies(uintptr_t begin, uintptr_t end) {
  return pieces_of(&HostCopies::staged, begin, end);
}

std::vector<StagedPiece> retained_copies(uintptr_t begin, uintptr_t end) {
  return pieces_of(&HostCopies::retained, begin, end);
}

size_t unstage_copies(uintptr_t begin, uintptr_t end, bool retain, bool* dropped_pinned) {
  std::vector<StagedPiece> dropped;  // let go after the registry's lock (see cut_out)
  size_t bytes = 0;
  registry().with_records([&](Registry::Records& records) {
    records.each_overlapping(begin, end, [&](Allocation& record) {
      HostCopies* copies = existing_copies(record);
      if (copies == nullptr) return;
      cut_out(copies->retained, begin, end, &dropped);
      std::vector<StagedPiece> unstaged;
      bytes += cut_out(copies->staged, begin, end, &unstaged);
      for (StagedPiece& piece : unstaged) {
        if (retain) {
          const uintptr_t at = piece.span.begin;
          copies->retained.emplace(at, std::move(piece));
        } else {
          dropped.push_back(std::move(piece));
        }
      }
    });
  });
  if (dropped_pinned != nullptr) {
    *dropped_pinned = std::any_of(dropped.begin(), dropped.end(), [](const StagedPiece& p) { return p.kept == Kept::pinned; });
  }
  return bytes;
}

size_t restage_copies(uintptr_t begin, uintptr_t end) {
  std::vector<StagedPiece> dropped;  // staged copies of the same bytes, replaced (none expected)
  size_t bytes = 0;
  registry().with_records([&](Registry::Records& records) {
    records.each_overlapping(begin, end, [&](Allocation& record) {
      HostCopies* copies = existing_copies(record);
      if (copies == nullptr) return;
      std::vector<StagedPiece> restaged;
      bytes += cut_out(copies->retained, begin, end, &restaged);
      for (StagedPiece& piece : restaged) {
        cut_out(copies->staged, piece.span.begin, piece.span.end, &dropped);
        const uintptr_t at = piece.span.begin;
        copies->staged.emplace(at, std::move(piece));
      }
    });
  });
  return bytes;
}

size_t staged_copy_bytes(Kept kept) {
  size_t total = 0;
  registry().with_records([&](Registry::Records& records) {
    records.each_selected(Selection{}, [&](const Allocation& record) {  // every allocation
      const HostCopies* copies = copies_in(record);
      if (copies == nullptr) return;
      for (const auto& [begin, piece] : copies->staged) total += piece.kept == kept ? piece.span.size() : 0;
    });
  });
  return total;
}

uvm_kept_copies kept_copies_of(const Selection& selection) {
  uvm_kept_copies total{};
  std::set<const BackupFile*> files;
  registry().with_records([&](Registry::Records& records) {
    records.each_selected(selection, [&](const Allocation& record) {
      const HostCopies* copies = copies_in(record);
      if (copies == nullptr) return;
      for (const auto& [begin, piece] : copies->staged) {
        switch (piece.kept) {
          case Kept::pinned: total.pinned_bytes += piece.span.size(); break;
          case Kept::pageable: total.pageable_bytes += piece.span.size(); break;
          case Kept::disk:
            total.disk_bytes += piece.span.size();
            files.insert(piece.coded ? piece.coded->file.get() : piece.file.get());
            break;
        }
      }
      for (const auto& [begin, piece] : copies->retained) total.retained_bytes += piece.span.size();
    });
  });
  total.disk_files = files.size();
  return total;
}

void compressed_copies_of(const Selection& selection, size_t* raw, size_t* stored) {
  *raw = *stored = 0;
  std::set<const CodedCopy*> counted;
  registry().with_records([&](Registry::Records& records) {
    records.each_selected(selection, [&](const Allocation& record) {
      const HostCopies* copies = copies_in(record);
      if (copies == nullptr) return;
      for (const PieceMap* pieces : {&copies->staged, &copies->retained}) {
        for (const auto& [begin, piece] : *pieces) {
          if (!piece.coded || !counted.insert(piece.coded.get()).second) continue;
          *raw += piece.coded->raw.size();
          *stored += piece.coded->stored;
        }
      }
    });
  });
}

}  // namespace uvm
