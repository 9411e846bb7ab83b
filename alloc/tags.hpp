// Tags: short names stored with allocations ("weights", "kv_cache") so a caller can act on all of
// them at once. Names are interned into a fixed table for the life of the process, so an allocation
// keeps a small id and a name pointer handed out stays valid.
#pragma once

#include <cstddef>
#include <cstdint>

#include "errors.hpp"

namespace uvm {

using TagId = uint16_t;
constexpr TagId kUntagged = 0;

// The id of `name` ("" or NULL: kUntagged), interning it if new. Fails past UVM_MAX_TAGS or for a
// name longer than UVM_TAG_MAX_LENGTH.
uvm_status intern_tag(const Call& call, const char* name, TagId* id);

// The id of an existing tag, false if `name` was never interned (so nothing can carry it).
bool find_tag(const char* name, TagId* id);

// The tag uvm_malloc stores for allocations made on this thread.
TagId thread_tag();

// The backup uvm_malloc stores for allocations made on this thread (uvm_set_thread_backup).
uvm_backup thread_backup();

// Whether uvm_pause compresses the backups of allocations made on this thread (uvm_set_thread_compression).
bool thread_compression();

// Whether releasable allocations made on this thread get exportable memory at every map
// (uvm_set_thread_exportable).
bool thread_exportable();

}  // namespace uvm
