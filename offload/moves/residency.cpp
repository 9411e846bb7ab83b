// uvm_get_residency: where uvm last put the bytes of a set of allocations. uvm_mem_get_info: the
// driver's free memory and what uvm knows is reclaimable. uvm_get_staged_copy: the host copy of
// staged bytes.
#include <algorithm>

#include "../../alloc/registry.hpp"
#include "../../hints/moves/hint_range.hpp"
#include "../media/copies.hpp"

namespace uvm {
namespace {

// Totals over the selected allocations, read at one moment.
uvm_residency residency_of(const Selection& selection) {
  uvm_residency total{};
  registry().with_records([&](Registry::Records& records) {
    records.each_selected(selection, [&](const Allocation& record) {
      total.allocations += 1;
      total.live_bytes += record.size;
      total.host_bytes += record.host.total();
      total.discarded_bytes += record.discarded.total();
      if (const HostCopies* copies = copies_in(record)) {
        for (const auto& [begin, piece] : copies->staged) {
          total.staged_bytes += piece.kept == Kept::pinned ? piece.span.size() : 0;
        }
      }
      if (record.released()) total.released_bytes += record.size;
    });
  });
  total.device_bytes = total.live_bytes - total.host_bytes - total.discarded_bytes;
  return total;
}

uvm_status residency(const Call& call, int device, const char* tag, uvm_residency* out) {
  if (out == nullptr) return fail(call, UVM_ERROR_INVALID_ARGUMENT, "residency is NULL");
  Selection selection;
  if (uvm_status s = select_arguments(call, device, tag, &selection)) return s;
  *out = residency_of(selection);
  return UVM_OK;
}

uvm_status mem_get_info(const Call& call, int device, size_t* free_bytes, size_t* total_bytes, size_t* reclaimable) {
  if (uvm_status s = check_device(call, device, false)) return s;
  ContextScope scope;
  if (uvm_status s = scope.enter(call, device, ContextScope::When::always)) return s;
  size_t free_now = 0, total = 0;
  if (cudaError_t e = cudaMemGetInfo(&free_now, &total)) return fail_cuda(call, e, "cudaMemGetInfo");
  if (free_bytes) *free_bytes = free_now;
  if (total_bytes) *total_bytes = total;
  if (reclaimable) *reclaimable = registry().reclaimable_managed_bytes(device);
  return UVM_OK;
}

uvm_status staged_copy(const Call& call, const void* ptr, size_t size, const void** host) {
  if (host == nullptr) return fail(call, UVM_ERROR_INVALID_ARGUMENT, "host is NULL");
  *host = nullptr;
  if (size == 0) return fail(call, UVM_ERROR_INVALID_ARGUMENT, "size is 0");
  HintRange range;
  if (uvm_status s = resolve_range(call, ptr, size, &range)) return s;
  // One piece, or pieces that follow each other on the device and in host memory alike (a first
  // offload cuts a tensor where the steps of its pinning end).
  std::vector<StagedPiece> pieces = staged_copies(range.begin, range.end);
  if (pieces.empty()) pieces = retained_copies(range.begin, range.end);
  if (pieces.empty() || pieces.front().span.begin != range.begin || pieces.back().span.end != range.end) return UVM_OK;
  // A compressed copy is not the bytes themselves: there is nothing to read in place.
  if (std::any_of(pieces.begin(), pieces.end(), [](const StagedPiece& piece) { return piece.coded != nullptr; })) {
    return UVM_OK;
  }
  for (size_t i = 1; i < pieces.size(); ++i) {
    const bool follows = pieces[i].span.begin == pieces[i - 1].span.end &&
                         pieces[i].host == pieces[i - 1].host + pieces[i - 1].span.size();
    if (!follows) return UVM_OK;
  }
  for (const StagedPiece& piece : pieces) {
    if (!piece.written) continue;
    if (cudaError_t e = cudaEventSynchronize(piece.written->handle)) {
      return fail_cuda(call, e, "cudaEventSynchronize (the copy into staging memory)");
    }
  }
  *host = pieces.front().host;
  return UVM_OK;
}

}  // namespace
}  // namespace uvm

extern "C" uvm_status uvm_mem_get_info(int device, size_t* free_bytes, size_t* total_bytes, size_t* reclaimable_bytes) {
  const uvm::Call call = uvm::Call::of("uvm_mem_get_info").with_device(device);
  return uvm::guarded(call, [&] { return uvm::mem_get_info(call, device, free_bytes, total_bytes, reclaimable_bytes); });
}

extern "C" uvm_status uvm_get_staged_copy(const void* ptr, size_t size, const void** host) {
  const uvm::Call call = uvm::Call::of("uvm_get_staged_copy").with_ptr(ptr).with_size(size);
  return uvm::guarded(call, [&] { return uvm::staged_copy(call, ptr, size, host); });
}

extern "C" uvm_status uvm_get_kept_copies(int device, const char* tag, uvm_kept_copies* kept) {
  const uvm::Call call = uvm::Call::of("uvm_get_kept_copies").with_selection(device);
  return uvm::guarded(call, [&] {
    if (kept == nullptr) return uvm::fail(call, UVM_ERROR_INVALID_ARGUMENT, "kept is NULL");
    uvm::Selection selection;
    if (uvm_status s = uvm::select_arguments(call, device, tag, &selection)) return s;
    *kept = uvm::kept_copies_of(selection);
    return UVM_OK;
  });
}

extern "C" uvm_status uvm_get_compressed_copies(int device, const char* tag, size_t* raw_bytes, size_t* stored_bytes) {
  const uvm::Call call = uvm::Call::of("uvm_get_compressed_copies").with_selection(device);
  return uvm::guarded(call, [&] {
    uvm::Selection selection;
    if (uvm_status s = uvm::select_arguments(call, device, tag, &selection)) return s;
    size_t raw = 0, stored = 0;
    uvm::compressed_copies_of(selection, &raw, &stored);
    if (raw_bytes != nullptr) *raw_bytes = raw;
    if (stored_bytes != nullptr) *stored_bytes = stored;
    return UVM_OK;
  });
}

extern "C" uvm_status uvm_get_residency(int device, const char* tag, uvm_residency* residency) {
  const uvm::Call call = uvm::Call::of("uvm_get_residency").with_selection(device);
  return uvm::guarded(call, [&] { return uvm::residency(call, device, tag, residency); });
}
