// Releasable device memory: allocations made with CUDA virtual memory management (a reserved
// address range with physical memory mapped into it), so that an offload can hand the physical
// memory back to the driver — cudaMemGetInfo shows it free at once, and the next allocation need
// not wait for the driver to reclaim managed pages — and an onload can map new physical memory at
// the same virtual addresses.
//
// Managed pages that were moved off come back to the driver only when an allocation needs them,
// slowly and invisibly to cudaMemGetInfo; memory released this way is free at once
// (docs/performance.md, "The driver behaviour behind the design").
#pragma once

#include <cstddef>
#include <cstdint>

#include "errors.hpp"

namespace uvm {

// The physical side of one releasable allocation, kept in its record (registry.hpp). Changed only
// under the moves lock (moves.hpp), which every caller of the functions below holds, or by the
// thread that owns the allocation alone (allocating or freeing it).
struct Mapping {
  size_t reserved = 0;                // bytes of address space, and of physical memory while mapped
  unsigned long long handle = 0;      // CUmemGenericAllocationHandle of the physical memory
  bool mapped = false;
  int device = -1;                    // where the physical memory is made
  // Whether another process may map `handle` (a POSIX file descriptor): memory made for an
  // allocation that asked (`shared`), where the device can export. Memory made otherwise is not, so
  // that NCCL, which maps a peer's buffers wherever their memory lets it (user-buffer and graph
  // registration), keeps no mapping of memory a pause gives back: it copies through its own
  // buffers, as with torch_memory_saver's memory.
  bool exportable = false;
  // The allocation asked for exportable memory (uvm_set_thread_exportable, or an export refused
  // since): every map makes it so. Memory is never swapped for exportable memory under work other
  // threads may launch: that lost the GPU context (bench/probes/export_swap_race.py).
  bool shared = false;
};

// Reserves round_up(size, granularity) bytes of address space, creates physical memory on
// `device` and maps it read-write for that device; with `shared`, exportable memory at this map
// and every later one (Mapping::shared). The caller has made `device`'s context current.
uvm_status vmm_allocate(const Call& call, size_t size, int device, bool shared, void** out, Mapping* mapping);

// Unmaps the physical memory mapped at `base` (a no-op if it is not mapped) and gives it back to
// the driver, or keeps it as spare memory where the device's spare limit has room. The caller has
// made sure no work touching it is still running.
uvm_status vmm_unmap(const Call& call, uintptr_t base, Mapping* mapping);

// Maps physical memory (contents undefined) on `device` at `base` (a no-op if mapped): spare memory
// of the same size where there is some, else new; a device out of memory first gives its spare
// memory back and asks again.
uvm_status vmm_map(const Call& call, uintptr_t base, int device, Mapping* mapping);

// Releases everything of the allocation at `base`: physical memory and address range.
uvm_status vmm_free(const Call& call, uintptr_t base, Mapping* mapping);

// Sharing with other processes (share/export.hpp). vmm_export: a new POSIX file descriptor for the
// mapped physical memory of the allocation at `base`, for the caller to pass on and close; fails
// with UVM_ERROR_UNSUPPORTED where the device's memory is not exportable. vmm_import: maps the
// physical memory behind `fd` (`size` bytes, made by another process) at a new address, read-write
// for `device`; vmm_close_import undoes it. Nothing is left behind on failure.
uvm_status vmm_export(const Call& call, uintptr_t base, const Mapping& mapping, int* fd);
uvm_status vmm_import(const Call& call, int fd, size_t size, int device, uintptr_t* base, unsigned long long* handle);
uvm_status vmm_close_import(const Call& call, uintptr_t base, size_t size, unsigned long long handle);

// Spare memory (uvm_set_spare_limit): physical memory an unmap kept for the next map of the same
// size on the same device. Giving physical memory back to the driver (cuMemRelease) while a copy
// into other memory runs slows that copy by 11 % (bench/probes/map_probe.cu); streaming unmaps one layer
// and maps the next every step, so it keeps the memory instead. Lowering the limit gives back what
// is above it, oldest first.
uvm_status vmm_set_spare_limit(const Call& call, int device, size_t bytes);
size_t vmm_spare_limit(int device);
size_t vmm_spare_bytes(int device);  // kept now

// Makes the smallest physical allocation on `device` and gives it back at once: the polls that
// settle the driver after a wake (settle.hpp). False if the driver refused either; never throws.
bool vmm_touch_driver(int device) noexcept;

}  // namespace uvm
