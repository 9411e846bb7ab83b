"""Mutation check: each mutant below survived the CPU suite once (or, for releasable memory, is a
mistake its tests were written to catch); the tests that kill it now must fail when it is applied. Applies one at a time to the sources, rebuilds the test program in
BUILD_DIR (default build), runs the named tests, and restores the source. Prints KILLED or
SURVIVED per mutant; exits 1 if any survived.

    python3 scripts/mutants.py [BUILD_DIR]

MUTANT_FROM=i MUTANT_TO=j runs mutants i to j-1 only (their positions in MUTANTS), to rerun a few.
"""
import os
import subprocess
import sys

BUILD = sys.argv[1] if len(sys.argv) > 1 else "build"
# (source, original text, mutated text, test program, Catch2 filter); the texts may be tuples
# of several places changed together
MUTANTS = [
 # Disk and mmap copies (issue 26): a read that ignores its alignment skew; a change while offloaded
 # not caught; the chunk's padding not widened for O_DIRECT; the copy kept after its bytes come back.
 ("offload/spill.cpp", "  return buffer + chunk.bounce + (chunk.offset - chunk.io_begin);", "  return buffer + chunk.bounce;",
  "offload_tests", "[spill]"),
 ("offload/disk.cpp", "  else if (change_ns(about) != changed_ns_) changed = \"was written or changed\";\n", "",
  "offload_tests", "[spill]"),
 ("offload/plan.cpp", "      chunk.io_begin = align_down(chunk.offset, align);", "      chunk.io_begin = chunk.offset;",
  "offload_tests", "[plan]"),
 ("offload/onload.cpp", "    unstage_copies(w.piece.span.begin, w.piece.span.end, retain);\n", "",
  "offload_tests", "[spill]"),
 # Disk moves of more allocations than descriptors (every file open at once, writing or reading);
 # the closing thread's waiting descriptors left open in a fork's child.
 ("offload/spill.cpp", "  const size_t group = kept == Kept::disk ? files_at_once() : targets_count;",
  "  const size_t group = targets_count;", "offload_tests", "[spill]"),
 ("offload/spill.cpp", "  const size_t group = files_at_once();\n  for (size_t first = 0; status",
  "  const size_t group = files.size() + 1;\n  for (size_t first = 0; status", "offload_tests", "[spill]"),
 ("offload/closer.cpp", "                     for (size_t i = 0; i < child.count; ++i) close(child.waiting[i]);\n", "",
  "offload_tests", "[spill]"),
 # A group of files after the first leaves its first file unsealed (its onload then fails): only
 # moves of more files than a group reach it, which the model makes one file at a time.
 ("offload/spill.cpp", "    for (size_t target = first; target < end && kept == Kept::disk; ++target) {",
  "    for (size_t target = first ? first + 1 : 0; target < end && kept == Kept::disk; ++target) {",
  "offload_tests", "[model]~[threads]"),
 # Retained copies (retain_cpu_backup): one that outlives the block it was of; a resume that keeps
 # nothing; a pause that writes elsewhere than the retained copy; a free that leaves the pinned
 # staging its copies held.
 ("offload/copies.cpp", "      cut_out(copies->retained, begin, end, &dropped);\n", "", "offload_tests", "[model]"),
 ("offload/copies.cpp", "  cut_out(copies.retained, begin, end, dropped);\n", "", "offload_tests", "[retain]"),
 ("offload/onload.cpp", "    unstage_copies(w.piece.span.begin, w.piece.span.end, retain);", "    unstage_copies(w.piece.span.begin, w.piece.span.end, false);",
  "offload_tests", "[retain]"),
 ("offload/offload.cpp", "    if (!in_place.spans.empty()) {  // those first", "    if (false) {  // those first",
  "offload_tests", "[retain]"),
 ("offload/free.cpp", "  return staging().free_unused(call);", "  return UVM_OK;", "offload_tests", "[retain]"),
 ("alloc/options.cpp", "if (value > (std::numeric_limits<size_t>::max() >> shift)) return false;", "", "alloc_tests", "[options]"),
 # Options: allocation does not check them (an explicit limit and advice set, as a test's fixture
 # has them, hide the refusal from every other reader).
 ("alloc/malloc.cpp", "  if (uvm_status s = check_options(call)) return s;\n", "", "alloc_tests", "[env_malformed]"),
 ("alloc/stats.cpp", "const size_t in_use = a.stats.live_bytes + a.reserved;", "const size_t in_use = a.stats.live_bytes;", "alloc_tests", "[limits]"),
 ("alloc/registry.cpp", "if (address - it->first >= it->second.size) return false;", "if (address - it->first > it->second.size) return false;", "alloc_tests", "[malloc]"),
 ("hints/moves/ranges.cpp", "same_allocation ? range.begin <= last.end :", "same_allocation ? range.begin <= last.end + 512 :", "offload_tests", "[safety]"),
 # A failed offload keeps the staging it reserved (its leases): nothing is left pinned for nothing.
 ("offload/offload.cpp", "    clear_cuda_error(cudaStreamSynchronize(stream));\n    return status;",
  "    clear_cuda_error(cudaStreamSynchronize(stream));\n    static auto* kept = new std::vector<std::shared_ptr<char>>();\n"
  "    kept->insert(kept->end(), reserved.leases.begin(), reserved.leases.end());\n    return status;", "offload_tests", "[rollback]"),
 ("alloc/tags.cpp", "if (count > UVM_MAX_TAGS) {", "if (count > UVM_MAX_TAGS + 1) {", "alloc_tests", "[tag_limit]"),
 ("alloc/tags.cpp", "if (count > UVM_MAX_TAGS) {", "if (count >= UVM_MAX_TAGS) {", "alloc_tests", "[tag_limit]"),
 # Releasable memory: released while a byte is still on the device; never released; not mapped
 # before its copies back; mapped all at once before them; released before its copies end.
 ("alloc/registry.cpp", "return allocation.host.total() + allocation.discarded.total() == allocation.size;",
  "return allocation.host.total() + allocation.discarded.total() > 0;", "hints_tests", "[release]"),
 ("offload/offload.cpp", "  return release_emptied(call, move.ranges, stream, done);", "  return UVM_OK;", "hints_tests", "[release]"),
 ("offload/onload.cpp", "    if (!managed) {\n      if (uvm_status s = restore_one(call, allocation)) return s;\n    }\n", "", "hints_tests", "[release]"),
 ("offload/onload.cpp", "  if (move.ranges.empty()) return UVM_OK;\n  std::vector<StagedWork> all_staged, staged, kept;",
  "  if (move.ranges.empty()) return UVM_OK;\n  if (uvm_status s = restore_released(call, move.ranges)) return s;\n  std::vector<StagedWork> all_staged, staged, kept;",
  "hints_tests", "[release]"),
 ("hints/moves/release.cpp", "    if (!own && !stream_done) {", "    if (false) {", "hints_tests", "[release]"),
 ("offload/staging.cpp", "  std::lock_guard<std::mutex> growing(growth_mutex_);\n", "", "offload_tests", "reservations at once*"),
 # An offload pins staging memory holding the moves lock (uvm_free on another thread waits seconds);
 # release_staging frees pinned memory under the moves lock, which uvm_free needs. (An offload that
 # found its room taken and gave up survived once begin_move checked and reserved the room under one
 # lock: no other offload can take it in between any more.)
 ("offload/offload.cpp", "      move.unlock();\n      const size_t ahead", "      const size_t ahead",
  "offload_tests", "offloads that need room*"),
 ("offload/staging.cpp", ("#include \"../alloc/registry.hpp\"\n", "    const uvm_status staging = uvm::staging().free_unused(call);"),
  ("#include \"../alloc/moves.hpp\"\n#include \"../alloc/registry.hpp\"\n",
   "    const auto moves = uvm::lock_moves();\n    const uvm_status staging = uvm::staging().free_unused(call);"),
  "offload_tests", "freeing pinned staging*"),
 # An offload lets release_staging take the room it made before it reserves it (a livelock on an H100).
 ("offload/offload.cpp", "  const Staging::RoomClaim claim(staging());\n", "",
  "offload_tests", "release_staging does not take*"),
 # A move no longer waits for the last move of its allocation on another stream.
 ("hints/moves/order.cpp", "  for (const EventRef& move : registry().last_move_events(allocations_of(ranges))) {", "  for (const EventRef& move : std::vector<EventRef>{}) {",
  "hints_tests", "[order]"),
 # A first offload pins all its staging memory before copying (UVM_PINNED unset: the registered
 # way); or copies across the end of a step (two registrations: cudaErrorInvalidValue on an H100).
 ("offload/offload.cpp", "staging().ensure_capacity(call, wanted, true, ahead)", "staging().ensure_capacity(call, wanted, false, ahead)",
  "offload_tests", "[steps]"),
 ("offload/staging.cpp", "std::min({static_cast<size_t>(span.end - at), to_step_end, room(b)})",
  "std::min(static_cast<size_t>(span.end - at), room(b))", "offload_tests", "[steps]"),
 # A round of an offload in steps stages a whole piece where staging placed only its first part.
 ("offload/offload.cpp", "    cut.push_back(clipped(pieces[p], span));", "    cut.push_back(pieces[p]);", "offload_tests", "[steps]"),
 # Timing reads events in the global capture mode: a capture on another stream is invalidated.
 ("hints/moves/trace.cpp", "  const RelaxedCapture relaxed;\n  out->clear();", "  out->clear();", "hints_tests", "[trace_capture]"),
 ("hints/moves/trace.cpp", "  Epoch of(int device) {\n    const RelaxedCapture relaxed;", "  Epoch of(int device) {", "hints_tests", "[trace_capture]"),
 # A slot freed while staged is handed out again (a copy into its discarded pages could be lost later).
 ("alloc/slabs.cpp", "  if (!reusable) found.retired.set(index);\n", "", "offload_tests", "[slabs]"),
 # Onload populates slot by slot again: one prefetch range per segment of a slab.
 ("offload/plan.cpp", "before->memory == piece.memory && piece.memory != 0", "before->allocation == piece.allocation && piece.allocation != 0",
  "offload_tests", "[slabs]"),
 # Neighbouring pieces are copied as one even across two pinning steps (cudaErrorInvalidValue on an H100).
 ("offload/plan.cpp", "if (!follows || !one_registration(pieces[first].host, bytes + next.span.size())) break;",
  "if (!follows) break;", "offload_tests", "[steps]"),
 # Staging left empty by a smaller offload is kept for ever.
 ("offload/offload.cpp", "if (status == UVM_OK && staged) free_unused_staging_after_offload();", "", "offload_tests",
  "when the set offloaded shrinks*"),
 # A block pinned in steps keeps its unused steps; cuts them where no step starts; or frees them
 # and later unregisters them again with the block.
 ("offload/staging.cpp", "  if (!memory.steps || block.live == 0) return 0;", "  return 0;", "offload_tests", "[steps]"),
 ("offload/staging.cpp", "  const size_t kept = (block.used + kPinStepBytes - 1) / kPinStepBytes * kPinStepBytes;",
  "  const size_t kept = block.used;", "offload_tests", "[steps]"),
 ("offload/staging.cpp", "        memory.steps->pinned = memory.bytes;\n", "", "offload_tests", "[steps]"),
 # The SM kernel copies into managed memory too (measured with engine copies only), or takes a copy
 # that does not start on a 16-byte boundary.
 ("offload/onload.cpp", "if (!managed && how == OnloadCopy::sm && sm_copyable(", "if (how == OnloadCopy::sm && sm_copyable(",
  "offload_tests", "[sm_copy]"),
 ("offload/sm_copy.cpp", "bytes % kWordBytes == 0 &&\n         aligned(dst) && aligned(host)", "bytes % kWordBytes == 0",
  "offload_tests", "[sm_copy]"),
 # With UVM_ONLOAD_COPY unset, a device too old for the kernel gets it anyway (the onload fails).
 ("offload/sm_copy.cpp", "  if (staged_bytes == 0 || kernel_refusal(device) != nullptr) {", "  if (staged_bytes == 0) {",
  "offload_tests", "[sm_copy_default]"),
 # auto takes the kernel whatever the device has free (the kernel idles through the driver's stall
 # on a full GPU), or the engine whatever (half speed after a bulk free).
 ("offload/sm_copy.cpp", "  return free_bytes / kAutoKernelFreeFactor > staged_bytes ? OnloadCopy::sm : OnloadCopy::engine;",
  "  return OnloadCopy::sm;", "offload_tests", "[sm_copy_auto]"),
 ("offload/sm_copy.cpp", "  return free_bytes / kAutoKernelFreeFactor > staged_bytes ? OnloadCopy::sm : OnloadCopy::engine;",
  "  return OnloadCopy::engine;", "offload_tests", "[sm_copy_auto]"),
 # auto queries the device on every onload, managed memory alone included.
 ("offload/sm_copy.cpp", "  if (staged_bytes == 0 || kernel_refusal(device) != nullptr) {",
  "  if (kernel_refusal(device) != nullptr) {", "offload_tests", "[sm_copy_auto]"),
 # Events are queried or destroyed with no context current: the runtime makes device 0's.
 ("hints/moves/trace.cpp", "  if (log.device >= 0) (void)scope.enter(Call::of(\"uvm_last_move\"), log.device, ContextScope::When::only_if_none_current);\n",
  "", "offload_tests", "[context]"),
 ("alloc/events.cpp", "  if (device >= 0) (void)scope.enter(Call::of(\"cudaEventDestroy\"), device, ContextScope::When::only_if_none_current);\n",
  "", "offload_tests", "[context]"),
 # Blocks (offload/free.cpp): a new block keeps the staged bytes of the one before; a freed block's
 # staged copy stays; a block in a released allocation is not mapped; a move still running over the
 # allocation is not waited for.
 ("offload/free.cpp", "  unstage_copies(begin, end, false, dropped_pinned);\n  const long long host_delta = registry().record_placement(allocation.base, begin, end, Move::to_device);",
  "  const long long host_delta = registry().record_placement(allocation.base, begin, end, Move::to_device);", "alloc_tests", "[blocks]"),
 ("offload/free.cpp", "  if (!block.ours || !block.state.copied) return UVM_OK;",
  "  return UVM_OK;", "alloc_tests", "[blocks]"),
 # Free space: copied like data; or counted where the runtime never said it reports every block.
 ("offload/offload.cpp", "      free = registry().free_space(range.allocation, range.begin, range.end);\n", "",
  "alloc_tests", "[blocks]"),
 ("alloc/registry.cpp", "  if (change != BlockChange::none && allocation.reported_runtime) {", "  if (change != BlockChange::none) {",
  "alloc_tests", "[blocks]"),
 ("offload/free.cpp", "  return state.released ? map_released(call, allocation) : UVM_OK;", "  return UVM_OK;", "alloc_tests", "[blocks]"),
 ("offload/free.cpp", "  if (uvm_status s = wait_for_last_move(call, state)) return s;\n", "", "alloc_tests", "[blocks]"),
 # The stateful model catches them too (a block reusing staged bytes; a freed one's copy kept).
 ("offload/free.cpp", "  unstage_copies(begin, end, false, dropped_pinned);\n  const long long host_delta = registry().record_placement(allocation.base, begin, end, Move::to_device);",
  "  const long long host_delta = registry().record_placement(allocation.base, begin, end, Move::to_device);", "offload_tests", "[model]"),
 # An offload of a released allocation copies from its unmapped addresses (found by the model).
 ("offload/offload.cpp", "    if (range.releasable && registry().released(range.allocation)) continue;\n", "", "hints_tests", "[release]"),
 # A prefetch to the CPU drops bytes written after a discard (found by the model).
 ("hints/prefetch.cpp", "      if (uvm_status s = undo_discard_marks(call, range, stream)) return s;\n", "", "offload_tests", "[safety]"),
 # Onload no longer takes its turn with the other moves: two threads map and release under each other.
 ("hints/moves/begin.cpp", "  move->lock_ = lock_moves();\n", "", "hints_tests", "threads offloading*"),
 # A move no longer waits for the last move of its bytes (begin_move, hints/moves/begin.cpp).
 ("hints/moves/begin.cpp", "  return wait_for_last_moves(call, move->ranges, stream);", "  return UVM_OK;", "hints_tests", "[order]"),
 # Pause (offload/pause.cpp): the backup no longer decides what is kept; what is paused is moved again.
 ("offload/pause.cpp", "    group.backup = UVM_BACKUP_NONE;\n", "", "offload_tests", "[pause]"),
 ("offload/pause.cpp", "  unpaused.paused = false;\n", "", "offload_tests", "[pause]"),
 # Groups of moves (offload/group.cpp): each offload of a group frees the staging the next one was
 # about to fill; a later call of a group on a device is published as a move of its own.
 ("offload/group.cpp", "  if (in_group()) {\n    open_group.staging_free_owed = true;\n    return;\n  }\n", "",
  "offload_tests", "[group]"),
 ("hints/moves/trace.cpp", "    if (MoveLog* const joined = group_log(device)) {", "    if (MoveLog* const joined = nullptr) {",
  "hints_tests", "[group]"),
 # A group that says what it will stage still pins a block per slice that runs out of room.
 ("offload/staging.cpp", "new_block(call, missing + ahead, in_steps, &block)", "new_block(call, missing, in_steps, &block)",
  "offload_tests", "[group]"),
 # offload's part of a record (offload/copies.*): a discard leaves the bytes' host copies (an onload
 # would bring back what was discarded); a block's copies go unseen, so a new block keeps them.
 ("alloc/registry.cpp", "    if (std::unique_ptr<RoomPart> gone = allocation.offload->forget(begin, end)) forgotten.push_back(std::move(gone));\n", "",
  "offload_tests", "discard and free drop staged copies"),
 ("offload/copies.cpp", "    if (it != pieces->end() && it->first < end) return true;\n", "", "alloc_tests", "[blocks]"),
 # ...or what a part let go is destroyed under the registry's lock.
 ("alloc/registry.cpp", "  std::vector<std::unique_ptr<RoomPart>> forgotten;  // destroyed after the lock (RoomPart::forget)\n  std::lock_guard<std::mutex> lock(mutex_);\n",
  "  std::lock_guard<std::mutex> lock(mutex_);\n  std::vector<std::unique_ptr<RoomPart>> forgotten;\n", "alloc_tests", "[registry]"),
 # The soak: the closing thread forgets one descriptor in ten (nothing else notices a slow leak).
 ("offload/closer.cpp", "    for (size_t i = 0; i < taken; ++i) close(now[i]);",
  "    static int leak = 0;\n    for (size_t i = 0; i < taken; ++i) if (++leak % 10) close(now[i]);",
  "offload_tests", "[soak]"),
]
TAG_ENV = {"[steps]": {"UVM_PINNED": ""}, "[env_malformed]": {"UVM_PINNED": "pinned"}, "[model]": {"UVM_MODEL_SEQUENCES": "300", "UVM_MODEL_THREADED_SEQUENCES": "10"}, "[model]~[threads]": {"UVM_MODEL_SEQUENCES": "300", "UVM_MODEL_FILES_AT_ONCE": "1"}, "[sm_copy]": {"UVM_ONLOAD_COPY": "sm"},
           "[sm_copy_default]": {"UVM_ONLOAD_COPY": "", "FAKE_CUDA_SCENARIO": "pre_volta"},
           "[sm_copy_auto]": {"UVM_ONLOAD_COPY": ""}}
os.chdir(os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
env = {**os.environ, "UVM_LIMIT_BYTES": "", "UVM_LIMIT_FRACTION": "", "UVM_DEFAULT_ADVICE": "", "UVM_PINNED": "hostalloc"}
survived = 0
for path, old, new, binary, tag in MUTANTS[int(os.environ.get('MUTANT_FROM', '0')):int(os.environ.get('MUTANT_TO', '999'))]:
    src = open(path).read()
    olds, news = (old, new) if isinstance(old, tuple) else ((old,), (new,))  # a mutant may change several places
    mutated = src
    for before, after in zip(olds, news):
        assert mutated.count(before) == 1, (path, before)
        mutated = mutated.replace(before, after)
    old, new = olds[-1], news[-1]
    open(path, "w").write(mutated)
    try:
        b = subprocess.run(["ninja", "-C", BUILD, f"tests/{binary}"], capture_output=True, text=True)
        assert b.returncode == 0, b.stdout[-2000:]
        # The [steps] tests pin the registered way, as UVM_PINNED unset asks; [sm_copy] copies by kernel.
        run_env = {**env, **TAG_ENV.get(tag, {})}
        r = subprocess.run([f"{BUILD}/tests/{binary}", tag], capture_output=True, text=True, errors="replace", env=run_env, timeout=300)
        survived += r.returncode == 0
        print(f"{'KILLED' if r.returncode else 'SURVIVED'}: {path}: {old.strip()[:60]!r} -> {new.strip()[:60]!r}")
    finally:
        open(path, "w").write(src)
subprocess.run(["ninja", "-C", BUILD], capture_output=True)
sys.exit(1 if survived else 0)
