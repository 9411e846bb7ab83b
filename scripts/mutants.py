"""Mutation check: each mutant below survived the suite once, or is a mistake its tests were written
to catch; the tests named with it must fail when it is applied. One at a time it changes the source,
rebuilds what the tests need in BUILD (default build), runs them, and puts the source back. A mutant
whose text no longer matches its source exactly once is STALE: the check fails, naming it, before
anything is mutated. A mutant whose pytest selection fails with no mutant applied is BROKEN (its kill
would mean nothing): its tests are run as the source is, once per selection, before it. Prints
KILLED, SURVIVED or BROKEN per mutant and the kill rate per room; exits 1 if any survived, is stale
or is broken.

    python3 scripts/mutants.py [--build DIR] [--shard K/N | --shard today/N] [--only I,J,...] [--list]
                               [--result FILE]

--shard K/N runs the mutants whose position is K modulo N; today/N picks K from the date (days since
1970 modulo N), so that N consecutive days run every mutant (scripts/test.sh runs today/4 in CI).
--result writes the outcome as one line of JSON for scripts/summarize_tests.py.

A mutant is (source, original text, mutated text, runner, selection); the texts may be tuples of
several places changed together. The runner is a Catch2 program of BUILD/tests (the selection is its
filter), "meson:NAME" (the meson test NAME, its environment included; the selection is unused), or
"pytest" (the selection is pytest node ids, run against python_shim/ with UVM_TEST_FROM_TREE=1).
"""
import argparse
import json
import os
import subprocess
import sys
import time

# (source, original text, mutated text, test program, Catch2 filter); the texts may be tuples
# of several places changed together
MUTANTS = [
 # Disk and mmap copies (issue 26): a read that ignores its alignment skew; a change while offloaded
 # not caught; the chunk's padding not widened for O_DIRECT; the copy kept after its bytes come back.
 ("offload/media/spill.cpp", "  return buffer + chunk.bounce + (chunk.offset - chunk.io_begin);", "  return buffer + chunk.bounce;",
  "offload_tests", "[spill]"),
 ("offload/media/disk.cpp", "  else if (change_ns(about) != changed_ns_) changed = \"was written or changed\";\n", "",
  "offload_tests", "[spill]"),
 ("offload/media/plan.cpp", "      chunk.io_begin = align_down(chunk.offset, align);", "      chunk.io_begin = chunk.offset;",
  "offload_tests", "[plan]"),
 ("offload/moves/onload.cpp", "    unstage_copies(w.piece.span.begin, w.piece.span.end, retain);\n", "",
  "offload_tests", "[spill]"),
 # Disk moves of more allocations than descriptors (every file open at once, writing or reading);
 # the closing thread's waiting descriptors left open in a fork's child.
 ("offload/media/spill.cpp", "  const size_t group = kept == Kept::disk ? files_at_once() : targets_count;",
  "  const size_t group = targets_count;", "offload_tests", "[spill]"),
 ("offload/media/spill.cpp", "  const size_t group = files_at_once();\n  for (size_t first = 0; status",
  "  const size_t group = files.size() + 1;\n  for (size_t first = 0; status", "offload_tests", "[spill]"),
 ("offload/media/closer.cpp", "                     for (size_t i = 0; i < child.count; ++i) close(child.waiting[i]);\n", "",
  "offload_tests", "[spill]"),
 # A group of files after the first leaves its first file unsealed (its onload then fails): only
 # moves of more files than a group reach it, which the model makes one file at a time.
 ("offload/media/spill.cpp", "    for (size_t target = first; target < end && kept == Kept::disk; ++target) {",
  "    for (size_t target = first ? first + 1 : 0; target < end && kept == Kept::disk; ++target) {",
  "offload_tests", "[model]~[threads]"),
 # Retained copies (retain_cpu_backup): one that outlives the block it was of; a resume that keeps
 # nothing; a pause that writes elsewhere than the retained copy; a free that leaves the pinned
 # staging its copies held.
 ("offload/media/copies.cpp", "      cut_out(copies->retained, begin, end, &dropped);\n", "", "offload_tests", "[model]"),
 ("offload/media/copies.cpp", "  cut_out(copies.retained, begin, end, dropped);\n", "", "offload_tests", "[retain]"),
 ("offload/moves/onload.cpp", "    unstage_copies(w.piece.span.begin, w.piece.span.end, retain);", "    unstage_copies(w.piece.span.begin, w.piece.span.end, false);",
  "offload_tests", "[retain]"),
 ("offload/moves/offload.cpp", "    if (!in_place.spans.empty()) {  // those first", "    if (false) {  // those first",
  "offload_tests", "[retain]"),
 ("offload/moves/free.cpp", "  return staging().free_unused(call);", "  return UVM_OK;", "offload_tests", "[retain]"),
 ("alloc/options.cpp", "if (value > (std::numeric_limits<size_t>::max() >> shift)) return false;", "", "alloc_tests", "[options]"),
 # Options: allocation does not check them (an explicit limit and advice set, as a test's fixture
 # has them, hide the refusal from every other reader).
 ("alloc/malloc.cpp", "  if (uvm_status s = check_options(call)) return s;\n", "", "alloc_tests", "[env_malformed]"),
 ("alloc/stats.cpp", "const size_t in_use = a.stats.live_bytes + a.reserved;", "const size_t in_use = a.stats.live_bytes;", "alloc_tests", "[limits]"),
 ("alloc/registry.cpp", "if (address - it->first >= it->second.size) return false;", "if (address - it->first > it->second.size) return false;", "alloc_tests", "[malloc]"),
 ("hints/moves/ranges.cpp", "same_allocation ? range.begin <= last.end :", "same_allocation ? range.begin <= last.end + 512 :", "hints_tests", "[ranges]"),
 # A failed offload keeps the staging it reserved (its leases): nothing is left pinned for nothing.
 ("offload/moves/offload.cpp", "    clear_cuda_error(cudaStreamSynchronize(stream));\n    return status;",
  "    clear_cuda_error(cudaStreamSynchronize(stream));\n    static auto* kept = new std::vector<std::shared_ptr<char>>();\n"
  "    kept->insert(kept->end(), reserved.leases.begin(), reserved.leases.end());\n    return status;", "offload_tests", "[rollback]"),
 ("alloc/tags.cpp", "if (count > UVM_MAX_TAGS) {", "if (count > UVM_MAX_TAGS + 1) {", "alloc_tests", "[tag_limit]"),
 ("alloc/tags.cpp", "if (count > UVM_MAX_TAGS) {", "if (count >= UVM_MAX_TAGS) {", "alloc_tests", "[tag_limit]"),
 # Releasable memory: released while a byte is still on the device; never released; not mapped
 # before its copies back; mapped all at once before them; released before its copies end.
 ("alloc/registry.cpp", "return allocation.host.total() + allocation.discarded.total() == allocation.size;",
  "return allocation.host.total() + allocation.discarded.total() > 0;", "hints_tests", "[release]"),
 ("offload/moves/offload.cpp", "  return release_emptied(call, move.ranges, stream, *done);", "  return UVM_OK;", "hints_tests", "[release]"),
 ("offload/moves/onload.cpp", "    if (!managed) {\n      if (uvm_status s = restore_one(call, allocation)) return s;\n    }\n", "", "hints_tests", "[release]"),
 ("offload/moves/onload.cpp", "  if (move.ranges.empty()) return UVM_OK;\n  std::vector<StagedWork> all_staged, staged, kept, coded;",
  "  if (move.ranges.empty()) return UVM_OK;\n  if (uvm_status s = restore_released(call, move.ranges)) return s;\n  std::vector<StagedWork> all_staged, staged, kept, coded;",
  "hints_tests", "[release]"),
 ("hints/moves/release.cpp", "    if (!own && !stream_done) {", "    if (false) {", "hints_tests", "[release]"),
 ("offload/media/staging.cpp", "  std::lock_guard<std::mutex> growing(growth_mutex_);\n", "", "offload_tests", "reservations at once*"),
 # An offload pins staging memory holding the moves lock (uvm_free on another thread waits seconds);
 # release_staging frees pinned memory under the moves lock, which uvm_free needs. (An offload that
 # found its room taken and gave up survived once begin_move checked and reserved the room under one
 # lock: no other offload can take it in between any more.)
 ("offload/moves/offload.cpp", "      move.unlock();\n      const size_t ahead", "      const size_t ahead",
  "offload_tests", "offloads that need room*"),
 ("offload/media/staging.cpp", ("#include \"../../alloc/registry.hpp\"\n", "    const uvm_status staging = uvm::staging().free_unused(call);"),
  ("#include \"../../alloc/moves.hpp\"\n#include \"../../alloc/registry.hpp\"\n",
   "    const auto moves = uvm::lock_moves();\n    const uvm_status staging = uvm::staging().free_unused(call);"),
  "offload_tests", "freeing pinned staging*"),
 # An offload lets release_staging take the room it made before it reserves it (a livelock on an H100).
 ("offload/moves/offload.cpp", "  const Staging::RoomClaim claim(staging());\n", "",
  "offload_tests", "release_staging does not take*"),
 # A move no longer waits for the last move of its allocation on another stream.
 ("hints/moves/order.cpp", "  for (const EventRef& move : registry().last_move_events(allocations_of(ranges))) {", "  for (const EventRef& move : std::vector<EventRef>{}) {",
  "hints_tests", "[order]"),
 # A first offload pins all its staging memory before copying (UVM_PINNED unset: the registered
 # way); or copies across the end of a step (two registrations: cudaErrorInvalidValue on an H100).
 ("offload/moves/offload.cpp", "staging().ensure_capacity(call, wanted, true, ahead, &pinning)", "staging().ensure_capacity(call, wanted, false, ahead, &pinning)",
  "offload_tests", "[steps]"),
 ("offload/media/staging.cpp", "std::min({static_cast<size_t>(span.end - at), to_step_end, room(b)})",
  "std::min(static_cast<size_t>(span.end - at), room(b))", "offload_tests", "[steps]"),
 # A round of an offload in steps stages a whole piece where staging placed only its first part.
 ("offload/moves/offload.cpp", "    cut.push_back(clipped(pieces[p], span));", "    cut.push_back(pieces[p]);", "offload_tests", "[steps]"),
 # Timing reads events in the global capture mode: a capture on another stream is invalidated.
 ("hints/moves/trace.cpp", "  const RelaxedCapture relaxed;\n  out->clear();", "  out->clear();", "hints_tests", "[trace_capture]"),
 ("hints/moves/trace.cpp", "  Epoch of(int device) {\n    const RelaxedCapture relaxed;", "  Epoch of(int device) {", "hints_tests", "[trace_capture]"),
 # A slot freed while staged is handed out again (a copy into its discarded pages could be lost later).
 ("alloc/slabs.cpp", "  if (!reusable) found.retired.set(index);\n", "", "offload_tests", "[slabs]"),
 # Onload populates slot by slot again: one prefetch range per segment of a slab.
 ("offload/media/plan.cpp", "before->memory == piece.memory && piece.memory != 0", "before->allocation == piece.allocation && piece.allocation != 0",
  "offload_tests", "[slabs]"),
 # Neighbouring pieces are copied as one even across two pinning steps (cudaErrorInvalidValue on an H100).
 ("offload/media/plan.cpp", "if (!follows || !one_registration(pieces[first].host, bytes + next.span.size())) break;",
  "if (!follows) break;", "offload_tests", "[steps]"),
 # Staging left empty by a smaller offload is kept for ever.
 ("offload/moves/offload.cpp", "if (status == UVM_OK && staged) free_unused_staging_after_offload();", "", "offload_tests",
  "when the set offloaded shrinks*"),
 # A block pinned in steps keeps its unused steps; cuts them where no step starts; or frees them
 # and later unregisters them again with the block.
 ("offload/media/staging.cpp", "  if (!memory.steps || block.live == 0) return 0;", "  return 0;", "offload_tests", "[steps]"),
 ("offload/media/staging.cpp", "  const size_t kept = (block.used + kPinStepBytes - 1) / kPinStepBytes * kPinStepBytes;",
  "  const size_t kept = block.used;", "offload_tests", "[steps]"),
 ("offload/media/staging.cpp", "        memory.steps->pinned = memory.bytes;\n", "", "offload_tests", "[steps]"),
 # The SM kernel copies into managed memory too (measured with engine copies only), or takes a copy
 # that does not start on a 16-byte boundary.
 ("offload/moves/onload.cpp", "if (!managed && how == OnloadCopy::sm && sm_copyable(", "if (how == OnloadCopy::sm && sm_copyable(",
  "offload_tests", "[sm_copy]"),
 ("offload/moves/sm_copy.cpp", "bytes % kWordBytes == 0 &&\n         aligned(dst) && aligned(host)", "bytes % kWordBytes == 0",
  "offload_tests", "[sm_copy]"),
 # With UVM_ONLOAD_COPY unset, a device too old for the kernel gets it anyway (the onload fails).
 ("offload/moves/sm_copy.cpp", "  if (staged_bytes == 0 || kernel_refusal(device) != nullptr) {", "  if (staged_bytes == 0) {",
  "offload_tests", "[sm_copy_default]"),
 # auto takes the kernel whatever the device has free (the kernel idles through the driver's stall
 # on a full GPU), or the engine whatever (half speed after a bulk free).
 ("offload/moves/sm_copy.cpp", "  return free_bytes / kAutoKernelFreeFactor > staged_bytes ? OnloadCopy::sm : OnloadCopy::engine;",
  "  return OnloadCopy::sm;", "offload_tests", "[sm_copy_auto]"),
 ("offload/moves/sm_copy.cpp", "  return free_bytes / kAutoKernelFreeFactor > staged_bytes ? OnloadCopy::sm : OnloadCopy::engine;",
  "  return OnloadCopy::engine;", "offload_tests", "[sm_copy_auto]"),
 # auto queries the device on every onload, managed memory alone included.
 ("offload/moves/sm_copy.cpp", "  if (staged_bytes == 0 || kernel_refusal(device) != nullptr) {",
  "  if (kernel_refusal(device) != nullptr) {", "offload_tests", "[sm_copy_auto]"),
 # Events are queried or destroyed with no context current: the runtime makes device 0's.
 ("hints/moves/trace.cpp", "  if (log.device >= 0) (void)scope.enter(Call::of(\"uvm_last_move\"), log.device, ContextScope::When::only_if_none_current);\n",
  "", "offload_tests", "[context]"),
 ("alloc/events.cpp", "  if (device >= 0) (void)scope.enter(Call::of(\"cudaEventDestroy\"), device, ContextScope::When::only_if_none_current);\n",
  "", "offload_tests", "[context]"),
 # Blocks (offload/moves/free.cpp): a new block keeps the staged bytes of the one before; a freed block's
 # staged copy stays; a block in a released allocation is not mapped; a move still running over the
 # allocation is not waited for.
 ("offload/moves/free.cpp", "  unstage_copies(begin, end, false, dropped_pinned);\n  const long long host_delta = registry().record_placement(allocation.base, begin, end, Move::to_device);",
  "  const long long host_delta = registry().record_placement(allocation.base, begin, end, Move::to_device);", "alloc_tests", "[blocks]"),
 ("offload/moves/free.cpp", "  if (!block.ours || !block.state.copied) return UVM_OK;",
  "  return UVM_OK;", "alloc_tests", "[blocks]"),
 # Free space: copied like data; or counted where the runtime never said it reports every block.
 ("offload/moves/offload.cpp", "      free = registry().free_space(range.allocation, range.begin, range.end);\n", "",
  "alloc_tests", "[blocks]"),
 ("alloc/registry.cpp", "  if (change != BlockChange::none && allocation.reported_runtime) {", "  if (change != BlockChange::none) {",
  "alloc_tests", "[blocks]"),
 ("offload/moves/free.cpp", "  return state.released ? map_released(call, allocation) : UVM_OK;", "  return UVM_OK;", "alloc_tests", "[blocks]"),
 ("offload/moves/free.cpp", "  if (uvm_status s = wait_for_last_move(call, state)) return s;\n", "", "alloc_tests", "[blocks]"),
 # The stateful model catches them too (a block reusing staged bytes; a freed one's copy kept).
 ("offload/moves/free.cpp", "  unstage_copies(begin, end, false, dropped_pinned);\n  const long long host_delta = registry().record_placement(allocation.base, begin, end, Move::to_device);",
  "  const long long host_delta = registry().record_placement(allocation.base, begin, end, Move::to_device);", "offload_tests", "[model]"),
 # An offload of a released allocation copies from its unmapped addresses (found by the model).
 ("offload/moves/offload.cpp", "    if (range.releasable && registry().released(range.allocation)) continue;\n", "", "hints_tests", "[release]"),
 # A prefetch to the CPU drops bytes written after a discard (found by the model).
 ("hints/prefetch.cpp", "      if (uvm_status s = undo_discard_marks(call, range, stream)) return s;\n", "", "offload_tests",
  "bytes written again after a discard survive an offload or prefetch that migrates them"),
 # Onload no longer takes its turn with the other moves: two threads map and release under each other.
 ("hints/moves/begin.cpp", "  move->lock_ = lock_moves();\n", "", "hints_tests", "threads offloading*"),
 # A move no longer waits for the last move of its bytes (begin_move, hints/moves/begin.cpp).
 ("hints/moves/begin.cpp", "  return wait_for_last_moves(call, move->ranges, stream);", "  return UVM_OK;", "hints_tests", "[order]"),
 # Pause (offload/moves/pause.cpp): the backup no longer decides what is kept; what is paused is moved again.
 ("offload/moves/pause.cpp", "    group.backup = UVM_BACKUP_NONE;\n", "", "offload_tests", "[pause]"),
 ("offload/moves/pause.cpp", "  unpaused.paused = false;\n", "", "offload_tests", "[pause]"),
 ("offload/moves/pause.cpp", "    awake.paused = false;\n", "", "offload_tests", "[set_backup]"),
 # Groups of moves (offload/moves/group.cpp): each offload of a group frees the staging the next one was
 # about to fill; a later call of a group on a device is published as a move of its own.
 ("offload/moves/group.cpp", "  if (in_group()) {\n    open_group.staging_free_owed = true;\n    return;\n  }\n", "",
  "offload_tests", "[group]"),
 ("hints/moves/trace.cpp", "    if (MoveLog* const joined = group_log(device)) {", "    if (MoveLog* const joined = nullptr) {",
  "hints_tests", "[group]"),
 # A group that says what it will stage still pins a block per slice that runs out of room.
 ("offload/media/staging.cpp", "new_block(call, missing + ahead, in_steps, &block)", "new_block(call, missing, in_steps, &block)",
  "offload_tests", "[group]"),
 # offload's part of a record (offload/copies.*): a discard leaves the bytes' host copies (an onload
 # would bring back what was discarded); a block's copies go unseen, so a new block keeps them.
 ("alloc/registry.cpp", "    if (std::unique_ptr<RoomPart> gone = allocation.offload->forget(begin, end)) forgotten.push_back(std::move(gone));\n", "",
  "offload_tests", "discard and free drop staged copies"),
 ("offload/media/copies.cpp", "    if (it != pieces->end() && it->first < end) return true;\n", "", "alloc_tests", "[blocks]"),
 # ...or what a part let go is destroyed under the registry's lock.
 ("alloc/registry.cpp", "  std::vector<std::unique_ptr<RoomPart>> forgotten;  // destroyed after the lock (RoomPart::forget)\n  std::lock_guard<std::mutex> lock(mutex_);\n",
  "  std::lock_guard<std::mutex> lock(mutex_);\n  std::vector<std::unique_ptr<RoomPart>> forgotten;\n", "alloc_tests", "[registry]"),
 # The soak: the closing thread forgets one descriptor in ten (nothing else notices a slow leak).
 ("offload/media/closer.cpp", "    for (size_t i = 0; i < taken; ++i) close(now[i]);",
  "    static int leak = 0;\n    for (size_t i = 0; i < taken; ++i) if (++leak % 10) close(now[i]);",
  "offload_tests", "[soak]"),
 # Preload (issue 57), on the CUDA double (tests/preload): an untagged region allocation made untagged
 # (tms_pause("default") pauses nothing); the CUDA error behind a failure replaced by uvm's status; a
 # failed free that drops the record of an allocation uvm still has; a region's device not kept; the
 # lock not taken across fork; an allocation that cannot be recorded neither given back nor refused.
 ("preload/interposer.cpp", "  if (untagged && lib.set_thread_tag(\"default\") != UVM_OK) return nullptr;\n", "",
  "meson:preload", ""),
 ("preload/interposer.cpp", "  if (const int code = lib.last_cuda_error(); code != 0) return static_cast<cudaError_t>(code);\n", "",
  "meson:preload", ""),
 ("preload/interposer.cpp", "    still_uvms = lib.allocation_info(ptr, &base, &size, &device) == UVM_OK && base == ptr;",
  "    still_uvms = false;", "meson:preload", ""),
 ("preload/interposer.cpp", "  if (region_device != UVM_ANY_DEVICE && device != region_device) {", "  if (false) {",
  "meson:preload", ""),
 ("preload/interposer.cpp", "  pthread_atfork([] { state().lock.lock(); }, [] { state().lock.unlock(); }, [] { state().lock.unlock(); });\n",
  "", "meson:preload", ""),
 ("preload/interposer.cpp", ("  try {\n    std::lock_guard<std::mutex> hold(state().lock);\n    state().handed[allocated]",
                             "  } catch (...) {  // no room to record it"),
  ("  {\n    std::lock_guard<std::mutex> hold(state().lock);\n    state().handed[allocated]",
   "  } if (false) {  // no room to record it"), "meson:preload", ""),
 # libuvm's side of issue 57: a free forgets a releasable allocation before its wait (a sticky error
 # leaks it); the CUDA error behind a failure is not kept; releasable memory never asks for GPUDirect
 # RDMA.
 ("alloc/malloc.cpp", "    if (s != UVM_OK) return s;  // still allocated: nothing was forgotten\n", "",
  "alloc_tests", "[releasable]"),
 ("alloc/errors.cpp", "    record(status, call.range_index, std::move(message), error);", "    record(status, call.range_index, std::move(message));",
  "alloc_tests", "[errors]"),
 ("alloc/vmm.cpp", "  prop->allocFlags.gpuDirectRDMACapable = caps.rdma ? 1 : 0;\n", "", "alloc_tests", "[releasable]"),
 # A first probe that fails is kept for the life of the process: the device's capabilities (all
 # false, no memory), a device's RDMA support ("not capable"); an ordering stream that could not be
 # made is taken for made.
 ("alloc/devices.cpp", "      if (error != cudaSuccess) return fail_cuda(",
  "      if (error != cudaSuccess) probe.known.store(true);\n      if (error != cudaSuccess) return fail_cuda(",
  "meson:alloc-first-probe", ""),
 ("alloc/vmm.cpp", "  if (r != CUDA_SUCCESS && r != CUDA_ERROR_INVALID_VALUE) {", "  if (false) {",
  "meson:alloc-first-probe", ""),
 ("hints/moves/streams.cpp", "    if (cudaError_t e = cudaStreamCreateWithFlags(&stream, flags)) {",
  "    if (cudaError_t e = cudaStreamCreateWithFlags(&stream, flags); e && false) {", "meson:hints-first-stream", ""),
 # An allocation that cannot be recorded (no host memory) keeps its memory and the limit's room.
 ("alloc/malloc.cpp", "    if (backing == Backing::releasable) (void)vmm_free(call, reinterpret_cast<uintptr_t>(ptr), &undo);\n    else if",
  "    if (false) {}\n    else if", "meson:preload", ""),
 # Paced pinning registers the next step without waiting for the copies into the steps before it.
 ("offload/media/pinned.cpp", "    return issued;\n  });", "    return true;\n  });", "offload_tests", "[pinned]"),
 # Sharing with another process: memory made without the exportable handle type; a move of memory
 # another process maps not refused; an importer not counted; a freed allocation's export kept (a
 # new allocation at its address would be handed out under the old handle).
 ("alloc/vmm.cpp", "  if (exportable && caps.exportable) prop->requestedHandleTypes = CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR;\n", "",
  "offload_tests", "[share]"),
 # Exportable only where asked (NCCL maps exportable memory into its peers): all memory made
 # exportable; an import across a pause not refused; a refused export not marked for the next
 # map; exportable memory kept as spare for another allocation. (The mark is set anew at each map
 # of new memory, so its reset at the unmap needs no mutant: vmm.cpp, map_physical.)
 ("alloc/vmm.cpp", "  if (exportable && caps.exportable) prop->requestedHandleTypes", "  if (caps.exportable) prop->requestedHandleTypes",
  "offload_tests", "[share]"),
 ("share/export.cpp", "  if (status == UVM_OK && (!mapping.exportable || mapping.handle != exported_memory)) {",
  "  if (status == UVM_OK && !mapping.exportable) {", "offload_tests", "[share]"),
 ("share/export.cpp", "  mapping->shared = true;\n  registry().set_mapping(found.base, *mapping);\n", "", "offload_tests", "[share]"),
 ("alloc/vmm.cpp", "  if (may_keep && !m->exportable) return release_or_keep(call, base, m);",
  "  if (may_keep) return release_or_keep(call, base, m);", "offload_tests", "[share]"),
 # A prepared pause: the retained copies' room prepared again; uvm_release_staging not stopping
 # it; its bound not kept.
 ("offload/moves/prepare.cpp", "!staged_copies(found.base, end).empty() || !retained_copies(found.base, end).empty()",
  "!staged_copies(found.base, end).empty()", "offload_tests", "[prepare]~[steps]"),
 ("offload/moves/prepare.cpp", "    if (releases.load() != asked_at) break;", "", "offload_tests", "[prepare]~[steps]"),
 ("offload/moves/prepare.cpp", "  const size_t limit = max_bytes == 0 ? SIZE_MAX : room_now + max_bytes;",
  "  const size_t limit = SIZE_MAX;", "offload_tests", "[prepare]~[steps]"),
 # Compressed backups: the coder's choices and the layout of what it stores.
 ("offload/coder/codec.cpp", "    if (held > best) best = held, best_base = base;",
  "    if (held >= best) best = held, best_base = base;", "offload_tests", "[codec]"),
 ("offload/coder/codec.cpp", "  return kChunkWords - best > kEscapeCapacity ? kRaw",
  "  return kChunkWords - best >= kEscapeCapacity ? kRaw", "offload_tests", "[codec]"),
 ("offload/coder/codec.cpp", "    if (code >= kWindow) {", "    if (code > kWindow) {", "offload_tests", "[codec]"),
 ("offload/coder/compress.cpp", "    at[batch.job] += batch_bytes;\n    return batch.end", "    return batch.end",
  "offload_tests", "[codec]"),
 ("offload/coder/compress.cpp", "  for (size_t c = first; c < end; ++c) total += codec::stored_bytes(flags[c]);",
  "  for (size_t c = first; c < end; ++c) total += codec::kCodedBytes;", "offload_tests", "[codec]"),
 # Compressed backups in the pause and resume: a partial decode that writes a whole edge chunk, or
 # starts at the chunk before its first byte; no fallback where the coder cannot load; managed bytes
 # decoded and not prefetched after (a later move to the CPU drops them).
 ("offload/coder/compress.cpp", "      const size_t begin = std::max(job.from, chunk_begin), end = std::min(job.to, chunk_begin + kChunk);",
  "      const size_t begin = chunk_begin, end = std::min(job.to, chunk_begin + kChunk);", "offload_tests", "[codec]"),
 ("offload/coder/compress.cpp", "    const size_t first = std::min((job.from + kChunk - 1) / kChunk, chunks);",
  "    const size_t first = std::min(job.from / kChunk, chunks);", "offload_tests", "[codec]"),
 ("offload/moves/offload.cpp", "  if (coded && (!move.caps.discard_supported || !coder_usable(move.device))) {",
  "  if (coded && !move.caps.discard_supported) {", "offload_tests", "[codec]"),
 ("offload/media/coded.cpp", "  if (uvm_status s = prefetch_managed(\"undoing the discard after the decode\")) return s;\n", "",
  "offload_tests", "[codec]"),
 # A compressed pause that gives memory back only once every copy has ended (the stream, not the
 # allocation's own copy); a preparation that leaves the coder to the first pause to load.
 ("offload/moves/offload.cpp", "      if (coded) done = copies_done(pieces.staged, copied);\n", "", "offload_tests", "[codec]"),
 ("offload/moves/prepare.cpp", "  if (uvm_status s = load_coder_ahead(call, selection)) return s;\n", "", "offload_tests", "[codec]"),
 # The chosen flags left out of the mapped host memory the host reads them from; a compressed resume
 # that maps every allocation before its first decode.
 ("offload/coder/compress.cpp", "      uint8_t* batch_on_host = scratch.chosen_on_host() + first_of_job + first;",
  "      uint8_t* batch_on_host = nullptr;", "offload_tests", "[codec]"),
 ("offload/moves/onload.cpp", "    if (!coded) {\n      if (uvm_status s = map_piece(i)) return s;\n    }",
  "    if (uvm_status s = map_piece(i)) return s;", "offload_tests", "[codec]"),
 # Staging memory near its GPU: the runtime's eight-digit PCI domain not cut to sysfs's four; a
 # node chosen on a host with one node.
 ("offload/media/numa.cpp", "  while (colon != std::string::npos && colon > 4 && id[0] == '0') {", "  while (false) {", "offload_tests",
  "[numa]"),
 # ... and a VMD domain (10000) cut to four digits (issue 73, item 10).
 ("offload/media/numa.cpp", "  while (colon != std::string::npos && colon > 4 && id[0] == '0') {",
  "  while (colon != std::string::npos && colon > 4) {", "offload_tests", "[numa]"),
 ("offload/media/numa.cpp", "  if (node_count(sysfs) <= 1) return -1;", "  if (node_count(sysfs) < 1) return -1;", "offload_tests",
  "[numa]"),
 # uvm.nccl on one node: registered anyway (NCCL keeps memory a pause must give back).
 ("python_shim/uvm/nccl.py", "    if _one_node():\n", "    if False:\n",
  "pytest", "tests/python/test_nccl.py::test_every_rank_on_this_node_registers_nothing_and_says_why"),
 ("hints/moves/begin.cpp", "  if (kind == MoveKind::offload || kind == MoveKind::discard) {  // another process may map them",
  "  if (false) {  // another process may map them", "offload_tests", "[share]"),
 ("share/export.cpp", "    state.by_base[base].importers.push_back(Importer{connection, peer.pid});\n", "",
  "offload_tests", "[share]"),
 ("alloc/malloc.cpp", "  if (found && part.take != nullptr) *kept = part.take(reinterpret_cast<uintptr_t>(ptr));\n", "",
  "offload_tests", "[share]"),
 # A region's free space, discarded at a pause, is no byte off the device; imports share a mapping.
 ("share/export.cpp", "!registry().block_state(found.base, found.base + found.size, &bytes) || bytes.on_host) {",
  "!registry().block_state(found.base, found.base + found.size, &bytes) || bytes.moved) {", "offload_tests", "[share]"),
 ("share/import.cpp", "    if (--it->second.imports > 0) return UVM_OK;  // other imports still use the mapping\n",
  "    --it->second.imports;\n", "offload_tests", "[share]"),
 ("share/import.cpp", "    if (known != state.base_of.end()) {  // mapped here already", "    if (false) {  // mapped here already",
  "offload_tests", "[share]"),
 # A releasable allocation whose access cannot be set keeps its physical memory; one whose mapping
 # cannot be made keeps its address range.
 ("alloc/vmm.cpp", "    api.unmap(base, m->reserved);\n    give_back_taken();\n", "    api.unmap(base, m->reserved);\n",
  "alloc_tests", "[releasable]"),
 ("alloc/vmm.cpp", "  if (uvm_status s = map_physical(call, base, device, &m, &created)) {  // allocates no host memory\n    api.address_free(base, m.reserved);",
  "  if (uvm_status s = map_physical(call, base, device, &m, &created)) {  // allocates no host memory", "alloc_tests", "[releasable]"),
 # The Python shim: a refused preload mode recorded before its check (issue 57 item 1); a preloaded
 # interposer that could not open libuvm not refused; the interposer's tms_* state started after a
 # thread's first setting (item 4; the shim builds the interposer from preload/ in its cache).
 ("python_shim/uvm/memory_saver.py", "                    _check_preload_settings(self.backing)\n                self.hook_mode = chosen",
  "                    self.hook_mode = chosen\n                    _check_preload_settings(self.backing)\n                self.hook_mode = chosen",
  "pytest", "tests/python/test_preload.py::test_the_preload_settings_refusal_holds_at_every_access"),
 ("python_shim/uvm/memory_saver.py", "    if reason:\n        raise RuntimeError(f\"hook_mode 'preload': uvm's cudaMalloc interposer", "    if False:\n        raise RuntimeError(f\"hook_mode 'preload': uvm's cudaMalloc interposer",
  "pytest", "tests/python/test_preload.py::test_a_process_that_cannot_open_libuvm_runs_and_fails_only_in_a_region_naming_why"),
 ("preload/tms_names.cpp", "uvm_backup current_backup() {\n  thread_state();", "uvm_backup current_backup() {",
  "pytest", "tests/python/test_preload.py::test_a_threads_tag_starts_as_default_and_its_first_setting_is_kept"),
 # The runtime's functions looked for in the global scope only (libuvm's own runtime, loaded locally,
 # is not found; issue 57 item 2).
 ("preload/interposer.cpp", "  return search.found;\n}", "  return nullptr;\n}",
  "pytest", "tests/python/test_preload.py::test_a_runtime_loaded_after_the_first_call_is_found"),
 # Memory the driver would not take back (issue 58 item 5): a free's record forgotten all the same; a
 # spare, or an offload's physical memory, forgotten; an emptied slab's failed cudaFree losing it.
 ("alloc/malloc.cpp", "    registry().insert(reinterpret_cast<uintptr_t>(ptr), std::move(*found));\n    found.reset();\n",
  "    found.reset();\n", "alloc_tests", "[errors]"),
 ("alloc/vmm.cpp", "      kept_back += it->bytes;\n      ++it;\n      continue;\n", "      kept_back += it->bytes;\n",
  "alloc_tests", "[errors]"),
 ("alloc/vmm.cpp", "  CUmemGenericAllocationHandle handle = m->handle;\n", "  CUmemGenericAllocationHandle handle = 0;\n",
  "alloc_tests", "[errors]"),
 ("alloc/slabs.cpp", "  else all.by_base.insert(all.closing.extract(it));", "  else all.closing.erase(it);",
  "alloc_tests", "[errors]"),
 # Pinned memory that could not be unpinned: a second try starting at the first step again; steps
 # cut off a block and then lost.
 ("offload/media/pinned.cpp", "      memory->host += given_back;\n      memory->bytes -= given_back;\n", "",
  "offload_tests", "[pinned]"),
 ("offload/media/staging.cpp", "    if (s != UVM_OK) keep_as_block(tail.host + given_back, tail.bytes - given_back, tail.device, tail.reads);\n", "",
  "offload_tests", "[steps]"),
 # Settling (alloc/settle.cpp): a wake while the driver held a poll, forgotten (the next poll comes
 # a delay after the held one); a release that leaves the device's polls running; the window never
 # ending them.
 ("alloc/settle.cpp", "    s.next[device] = std::max(s.next[device], now(s) + s.timing.every);",
  "    s.next[device] = now(s) + s.timing.every;", "alloc_tests", "[settle]"),
 ("alloc/settle.cpp", "  if (!pending(s, device)) return;\n  s.until[device] = {};", "  if (!pending(s, device)) return;",
  "alloc_tests", "[settle]"),
 ("alloc/settle.cpp", "    if (s.next[d] > s.until[d]) {", "    if (s.next[d] > s.until[d] + s.timing.window) {",
  "alloc_tests", "[settle]"),
 # A group of moves whose offloads each ask for a free in the background (issue 58 item 4: seen by a
 # counter, not after a sleep).
 ("offload/moves/group.cpp", "void free_unused_staging_after_offload() {\n  if (in_group()) {",
  "void free_unused_staging_after_offload() {\n  if (false) {", "offload_tests", "[group]"),
 # Rooms that had none (issue 58 item 1). Discard: releasable memory handed to the driver's discard;
 # discarded bytes not recorded as such.
 ("hints/discard.cpp", "    if (range.releasable) continue;  // device memory: uvm releases it instead (release.hpp)\n", "",
  "offload_tests", "[releasable]"),
 # (A mutant dropping registry().mark_discarded in hints/discard.cpp counted as killed only because its
 # selection, [safety], ran past its timeout unmutated too; no test kills it: it waits for one.)
 # Advise: the CPU taken as a device for accessed-by; releasable memory advised.
 ("hints/advise.cpp", "\"SetAccessedBy\", device,\n                             false);", "\"SetAccessedBy\", device,\n                             true);",
  "hints_tests", "[advise]"),
 ("hints/advise.cpp", "  if (uvm_status s = check_all_managed(call, {range}, \"advise\")) return s;\n", "",
  "alloc_tests", "[releasable]"),
 # The last move: another device's reported for this one; phases out of their order.
 ("hints/moves/last_move.cpp", "      if (key.first != thread || (device != UVM_ANY_DEVICE && key.second != device)) continue;",
  "      if (key.first != thread) continue;", "hints_tests", "[trace]"),
 ("hints/moves/last_move.cpp", "  std::sort(order.begin(), order.end(), [&](int a, int b) { return totals[a].first < totals[b].first; });\n",
  "", "hints_tests", "[trace]"),
 # UVM_TRACE: a write that does not step back over the closing bracket (invalid JSON from the second move).
 # uvm._pools (issue 58 item 1: the shim had none): a check that raises taken as safe; a pool's check
 # and death outside the lock; busy() counting its entry outside it.
 ("python_shim/uvm/_pools.py", "    except Exception:  # noqa: BLE001 - at interpreter exit torch may be half torn down: wait\n        return False",
  "    except Exception:  # noqa: BLE001 - at interpreter exit torch may be half torn down: wait\n        return True",
  "pytest", "tests/python/test_pools.py"),
 ("python_shim/uvm/_pools.py", "                with _lock:  # the check and the death", "                if True:  # the check and the death",
  "pytest", "tests/python/test_pools.py"),
 ("python_shim/uvm/_pools.py", "    global _busy\n    with _lock:\n        _busy += 1", "    global _busy\n    if True:\n        _busy += 1",
  "pytest", "tests/python/test_pools.py"),
 # uvm.vllm (vLLM's sleep mode): a sleep pinning past the host's memory; a selective wake that leaves the other tags asleep; a vLLM it does not
 # know, or whose own allocator came first, switched anyway; a sleep that forgets a tag it no longer
 # keeps pinned (the give-back thread would pin for it); a failure reaching vLLM as another kind than
 # RuntimeError.
 ("python_shim/uvm/vllm.py", " or tag not in DEFERRABLE_TAGS]", "]", "pytest",
  "tests/python/test_vllm.py::test_a_selective_wake_defers_only_weights_and_kv_cache"),
 ("python_shim/uvm/vllm.py", "        if to_copy > available + held.value:", "        if False:", "pytest",
  "tests/python/test_vllm.py::test_a_sleep_whose_host_backups_cannot_fit_is_refused_before_anything_sleeps"),
 ("python_shim/uvm/vllm.py", "    if not supported(version):", "    if False:", "pytest",
  "tests/python/test_vllm.py::test_a_vllm_version_it_does_not_know_keeps_vllms_allocator_and_is_told_once"),
 ("python_shim/uvm/vllm.py", '    if getattr(original, "instance", None) is not None:', "    if False:", "pytest",
  "tests/python/test_vllm.py::test_the_plugin_puts_it_in_place_where_no_pth_ran_and_refuses_after_vllms_own_was_made"),
 ("python_shim/uvm/vllm.py", "                    self._kept_pinned.remove(tag)\n", "", "pytest",
  "tests/python/test_vllm.py::test_a_sleep_remembers_the_tags_it_kept_pinned_and_after_a_wake_gives_back_then_pins_ahead"),
 ("python_shim/uvm/vllm.py", "        raise RuntimeError(f\"uvm's vLLM allocator: {call}{where} failed: {error}\") from error",
  "        raise error", "pytest",
  "tests/python/test_vllm.py::test_a_failure_reaches_vllm_as_runtime_error_naming_the_call_and_tag"),
 # uvm.sharing: installed once, in front of the earlier reducer; a pool's NCCL registration lifted
 # before a pause.
 ("python_shim/uvm/sharing.py", "            ForkingPickler.register(cls, reduce_tensor)\n        _installed = True",
  "            ForkingPickler.register(cls, reduce_tensor)", "pytest", "tests/python/test_sharing.py"),
 ("python_shim/uvm/memory_saver.py", "                nccl.before_pause(name)  # NCCL's registrations of its pools go first (uvm.nccl)",
  "                pass", "pytest", "tests/python/test_nccl.py"),
 # The switch's torch_memory_saver falling through to the original's submodules (issue 58 item 7).
 ("python_shim/uvm_switch.py", "        module.__path__ = list(layout.__path__)",
  "        original = importlib.machinery.PathFinder.find_spec(name)\n        module.__path__ = list(original.submodule_search_locations or []) if original else []",
  "pytest", "tests/python/test_wheel.py"),
 ("tests/peers/tms_alias/torch_memory_saver/__init__.py", "__path__ = list(_layout.__path__)",
  "__path__ = list(_layout.__path__)\nimport sys as _sys, os as _os\n__path__[:0] = [_os.path.join(p, 'torch_memory_saver') for p in _sys.path if _os.path.isfile(_os.path.join(p, 'torch_memory_saver', 'utils.py'))]",
  "pytest", "tests/python/test_tms_layout.py"),
 ("hints/moves/trace_file.cpp", "    if (wrote_any_) std::fseek(file_, -3, SEEK_END);  // back over \"\\n]\\n\"\n", "",
  "meson:hints-trace-file", ""),
 # Issue 73, hardening what was built last. A compressed piece's unaligned head coded with the rest
 # (a misaligned kernel access); the coder's last guard gone; no plain copies where the scratch cannot
 # be had; no CPU decode where the resume has no room for it.
 ("offload/media/coded.cpp", "    const uintptr_t aligned = std::min(round_up(pieces[i].begin, kCoderAlignment), pieces[i].end);",
  "    const uintptr_t aligned = pieces[i].begin;", "offload_tests", "[codec]"),
 ("offload/coder/compress.cpp", "    if (reinterpret_cast<uintptr_t>(ptr) % 16 != 0) {", "    if (false) {", "offload_tests", "[codec]"),
 ("offload/moves/offload.cpp", "  if (coded && !coder_scratch_ready(call, move.device, move.stream, pieces.staged, scratch)) {",
  "  if (false) {", "offload_tests", "[codec]"),
 ("offload/coder/compress.cpp", "      return decode_on_host(call, device, jobs, stream, before_writing);",
  "      return UVM_ERROR_CUDA;", "offload_tests", "[codec]"),
 # Sharing: the token not checked; the importer not checking who answers; a descriptor beside a
 # refusal kept; a forked child keeping the importer's connection; a failed free forgetting the
 # importers; exportable memory not marked so at its map; a handle from before a pause kept valid;
 # no timeout.
 ("share/export.cpp", "      token_matches = same_token(state.by_base[base].token, token);", "      token_matches = true;",
  "offload_tests", "[trust]"),
 ("share/import.cpp", "  if (uvm_status s = check_exporter(call, connection, handle)) {  // before the token is sent",
  "  if (uvm_status s = UVM_OK) {  // before the token is sent", "offload_tests", "[trust]"),
 ("share/import.cpp", "      } else {\n        close(received_fd);\n      }", "      }", "offload_tests", "[trust]"),
 ("share/import.cpp", "                     for (const auto& [base, imported] : child.by_base) close(imported.connection);\n", "",
  "offload_tests", "[share]"),
 ("alloc/malloc.cpp", "    if (kept && part.put_back != nullptr) part.put_back(reinterpret_cast<uintptr_t>(ptr), std::move(kept));\n", "",
  "offload_tests", "[share]"),
 ("alloc/vmm.cpp", "  if (handle != m->handle) m->exportable = prop.requestedHandleTypes != CU_MEM_HANDLE_TYPE_NONE;  // new memory\n",
  "", "offload_tests", "[share]"),
 ("share/export.cpp", "  if (exported.id != 0 && exported.memory != mapping.handle) {", "  if (false) {", "offload_tests", "[share]"),
 ("share/import.cpp", "  setsockopt(s, SOL_SOCKET, SO_RCVTIMEO, &wait, sizeof(wait));\n", "  (void)wait;\n",
  "meson:offload-share-timeout", ""),
 # prepare_pause pinning free space, and keeping the batch in flight after a release.
 ("offload/moves/prepare.cpp", "registry().free_space(found.base, found.base, end)", "std::vector<Span>{}", "offload_tests", "[prepare]~[steps]"),
 # Files that had none (issue 76, item 7).
 ("python_shim/uvm/vllm.py", "                        _refuse_if_mapped_elsewhere(lib, found, call, tag)\n", "", "pytest",
  "tests/python/test_vllm.py::test_a_sleep_of_memory_another_process_maps_is_refused_naming_it_before_anything_sleeps"),
 ("preload/interposer.cpp", ": folder + \"/cuda\" + std::to_string(major) + \"/libuvm.so\");", ": beside);", "pytest",
  "tests/python/test_preload.py::test_an_interposer_preloaded_with_nothing_named_opens_the_libuvm_of_the_runtime_the_process_loads"),
 ("alloc/limits.cpp", "  if (explicit_limit != kUseDefault) {", "  if (false) {", "alloc_tests", "[limits]"),
 ("alloc/span_set.cpp", "    if (span.second > end) kept.emplace_back(end, span.second);\n", "", "alloc_tests", "[spans]"),
 ("offload/moves/selection.cpp", "      if (bytes != nullptr) *bytes += moved;\n", "", "offload_tests", "[selection]"),
 ("offload/moves/residency.cpp", "  if (pieces.empty()) pieces = retained_copies(range.begin, range.end);\n", "", "offload_tests",
  "[retain]"),
 ("hints/moves/accounting.cpp", "  count_move(range.owner_device, range.end - range.begin, move != Move::to_device, host_delta, prefetch_calls);\n",
  "", "hints_tests", "[prefetch]"),
 ("python_shim/uvm/tms_layout/utils.py", "            os.environ.pop(name, None)", "            pass", "pytest",
  "tests/python/test_tms_layout.py::test_change_env_and_the_platform_helpers"),
 ("python_shim/uvm/tms_layout/hooks/mode_preload.py", '    path = globals()["get_binary_path_from_package"](utils.PRELOAD_STEM)',
  "    path = utils.get_binary_path_from_package(utils.PRELOAD_STEM)", "pytest",
  "tests/python/test_tms_layout.py::test_configure_subprocess_prepends_the_interposer_keeps_the_rest_and_puts_it_back"),
 ("python_shim/uvm/_lib.py", "    if isinstance(device, bool):", "    if False:", "pytest",
  "tests/python/test_surface.py::test_last_move_is_empty_before_any_move_and_flush_is_harmless"),
 ("python_shim/uvm/vllm_plugin.py", "        vllm.patch(module)", "        pass", "pytest",
  "tests/python/test_vllm.py::test_the_plugin_puts_it_in_place_where_no_pth_ran_and_refuses_after_vllms_own_was_made"),
 # A preparation pins in steps (one registration per 256 MiB step), and uvm_release_staging stops it.
 ("offload/moves/prepare.cpp", "staging().ensure_capacity(call, spans, true, 0, &steps, &block)",
  "staging().ensure_capacity(call, spans, false, 0, &steps, &block)", "offload_tests", "[steps]"),
 ("offload/media/pinned.cpp", "    if (progress->stop) break;\n", "", "offload_tests", "[steps]"),
 ("offload/media/staging.cpp", "    stop_pinning(*block->memory.steps);\n", "", "offload_tests", "[steps]"),
# A release that returns with the step in flight still pinned (it stayed after the release).
("offload/media/staging.cpp", "  for (const auto& pinning : uvm::staging().stop_unused_pinnings()) uvm::wait_for_pinning_end(*pinning);",
 "  uvm::staging().stop_unused_pinnings();", "offload_tests", "[steps]"),
 ("offload/moves/prepare.cpp", "    if (uvm_status s = staging().free_unused(call)) return s;\n", "", "offload_tests", "[prepare]~[steps]"),
# A preparation going on beside a pause of its allocations (pinning them a second time), or asked
# while one is under way; a pause of another tag stopping it.
("offload/moves/prepare.cpp", "    if (preparation.pause_came()) break;       // the pause pins what it still needs\n", "",
 "offload_tests", "a preparation stops for a pause*"),
("offload/moves/prepare.cpp", "      if (overlap(*pause, selection_)) paused_meanwhile_ = true;", "", "offload_tests",
 "a preparation stops for a pause*"),
("offload/moves/prepare.cpp", "  if (a.any_tag || b.any_tag) return true;\n  return std::any_of(", "  return true || std::any_of(",
 "offload_tests", "a preparation stops for a pause*"),
 # The shim: anything uvm did not allocate asked of uvm; a close during a capture made at once; a
 # failed offload leaving the tags it moved off the GPU; the preparer's thread stuck after a raise.
 ("python_shim/uvm/sharing.py", "        if getattr(tensor, \"layout\", torch.strided) is not torch.strided or not tensor.is_cuda:",
  "        if not tensor.is_cuda:", "pytest",
  "tests/python/test_sharing.py::test_a_tensor_that_is_not_dense_or_has_no_storage_goes_to_the_earlier_reducer_without_asking_uvm"),
 ("python_shim/uvm/sharing.py", "    if not _capturing():\n        lib = _lib.library()", "    if True:\n        lib = _lib.library()",
  "pytest", "tests/python/test_sharing.py::test_a_received_mapping_is_never_left_without_an_owner"),
 ("python_shim/uvm/torch.py", "                _undo_selections(undo_selection, selected, stream, error)\n", "",
  "pytest", "tests/python/test_torch.py"),
 ("python_shim/uvm/_prepare.py", "            except Exception as error:  # noqa: BLE001 - a daemon thread has no caller: kept for the user to read\n                self.last_error = f\"{type(error).__name__}: {error}\"\n",
  "", "pytest", "tests/python/test_prepare.py::test_a_preparation_that_raises_is_kept_and_the_thread_goes_on"),
 ("python_shim/uvm/_prepare.py", "        share = max(0, (available + others + held) // 2 - others - held)",
  "        share = available // 2", "pytest", "tests/python/test_prepare.py::test_the_node_shares_one_bound_half_its_memory_across_its_processes"),
 ("python_shim/uvm/_runtime.py", "    if major is None or major in MAJORS:\n        return", "    return", "pytest",
  "tests/python/test_surface.py::test_a_torch_built_for_a_cuda_major_uvm_has_no_build_for_is_refused_first_saying_what_to_install"),
]

# The source files with no mutant, and why (tests/python/test_counts.py: every other file of alloc/,
# hints/, offload/, preload/ and python_shim/ has one).
NO_MUTANT = {
    "alloc/blocks.cpp": "a flag (uvm_report_blocks) set and read; what it changes is mutated where it is read "
                        "(the registry's free space, prepare.cpp's mutant)",
    "alloc/default_advice.cpp": "not yet: UVM_DEFAULT_ADVICE's parsing and its getter",
    "alloc/driver_api.cpp": "the driver's entry points, looked up once: a mutant fails every test at load, which "
                            "says nothing about a test",
    "alloc/moves.cpp": "one process-wide mutex: taking it away is a race the TSan builds find, not an assertion",
    "hints/location.cpp": "not yet: uvm_query_location passes the driver's attributes through",
    "hints/moves/hint_range.cpp": "not yet: resolve_range's checks ([ranges] tests them)",
    "offload/coder/codec_kernels.cu": "GPU code: the CPU double runs the coder's C++ reference (codec.cpp, mutated) and the GPU "
                                "suite compares the kernels with it byte for byte; mutants run on the CPU machine only",
    "offload/coder/kernels.cpp": "loads the kernels' PTX through the driver: only a GPU runs them",
    "offload/moves/stream.cpp": "not yet: uvm_fetch_ranges and uvm_drop_ranges",
    "python_shim/uvm/__init__.py": "not yet: the public names, each a call into _lib.py or torch.py (mutated)",
    "python_shim/uvm/__main__.py": "the doctor: its tests run against the installed wheel (test_wheel.py), which a "
                                   "mutant of the tree does not reach without a wheel build per mutant",
    "python_shim/uvm/_build.py": "the JIT and wheel builds: their tests build for minutes (test_build.py, test_wheel.py)",
    "python_shim/uvm/_errors.py": "exception classes only",
    "python_shim/uvm/_preload.py": "not yet: finding the interposer and a child's environment",
    "python_shim/uvm/_state.py": "not yet: the block hook's states need torch's allocator",
    "python_shim/uvm/_switch.py": "uvm_switch.py by its name in the package (uvm_switch.py is mutated)",
    "python_shim/uvm/_tms_internals.py": "torch_memory_saver's private names for its examples: run by its examples on the "
                                         "GPU (tests/peers/run_tms_examples.sh)",
    "python_shim/uvm/_torch_blocks.cpp": "the block hook, compiled against a torch release: tested with a real torch "
                                         "(test_torch_blocks_build.py) and on the GPU",
    "python_shim/uvm/streaming.py": "its tests need a GPU (test_stream_gpu.py)",
    "python_shim/uvm/tms_layout/__init__.py": "a docstring and imports",
    "python_shim/uvm/tms_layout/entrypoint.py": "imports only",
    "python_shim/uvm/tms_layout/hooks/__init__.py": "a docstring only",
    "python_shim/uvm/tms_layout/testing_utils.py": "helpers torch_memory_saver's own tests call: run by them on the GPU "
                                                   "(tests/peers/run_tms_tests.sh)",
}
TAG_ENV = {"[steps]": {"UVM_PINNED": ""}, "[env_malformed]": {"UVM_PINNED": "pinned"}, "[model]": {"UVM_MODEL_SEQUENCES": "300", "UVM_MODEL_THREADED_SEQUENCES": "10"}, "[model]~[threads]": {"UVM_MODEL_SEQUENCES": "300", "UVM_MODEL_FILES_AT_ONCE": "1"}, "[sm_copy]": {"UVM_ONLOAD_COPY": "sm"},
           "[sm_copy_default]": {"UVM_ONLOAD_COPY": "", "FAKE_CUDA_SCENARIO": "pre_volta"},
           "[sm_copy_auto]": {"UVM_ONLOAD_COPY": ""}}
def room_of(path: str) -> str:
    return "python_shim" if path.startswith("python_shim/") else path.split("/")[0]


def mutated_text(path: str, old, new):
    """The source with the mutant applied, or None when a text does not occur in it exactly once."""
    text = open(path).read()
    olds, news = (old, new) if isinstance(old, tuple) else ((old,), (new,))
    for before, after in zip(olds, news):
        if text.count(before) != 1:
            return None
        text = text.replace(before, after)
    return text


def run_mutant(build: str, runner: str, selection: str, env: dict) -> str:
    """Rebuilds and runs the mutant's tests: "failed" when a test failed (a failed assertion, a
    Catch2 failure, pytest's exit 1), "crashed" when a Catch2 test died by a signal, "timeout" when
    they did not end within their bound (a suite that never ends is red), both kills said apart;
    "passed"; or "error: ..." when the run failed without a test failing (a collection error, pytest
    finding no test): that is no kill."""
    try:
        return run_mutant_tests(build, runner, selection, env)
    except subprocess.TimeoutExpired:
        return "timeout"


def run_mutant_tests(build: str, runner: str, selection: str, env: dict) -> str:
    if runner == "pytest":
        python = os.environ.get("UVM_PYTHON") or sys.executable
        r = subprocess.run([python, "-m", "pytest", "-x", "-q", "-p", "no:cacheprovider", *selection.split()],
                           stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, timeout=600,
                           env={**env, "UVM_TEST_FROM_TREE": "1"})
        # pytest's exit codes: 1 tests failed; 2 interrupted or a collection error, 3 internal, 4 usage,
        # 5 no test collected (a renamed node id).
        return {0: "passed", 1: "failed"}.get(r.returncode, f"error: pytest exit {r.returncode}")
    if runner.startswith("meson:"):
        b = subprocess.run(["ninja", "-C", build], capture_output=True, text=True)
        assert b.returncode == 0, b.stdout[-2000:]
        # A log of its own: the suite's testlog.json, which scripts/test.sh summarizes, stays as it was.
        r = subprocess.run(["meson", "test", "-C", build, "--no-rebuild", "--logbase", "mutant", runner[len("meson:"):]],
                           stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, timeout=600)
        return "passed" if r.returncode == 0 else "failed"
    b = subprocess.run(["ninja", "-C", build, f"tests/{runner}"], capture_output=True, text=True)
    assert b.returncode == 0, b.stdout[-2000:]
    # Only whether it failed counts: its output is not kept, so that a test that prints without end
    # (Catch2 wrapping a failed section's long name) cannot fill the memory or the disk.
    r = subprocess.run([f"{build}/tests/{runner}", selection], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                       env={**env, **TAG_ENV.get(selection, {})}, timeout=300)
    # Catch2 returns the number of failed assertions; a test that crashes (Catch2 reports the signal,
    # then the process dies by it) failed too, under the mutant, its selection having passed without it.
    if r.returncode < 0:
        return "crashed"
    return "passed" if r.returncode == 0 else "failed"


def catch2_selects_nothing(build: str, runner: str, selection: str) -> bool:
    """Whether a Catch2 selection names no test (Catch2 then runs none and passes: a renamed tag)."""
    b = subprocess.run(["ninja", "-C", build, f"tests/{runner}"], capture_output=True, text=True)
    assert b.returncode == 0, b.stdout[-2000:]
    listed = subprocess.run([f"{build}/tests/{runner}", "--list-test-names-only", selection], capture_output=True,
                            text=True, timeout=120)
    return not listed.stdout.strip()


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--build", default="build", help="the meson build folder (default: build)")
    parser.add_argument("--shard", help="K/N or today/N: the mutants at positions K modulo N")
    parser.add_argument("--only", help="positions, comma-separated")
    parser.add_argument("--list", action="store_true", help="list the mutants with their positions and rooms")
    parser.add_argument("--result", help="write the outcome as one line of JSON to this file")
    args = parser.parse_args()
    os.chdir(os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
    if args.list:
        for i, (path, old, new, runner, selection) in enumerate(MUTANTS):
            first = old[-1] if isinstance(old, tuple) else old
            print(f"{i:3} {room_of(path):12} {path}: {first.strip()[:70]!r} ({runner} {selection})")
        return 0
    chosen = list(range(len(MUTANTS)))
    shard = ""
    if args.shard:
        k, n = args.shard.split("/")
        n = int(n)
        k = int(time.time() // 86400) % n if k == "today" else int(k)
        chosen = [i for i in chosen if i % n == k]
        shard = f" (shard {k} of {n}: every mutant runs once in {n} days)"
    if args.only:
        chosen = [int(i) for i in args.only.split(",")]
    stale = [i for i, (path, old, new, _, _) in enumerate(MUTANTS) if mutated_text(path, old, new) is None]
    for i in stale:
        path, old = MUTANTS[i][0], MUTANTS[i][1]
        first = old[-1] if isinstance(old, tuple) else old
        print(f"STALE: mutant {i}: {path} no longer holds {first.strip()[:70]!r} exactly once: update the mutant")
    env = {**os.environ, "UVM_LIMIT_BYTES": "", "UVM_LIMIT_FRACTION": "", "UVM_DEFAULT_ADVICE": "", "UVM_PINNED": "hostalloc"}
    rooms: dict[str, list[int]] = {}
    survivors, broken, errors = [], [], []
    timeouts = crashes = 0
    unmutated: dict[tuple[str, str], str] = {}  # (runner, selection): how its tests end with no mutant
    for i in chosen:
        if i in stale:
            continue
        path, old, new, runner, selection = MUTANTS[i]
        # Each selection is first run as the source is: tests that fail anyway (an import that cannot
        # work, a test renamed) would count every mutant they select as killed, and a Catch2 tag that
        # names no test passes under every mutant.
        if (runner, selection) not in unmutated:
            if runner not in ("pytest",) and not runner.startswith("meson:") and catch2_selects_nothing(args.build, runner, selection):
                unmutated[(runner, selection)] = "selects no test"
            else:
                unmutated[(runner, selection)] = run_mutant(args.build, runner, selection, env)
        if unmutated[(runner, selection)] != "passed":
            print(f"BROKEN: mutant {i}: its tests ({runner} {selection}) without it: {unmutated[(runner, selection)]}: "
                  "fix them first", flush=True)
            broken.append(i)
            continue
        source = open(path).read()
        mutated = mutated_text(path, old, new)
        try:
            with open(path, "w") as out:
                out.write(mutated)
            outcome = run_mutant(args.build, runner, selection, env)
        finally:
            with open(path, "w") as out:
                out.write(source)
        first_old, first_new = (old[-1], new[-1]) if isinstance(old, tuple) else (old, new)
        what = f"mutant {i}: {path}: {first_old.strip()[:60]!r} -> {first_new.strip()[:60]!r}"
        if outcome.startswith("error"):  # the run failed, but no test did: no kill, and the check fails
            print(f"NOT A KILL: {what}: {outcome}", flush=True)
            errors.append(i)
            continue
        killed = outcome in ("failed", "timeout", "crashed")
        print(f"{'KILLED' if killed else 'SURVIVED'}: {what}" + (f" (by a {outcome[:-2] if outcome == 'crashed' else outcome})"
                                                                 if outcome in ("timeout", "crashed") else ""), flush=True)
        timeouts += outcome == "timeout"
        crashes += outcome == "crashed"
        counts = rooms.setdefault(room_of(path), [0, 0])
        counts[0] += killed
        counts[1] += 1
        if not killed:
            survivors.append(i)
    subprocess.run(["ninja", "-C", args.build], capture_output=True)
    for room, (killed, ran) in sorted(rooms.items()):
        print(f"room {room}: {killed} of {ran} killed")
    total_killed = sum(k for k, _ in rooms.values())
    total = sum(n for _, n in rooms.values())
    summary = (f"mutants: {total_killed} of {total} killed ({timeouts} by a timeout, {crashes} by a crash), {len(stale)} stale, "
               f"{len(broken)} broken, {len(errors)} not a kill{shard}")
    print(summary)
    if args.result:
        with open(args.result, "w") as out:
            json.dump({"name": "mutants" + (f" {shard.strip()}" if shard else ""), "passed": total_killed,
                       "failed": len(survivors) + len(stale) + len(broken) + len(errors), "summary": summary,
                       "survivors": survivors, "stale": stale, "broken": broken, "errors": errors,
                       "timeouts": timeouts, "crashes": crashes}, out)
            out.write("\n")
    return 1 if survivors or stale or broken or errors else 0


if __name__ == "__main__":
    sys.exit(main())
