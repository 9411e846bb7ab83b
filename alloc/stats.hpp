// Per-device accounting: live and peak bytes, counters, and the bytes uvm moved. The limit check
// lives here too so that "check and reserve" is one step under one lock.
#pragma once

#include <cstddef>
#include <cstdint>

#include "uvm.h"

namespace uvm {

// Reserves `size` bytes on `device` unless live + reserved + size would pass `limit`. A reservation
// is either committed (the allocation succeeded) or cancelled; neither is visible in the stats
// until committed, so a failed allocation leaves them unchanged.
bool try_reserve(int device, size_t size, size_t limit, size_t* live_and_reserved);
void cancel_reservation(int device, size_t size);
void commit_reservation(int device, size_t size);

void record_free(int device, size_t size, size_t host_bytes);
void count_move(int device, size_t bytes, bool to_host, long long host_delta, uint64_t calls);
void record_discard(int device, size_t bytes, long long host_delta);
void record_prefetch_calls(int device, uint64_t calls);
// Host-resident bytes changed without a move: a block handed out or taken back (blocks.cpp).
void record_host_change(int device, long long host_delta);

uvm_stats snapshot(int device);
void reset_peak(int device);

}  // namespace uvm
