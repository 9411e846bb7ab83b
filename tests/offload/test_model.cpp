// A stateful, randomized model of every sequence: a caching allocator that cuts blocks out of uvm
// allocations and reuses freed ones without uvm_free (as PyTorch's does, reporting its blocks with
// uvm_block_allocated / uvm_block_freed as the Python shim does for PyTorch), driven through random
// sequences of allocate, free, write, offload / onload / discard by tensor, by a set of tensors (a
// module), by tag and by device (listed, or selected in one call), by pool, uvm_pause and uvm_resume (retaining the host copies or not) of pools made with and without a backup, compressed or not, a releasable tensor shared
// (exported, imported in this process, read and written through the import, closed), release_staging, uvm_prepare_pause of a pool's tag,
// set_limit and empty_cache, on managed (slab and driver allocations) and releasable pools — against
// a shadow of what every live tensor must hold. After every step each tensor the model says is on
// the device must hold exactly its bytes.
//
// UVM_MODEL_SEQUENCES (default 2000) sets how many sequences run; UVM_MODEL_SEED=N replays one.
// UVM_MODEL_FILES_AT_ONCE=N: disk moves make, write and read N files at a time.
// A failure prints its seed and the steps that led to it.
#include <atomic>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <random>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "../../offload/media/spill.hpp"
#include "fixture.hpp"

namespace {

constexpr size_t kBlockAlign = 512;       // PyTorch rounds every block to this
constexpr size_t kSmallSegment = 2 << 20;  // PyTorch's small-pool segment: a slab slot when managed
constexpr size_t kMiB = size_t{1} << 20;
constexpr int kSteps = 40;  // a sequence's steps

size_t round_up(size_t n, size_t to) { return (n + to - 1) / to * to; }

unsigned char pattern(uint32_t seed, size_t i) { return static_cast<unsigned char>(seed * 131 + i * 7 + (i >> 9) + 13); }

// What the model expects a tensor's bytes to be: on the device; offloaded (back on onload); on the
// device but indeterminate (discarded: writable again); or offloaded while indeterminate (back
// indeterminate). Offloaded bytes are not to be touched before they are onloaded (uvm.h).
enum class Held { device, away, garbage, away_garbage };

struct Block {
  size_t offset, size;
  bool used;
};

struct Segment {
  unsigned char* base;
  size_t size;
  std::vector<Block> blocks;  // by offset, covering the segment
  bool paused = false;        // by uvm_pause, until uvm_resume
};

struct Pool {
  std::string tag;
  bool releasable;
  bool reported;  // its segments are made with uvm_report_blocks on: their free space is dropped
  std::vector<Segment> segments;
  uvm_backup backup = UVM_BACKUP_NONE;  // what uvm_pause keeps of its segments
  bool compressed = false;              // whether it keeps them compressed (uvm_set_thread_compression)
};

struct Tensor {
  size_t pool;
  unsigned char* ptr;
  size_t size;   // the bytes it uses
  size_t block;  // its block's size, as the runtime reports it
  std::vector<unsigned char> shadow;  // what it must hold while `held` is device
  Held held;
  // Streaming (uvm_fetch_ranges, uvm_drop_clean_ranges): whether an offload kept its bytes in host
  // memory (away: pinned or mmap'ed, which a fetch keeps), whether uvm holds a host copy equal to
  // what it holds on the device (a drop may let it go), and whether it was ever fetched (before
  // that, no copy of it exists and a drop must be refused).
  bool memory_copy = false;
  bool clean = false;
  bool fetched = false;
};

class Model {
 public:
  // `alone`: no other model runs beside this one, so it may move everything on the device.
  Model(uint64_t seed, const std::string& name, bool alone) : rng_(seed), seed_(seed), alone_(alone) {
    // Every block is reported, as the shim's hook does for PyTorch; the kv pool's segments are made
    // with reporting off, as a pool made before the hook was attached: every byte of them counts.
    pools_.push_back(Pool{name + "-managed", false, true, {}});
    pools_.push_back(Pool{name + "-releasable", true, true, {}});
    pools_.push_back(Pool{name + "-kv", false, false, {}});
    const uvm_backup backups[] = {UVM_BACKUP_NONE, UVM_BACKUP_HOST, UVM_BACKUP_MMAP, UVM_BACKUP_DISK};
    for (Pool& pool : pools_) {
      pool.backup = backups[pick(4)];
      pool.compressed = pick(2) == 0;
    }
    stream_ = fake::make_stream();
  }

  // Runs `steps` random steps; returns "" or what went wrong, with the steps that led there.
  std::string run(int steps) {
    for (int i = 0; i < steps && failure_.empty(); ++i) {
      step();
      if (failure_.empty()) check("after " + last_step_);
    }
    teardown();  // also after a failure: the next sequence starts from nothing
    if (failure_.empty()) return "";
    std::ostringstream out;
    out << "seed " << seed_ << ": " << failure_ << "\n  steps:";
    for (const std::string& s : log_) out << "\n    " << s;
    return out.str();
  }

 private:
  size_t pick(size_t n) { return std::uniform_int_distribution<size_t>(0, n - 1)(rng_); }
  bool chance(int percent) { return static_cast<int>(pick(100)) < percent; }

  void note(const std::string& what) {
    last_step_ = what;
    log_.push_back(what);
  }
  void fail(const std::string& what) {
    if (failure_.empty()) failure_ = what + (uvm_last_error()[0] ? std::string(" (last error: ") + uvm_last_error() + ")" : "");
  }
  void expect_ok(uvm_status status, const char* call) {
    if (status != UVM_OK) fail(std::string(call) + " returned " + uvm_status_string(status));
  }

  // --- the caching allocator ---

  Tensor* allocate(size_t pool_index, size_t size) {
    Pool& pool = pools_[pool_index];
    const size_t block = round_up(size, kBlockAlign);
    Segment* best_segment = nullptr;
    size_t best = 0;
    for (Segment& segment : pool.segments) {  // best fit, lowest address on ties
      for (size_t b = 0; b < segment.blocks.size(); ++b) {
        const Block& candidate = segment.blocks[b];
        if (candidate.used || candidate.size < block) continue;
        if (best_segment == nullptr || candidate.size < best_segment->blocks[best].size) {
          best_segment = &segment;
          best = b;
        }
      }
    }
    if (best_segment == nullptr) {
      const size_t segment_size = block <= kMiB ? kSmallSegment : round_up(block, kSmallSegment);
      uvm_set_thread_tag(pool.tag.c_str());
      uvm_set_thread_backup(pool.backup);
      uvm_set_thread_compression(pool.compressed ? 1 : 0);
      uvm_report_blocks(pool.reported ? 1 : 0);  // per thread models: a process-wide switch, set just before
      uvm_set_thread_exportable(pool.releasable ? 1 : 0);  // its tensors may be shared (share_tensor)
      void* base = pool.releasable ? uvm_malloc_releasable(segment_size, 0, nullptr) : uvm_malloc(segment_size, 0, nullptr);
      uvm_set_thread_tag(nullptr);
      uvm_set_thread_backup(UVM_BACKUP_NONE);
      uvm_set_thread_compression(0);
      uvm_set_thread_exportable(0);
      if (base == nullptr) {
        if (uvm_last_status() != UVM_ERROR_LIMIT_EXCEEDED) fail("a new segment failed");
        return nullptr;
      }
      pool.segments.push_back(Segment{static_cast<unsigned char*>(base), segment_size, {{0, segment_size, false}}});
      best_segment = &pool.segments.back();
      best = 0;
    }
    Block& found = best_segment->blocks[best];
    if (found.size - block >= kBlockAlign) {  // split, as the caching allocator does
      best_segment->blocks.insert(best_segment->blocks.begin() + static_cast<long>(best) + 1,
                                  Block{found.offset + block, found.size - block, false});
    }
    Block& taken = best_segment->blocks[best];
    taken.size = block;
    taken.used = true;
    unsigned char* ptr = best_segment->base + taken.offset;
    expect_ok(uvm_block_allocated(ptr, block), "uvm_block_allocated");
    // Whatever uvm kept of the block's earlier owner (staged or retained) is gone.
    const void* host = nullptr;
    expect_ok(uvm_get_staged_copy(ptr, block, &host), "uvm_get_staged_copy");
    if (host != nullptr) fail("a new block still shows a host copy of its last owner's bytes");
    tensors_.push_back(Tensor{pool_index, ptr, size, block, {}, Held::device});
    return &tensors_.back();
  }

  void free_tensor(size_t index) {
    const Tensor tensor = tensors_[index];
    tensors_.erase(tensors_.begin() + static_cast<long>(index));
    expect_ok(uvm_block_freed(tensor.ptr, tensor.block), "uvm_block_freed");
    for (Segment& segment : pools_[tensor.pool].segments) {
      if (tensor.ptr < segment.base || tensor.ptr >= segment.base + segment.size) continue;
      auto& blocks = segment.blocks;
      for (size_t b = 0; b < blocks.size(); ++b) {
        if (segment.base + blocks[b].offset != tensor.ptr) continue;
        blocks[b].used = false;
        if (b + 1 < blocks.size() && !blocks[b + 1].used) {  // merge with free neighbours
          blocks[b].size += blocks[b + 1].size;
          blocks.erase(blocks.begin() + static_cast<long>(b) + 1);
        }
        if (b > 0 && !blocks[b - 1].used) {
          blocks[b - 1].size += blocks[b].size;
          blocks.erase(blocks.begin() + static_cast<long>(b));
        }
        return;
      }
    }
    fail("the model lost a block");
  }

  // Frees every segment with no block in use (torch.cuda.empty_cache).
  void empty_cache() {
    for (Pool& pool : pools_) {
      for (size_t s = 0; s < pool.segments.size();) {
        Segment& segment = pool.segments[s];
        if (segment.blocks.size() == 1 && !segment.blocks[0].used) {
          uvm_clear_last_error();  // uvm_free returns nothing: its error, if any, is the last one
          uvm_free(segment.base, segment.size, 0, nullptr);
          if (uvm_last_status() != UVM_OK) fail("uvm_free of an empty segment");
          pool.segments.erase(pool.segments.begin() + static_cast<long>(s));
        } else {
          ++s;
        }
      }
    }
  }

  // --- what the program does with its tensors ---

  void write(Tensor& tensor) {
    const auto seed = static_cast<uint32_t>(rng_());
    tensor.shadow.resize(tensor.size);
    for (size_t i = 0; i < tensor.size; ++i) tensor.shadow[i] = pattern(seed, i);
    // A compressed pool's tensors look like bf16 weights (few exponents) but now and then, so that
    // its pauses code some chunks and keep others raw.
    if (pools_[tensor.pool].compressed && seed % 4 != 0) {
      for (size_t i = 1; i < tensor.size; i += 2) tensor.shadow[i] = static_cast<unsigned char>(0x3C + (tensor.shadow[i] & 1));
    }
    std::memcpy(tensor.ptr, tensor.shadow.data(), tensor.size);
    fake::device_wrote(tensor.ptr, tensor.size);  // a kernel's or a copy's write, as far as the driver knows
    tensor.held = Held::device;
    tensor.clean = false;  // a host copy uvm may hold is out of date: the model never drops it now
  }

  // Another process's view of a releasable tensor (uvm_share_export, then uvm_share_import here: the
  // same path, answered by this process's export thread): it reads the tensor's bytes and writes new
  // ones, which the tensor holds after the close; its neighbours are checked with every step. The
  // export is refused, naming why, when bytes of its segment are off the device.
  void share_tensor() {
    std::vector<size_t> shareable;
    for (size_t i = 0; i < tensors_.size(); ++i) {
      if (pools_[tensors_[i].pool].releasable && tensors_[i].held == Held::device) shareable.push_back(i);
    }
    if (shareable.empty()) return note("share: no releasable tensor on the device");
    Tensor& tensor = tensors_[shareable[pick(shareable.size())]];
    std::ostringstream what;
    what << "share the tensor at " << static_cast<const void*>(tensor.ptr);
    note(what.str());
    uvm_share_handle handle{};
    const uvm_status exported = uvm_share_export(tensor.ptr, &handle);
    if (exported != UVM_OK) {
      bool some_away = false;
      for (const Segment& segment : pools_[tensor.pool].segments) {
        if (tensor.ptr < segment.base || tensor.ptr >= segment.base + segment.size) continue;
        for (const Tensor& other : tensors_) {
          const bool inside = other.ptr >= segment.base && other.ptr < segment.base + segment.size;
          if (inside && (other.held == Held::away || other.held == Held::away_garbage)) some_away = true;
        }
      }
      if (!some_away || exported != UVM_ERROR_INVALID_ARGUMENT ||
          std::strstr(uvm_last_error(), "offloaded or paused") == nullptr) {
        return fail("uvm_share_export of a tensor whose segment is all on the device returned " +
                    std::string(uvm_status_string(exported)));
      }
      uvm_clear_last_error();
      ++refused_;
      return;
    }
    void* mapped = nullptr;
    expect_ok(uvm_share_import(&handle, 0, &mapped), "uvm_share_import");
    if (!failure_.empty()) return;
    auto* view = static_cast<unsigned char*>(mapped);
    if (std::memcmp(view, tensor.shadow.data(), tensor.size) != 0) return fail("the imported view differs from the tensor");
    const auto seed = static_cast<uint32_t>(rng_());
    for (size_t i = 0; i < tensor.size; ++i) tensor.shadow[i] = pattern(seed, i);
    std::memcpy(view, tensor.shadow.data(), tensor.size);  // the importer's kernel writes
    fake::device_wrote(tensor.ptr, tensor.size);
    tensor.clean = false;
    expect_ok(uvm_share_close(mapped), "uvm_share_close");
    size_t importers = 0;
    expect_ok(uvm_share_importers(tensor.ptr, nullptr, 0, &importers), "uvm_share_importers");
    if (importers != 0) fail("an importer is counted after its close");
    ++shared_;
  }

  void check(const std::string& when) {
    for (const Tensor& tensor : tensors_) {
      if (tensor.held != Held::device || std::memcmp(tensor.ptr, tensor.shadow.data(), tensor.size) == 0) continue;
      size_t i = 0;
      while (tensor.ptr[i] == tensor.shadow[i]) ++i;
      std::ostringstream out;
      out << when << ": the tensor of " << tensor.size << " bytes at " << static_cast<const void*>(tensor.ptr)
          << " (pool " << pools_[tensor.pool].tag << ") lost byte " << i << ": " << static_cast<int>(tensor.ptr[i])
          << " instead of " << static_cast<int>(tensor.shadow[i]);
      fail(out.str());
      return;
    }
  }

  // A tensor just resumed with its copy retained: a copy uvm_get_staged_copy gives holds what the
  // tensor holds (it was brought back from it). (There is none where the tensor's bytes were in a
  // file, offloaded earlier with UVM_STRATEGY_DISK, or in pieces: test_pause.cpp covers those.)
  void check_retained(const Tensor& tensor) {
    const void* host = nullptr;
    expect_ok(uvm_get_staged_copy(tensor.ptr, tensor.size, &host), "uvm_get_staged_copy");
    if (host != nullptr && std::memcmp(host, tensor.shadow.data(), tensor.size) != 0) {
      fail("a retained copy differs from the bytes it was brought back from");
    }
    retained_checked_ += host != nullptr ? 1 : 0;
  }

  // --- moves ---

  enum class Kind { offload, onload, discard, fetch, drop };

  // Applies what a successful move does to the tensors it covered, an offload's by `strategy`.
  // `retain`: an onload keeps the host copies (a fetch, a resume retaining them).
  static void moved(Tensor& tensor, Kind kind, uvm_strategy strategy = UVM_STRATEGY_AUTO, bool retain = false) {
    if (kind == Kind::discard) {
      tensor.held = Held::garbage;
      tensor.clean = false;
    } else if (kind == Kind::offload) {
      if (tensor.held == Held::device) {
        tensor.held = Held::away;
        tensor.memory_copy = keeps_memory_copy(strategy);
        // A migration leaves a clean copy where it was; a copying offload writes it (staged again).
        tensor.clean = tensor.clean && strategy == UVM_STRATEGY_MIGRATE;
      }
      if (tensor.held == Held::garbage) tensor.held = Held::away_garbage;
    } else if (kind == Kind::drop) {
      if (tensor.held == Held::device) {  // only clean ones are dropped: their copy becomes the staged one
        tensor.held = Held::away;
        tensor.memory_copy = true;
        tensor.clean = false;
      }
    } else {
      const bool fetch = kind == Kind::fetch || retain;
      if (tensor.held == Held::away) {
        tensor.held = Held::device;
        if (tensor.memory_copy) tensor.clean = fetch;  // a copy that came back, kept or gone
      }
      if (tensor.held == Held::away_garbage) tensor.held = Held::garbage;
      tensor.fetched = tensor.fetched || fetch;
    }
  }

  // Whether an offload with `strategy` keeps host copies in memory (uvm allocations always stage
  // where discard is supported, as on this fake: AUTO stages).
  static bool keeps_memory_copy(uvm_strategy strategy) {
    return strategy == UVM_STRATEGY_AUTO || strategy == UVM_STRATEGY_STAGED || strategy == UVM_STRATEGY_MMAP;
  }

  uvm_status issue(Kind kind, const std::vector<uvm_range>& ranges, uvm_strategy strategy) {
    if (ranges.empty()) return UVM_OK;
    switch (kind) {
      case Kind::offload: return uvm_offload_ranges(ranges.data(), ranges.size(), strategy, stream_);
      case Kind::onload: return uvm_onload_ranges(ranges.data(), ranges.size(), stream_);
      case Kind::discard: return uvm_discard_ranges(ranges.data(), ranges.size(), stream_);
      case Kind::fetch: return uvm_fetch_ranges(ranges.data(), ranges.size(), stream_, nullptr);
      case Kind::drop: return uvm_drop_clean_ranges(ranges.data(), ranges.size(), stream_);
    }
    return UVM_ERROR_INTERNAL;
  }

  static const char* name(Kind kind) {
    switch (kind) {
      case Kind::offload: return "offload";
      case Kind::onload: return "onload";
      case Kind::discard: return "discard";
      case Kind::fetch: return "fetch";
      default: return "drop_clean";
    }
  }
  static const char* name(uvm_strategy strategy) {
    switch (strategy) {
      case UVM_STRATEGY_AUTO: return "auto";
      case UVM_STRATEGY_STAGED: return "staged";
      case UVM_STRATEGY_MIGRATE: return "migrate";
      case UVM_STRATEGY_MMAP: return "mmap";
      default: return "disk";
    }
  }

  // A move of the tensors at `chosen` (indices), as uvm.offload(tensors or a module) does: each
  // tensor's whole block.
  void move_tensors(Kind kind, const std::vector<size_t>& chosen, uvm_strategy strategy) {
    std::vector<uvm_range> ranges;
    bool any_releasable = false;
    for (size_t i : chosen) {
      ranges.push_back(uvm_range{tensors_[i].ptr, tensors_[i].block});
      any_releasable = any_releasable || pools_[tensors_[i].pool].releasable;
    }
    const bool refused = kind == Kind::offload && strategy == UVM_STRATEGY_MIGRATE && any_releasable;
    const uvm_status status = refused || ranges.size() < 2 || !chance(30) ? issue(kind, ranges, strategy)
                                                                          : issue_in_slices(kind, ranges, strategy);
    if (refused) {
      if (status != UVM_ERROR_INVALID_ARGUMENT) fail("a migrate of releasable memory was not refused");
      uvm_clear_last_error();
      return;  // refused before anything moved
    }
    expect_ok(status, name(kind));
    for (size_t i : chosen) moved(tensors_[i], kind, strategy);
  }

  // The same move as the shim gives a module's tensors: in slices cut at random, inside one group
  // of moves (uvm_begin_moves) that says it will stage nothing, all of it or half of it. The first
  // failure's status, as the group reports it.
  uvm_status issue_in_slices(Kind kind, const std::vector<uvm_range>& ranges, uvm_strategy strategy) {
    size_t total = 0;
    for (const uvm_range& range : ranges) total += range.size;
    const size_t hint = pick(3) * total / 2;
    note("  in slices, the group expecting " + std::to_string(hint) + " bytes staged");
    ++sliced_;
    expect_ok(uvm_begin_moves(hint), "uvm_begin_moves");
    uvm_status first_failure = UVM_OK;
    for (size_t begin = 0; begin < ranges.size();) {
      const size_t end = begin + 1 + pick(ranges.size() - begin);
      const std::vector<uvm_range> slice(ranges.begin() + begin, ranges.begin() + end);
      const uvm_status status = issue(kind, slice, strategy);
      if (first_failure == UVM_OK) first_failure = status;
      begin = end;
    }
    expect_ok(uvm_end_moves(), "uvm_end_moves");
    return first_failure;
  }

  // Streaming: a drop of tensors whose copy is clean (or already offloaded into host memory, which
  // it skips) must succeed; a drop naming a tensor of which no copy ever existed must be refused
  // before anything moves (the check after the step finds the others' bytes untouched).
  void drop_tensors() {
    std::vector<size_t> droppable, copyless;
    for (size_t i = 0; i < tensors_.size(); ++i) {
      const Tensor& t = tensors_[i];
      if ((t.held == Held::device && t.clean) || (t.held == Held::away && t.memory_copy)) droppable.push_back(i);
      if (t.held == Held::device && !t.fetched) copyless.push_back(i);
    }
    std::vector<size_t> chosen;
    for (size_t i : droppable) {
      if (chance(60)) chosen.push_back(i);
    }
    const bool refuse = !copyless.empty() && chance(25);
    std::ostringstream what;
    what << "drop_clean " << chosen.size() << " tensors" << (refuse ? " and one with no copy:" : ":");
    if (refuse) chosen.push_back(copyless[pick(copyless.size())]);
    for (size_t i : chosen) what << " " << static_cast<const void*>(tensors_[i].ptr);
    note(what.str());
    std::vector<uvm_range> ranges;
    for (size_t i : chosen) ranges.push_back(uvm_range{tensors_[i].ptr, tensors_[i].block});
    if (ranges.empty()) return;
    const uvm_status status = issue(Kind::drop, ranges, UVM_STRATEGY_AUTO);
    if (refuse) {
      if (status != UVM_ERROR_INVALID_ARGUMENT) fail("a drop of bytes with no clean copy was not refused");
      uvm_clear_last_error();
      return;
    }
    expect_ok(status, "drop_clean");
    for (size_t i : chosen) {
      dropped_ += tensors_[i].held == Held::device ? 1 : 0;
      moved(tensors_[i], Kind::drop);
    }
  }

  // How a move of whole pools names them.
  enum class Whole { pool, listed_tag, selected_tag };

  // The selection entries (uvm.offload(tags), uvm.offload(device)): no tags is the whole device.
  uvm_status issue_selection(Kind kind, const std::vector<const char*>& tags, uvm_strategy strategy, size_t* bytes) {
    const char* const* list = tags.empty() ? nullptr : tags.data();
    switch (kind) {
      case Kind::offload: return uvm_offload_selection(0, list, tags.size(), strategy, stream_, bytes);
      case Kind::onload: return uvm_onload_selection(0, list, tags.size(), stream_, bytes);
      default: return uvm_discard_selection(0, list, tags.size(), stream_, bytes);
    }
  }

  // A move of whole pools (every segment, free blocks included): by their segments, by the ranges
  // their tag lists, or by their tag in one call.
  void move_pools(Kind kind, const std::vector<size_t>& pools, uvm_strategy strategy, Whole whole) {
    if (whole == Whole::selected_tag) {
      std::vector<const char*> tags;
      for (size_t p : pools) tags.push_back(pools_[p].tag.c_str());
      move_selected(kind, tags, strategy);
      return;
    }
    const bool by_tag = whole == Whole::listed_tag;
    std::vector<uvm_range> ranges;
    bool any_releasable = false;
    for (size_t p : pools) {
      if (by_tag) {
        size_t count = 0;
        expect_ok(uvm_allocation_ranges(0, pools_[p].tag.c_str(), nullptr, 0, &count), "uvm_allocation_ranges");
        std::vector<uvm_range> found(count);
        expect_ok(uvm_allocation_ranges(0, pools_[p].tag.c_str(), found.data(), count, &count), "uvm_allocation_ranges");
        if (count != pools_[p].segments.size()) fail("the tag lists another number of allocations than the pool has");
        ranges.insert(ranges.end(), found.begin(), found.end());
      } else {
        for (const Segment& segment : pools_[p].segments) ranges.push_back(uvm_range{segment.base, segment.size});
      }
      any_releasable = any_releasable || (pools_[p].releasable && !pools_[p].segments.empty());
    }
    const uvm_status status = issue(kind, ranges, strategy);
    if (kind == Kind::offload && strategy == UVM_STRATEGY_MIGRATE && any_releasable) {
      if (status != UVM_ERROR_INVALID_ARGUMENT) fail("a migrate of a releasable pool was not refused");
      uvm_clear_last_error();
      return;
    }
    expect_ok(status, name(kind));
    for (Tensor& tensor : tensors_) {
      for (size_t p : pools) {
        if (tensor.pool == p) moved(tensor, kind, strategy);
      }
    }
  }

  // One selection call: the pools of `tags` (none: every pool, as the model owns the device),
  // whose segments' bytes it must report.
  void move_selected(Kind kind, const std::vector<const char*>& tags, uvm_strategy strategy) {
    const auto chosen = [&](const Pool& pool) {
      if (tags.empty()) return true;
      for (const char* tag : tags) {
        if (pool.tag == tag) return true;
      }
      return false;
    };
    size_t expected = 0;
    bool any_releasable = false;
    for (const Pool& pool : pools_) {
      if (!chosen(pool)) continue;
      for (const Segment& segment : pool.segments) expected += segment.size;
      any_releasable = any_releasable || (pool.releasable && !pool.segments.empty());
    }
    size_t bytes = 0;
    const uvm_status status = issue_selection(kind, tags, strategy, &bytes);
    if (kind == Kind::offload && strategy == UVM_STRATEGY_MIGRATE && any_releasable) {
      if (status != UVM_ERROR_INVALID_ARGUMENT) fail("a migrate of a releasable pool was not refused");
      uvm_clear_last_error();
      return;
    }
    expect_ok(status, name(kind));
    if (bytes != expected) fail("a selection reported another number of bytes than its pools' segments hold");
    for (Tensor& tensor : tensors_) {
      if (chosen(pools_[tensor.pool])) moved(tensor, kind, strategy);
    }
  }

  uvm_strategy any_strategy() {
    const uvm_strategy strategies[] = {UVM_STRATEGY_AUTO, UVM_STRATEGY_STAGED, UVM_STRATEGY_MIGRATE,
                                       UVM_STRATEGY_MMAP, UVM_STRATEGY_DISK};
    return strategies[pick(5)];
  }

  std::vector<size_t> some_tensors() {
    std::vector<size_t> chosen;
    for (size_t i = 0; i < tensors_.size(); ++i) {
      if (chance(40)) chosen.push_back(i);
    }
    return chosen;
  }

  size_t tensor_size() {
    switch (pick(4)) {
      case 0: return 1 + pick(2000);                               // odd small sizes
      case 1: return kBlockAlign * (1 + pick(64));                 // multiples of 512, packed end to end
      case 2: return 1 + pick(kMiB);                               // the small pool's largest
      default: return kMiB + 1 + pick(kMiB + kMiB / 2);           // large blocks, segments of their own
    }
  }

  void step() {
    std::ostringstream what;
    switch (pick(27)) {
      case 0: case 1: case 2: case 3: {
        const size_t pool = pick(pools_.size());
        const size_t size = tensor_size();
        what << "allocate " << size << " bytes in " << pools_[pool].tag;
        note(what.str());
        if (Tensor* tensor = allocate(pool, size)) write(*tensor);
        break;
      }
      case 4: case 5: {
        if (tensors_.empty()) return step();
        const size_t i = pick(tensors_.size());
        what << "free the tensor at " << static_cast<const void*>(tensors_[i].ptr);
        note(what.str());
        free_tensor(i);
        break;
      }
      case 6: {
        std::vector<size_t> writable;
        for (size_t i = 0; i < tensors_.size(); ++i) {
          if (tensors_[i].held == Held::device || tensors_[i].held == Held::garbage) writable.push_back(i);
        }
        if (writable.empty()) return step();
        const size_t i = writable[pick(writable.size())];
        what << "write the tensor at " << static_cast<const void*>(tensors_[i].ptr);
        note(what.str());
        // Discarded releasable memory may have been given back: a program brings it back (resume)
        // before it touches it, as it must (a kernel would fault; the fake's memory does too).
        if (tensors_[i].held == Held::garbage && pools_[tensors_[i].pool].releasable) {
          const uvm_range range{tensors_[i].ptr, tensors_[i].block};
          expect_ok(uvm_onload_ranges(&range, 1, stream_), "onload before writing");
        }
        if (failure_.empty()) write(tensors_[i]);
        break;
      }
      case 7: case 8: case 9: case 10: {
        const Kind kind = pick(5) == 0 ? Kind::discard : pick(2) ? Kind::offload : Kind::onload;
        const uvm_strategy strategy = any_strategy();
        const std::vector<size_t> chosen = some_tensors();
        what << name(kind) << " (" << name(strategy) << ") " << chosen.size() << " tensors:";
        for (size_t i : chosen) what << " " << static_cast<const void*>(tensors_[i].ptr);
        note(what.str());
        move_tensors(kind, chosen, strategy);
        break;
      }
      case 11: case 12: case 13: {
        const Kind kind = pick(5) == 0 ? Kind::discard : pick(2) ? Kind::offload : Kind::onload;
        const uvm_strategy strategy = any_strategy();
        std::vector<size_t> pools = {pick(pools_.size())};
        const Whole whole = static_cast<Whole>(pick(3));
        const size_t other = pick(pools_.size());
        if (whole == Whole::selected_tag && other != pools[0] && chance(50)) pools.push_back(other);  // one call, two tags
        const char* how[] = {"pool ", "listed tag ", "selected tags "};
        what << name(kind) << " (" << name(strategy) << ") the " << how[static_cast<int>(whole)];
        for (size_t p : pools) what << pools_[p].tag << " ";
        note(what.str());
        move_pools(kind, pools, strategy, whole);
        break;
      }
      case 14: {
        const Kind kind = pick(2) ? Kind::offload : Kind::onload;
        std::vector<size_t> all;
        for (size_t p = 0; p < pools_.size(); ++p) all.push_back(p);
        if (!alone_) {  // another thread's model owns the rest of the device: its own pools only
          what << name(kind) << " every pool of this thread (auto)";
          note(what.str());
          move_pools(kind, all, UVM_STRATEGY_AUTO, Whole::pool);
          break;
        }
        if (pick(2) == 0) {  // uvm.offload(device): one selection call
          what << name(kind) << " the device's selection (auto)";
          note(what.str());
          move_selected(kind, {}, UVM_STRATEGY_AUTO);
          break;
        }
        // Every allocation uvm lists on it, in one call of their ranges.
        what << name(kind) << " everything on the device (auto)";
        note(what.str());
        size_t count = 0;
        expect_ok(uvm_list_allocations(0, nullptr, nullptr, 0, &count), "uvm_list_allocations");
        std::vector<uvm_allocation> listed(count);
        expect_ok(uvm_list_allocations(0, nullptr, listed.data(), count, &count), "uvm_list_allocations");
        size_t segments = 0;
        for (const Pool& pool : pools_) segments += pool.segments.size();
        if (count != segments) fail("the device lists another number of allocations than the pools hold");
        std::vector<uvm_range> ranges;
        for (const uvm_allocation& a : listed) ranges.push_back(uvm_range{a.ptr, a.size});
        expect_ok(issue(kind, ranges, UVM_STRATEGY_AUTO), name(kind));
        for (Tensor& tensor : tensors_) moved(tensor, kind);
        break;
      }
      case 15: case 20: case 21: {
        // memory_saver: uvm_pause keeps the segments made with a backup (offload) and drops the
        // rest (discard), skipping paused ones; uvm_resume brings back what is paused (onload).
        const size_t p = pick(pools_.size());
        Pool& pool = pools_[p];
        const bool pause = pick(2) == 0;
        // A resume may keep the host copies it brings back (retain_cpu_backup): they must hold the
        // bytes as they were, and die with their blocks (checked in allocate).
        const bool retain = !pause && pick(2) == 0;
        what << (pause ? "pause " : retain ? "resume, retaining, " : "resume ") << pool.tag
             << (pool.backup != UVM_BACKUP_NONE ? pool.compressed ? " (compressed backup)" : " (backup)" : "");
        note(what.str());
        expect_ok(uvm_set_retain_backups(retain ? 1 : 0), "uvm_set_retain_backups");
        expect_ok(pause ? uvm_pause(0, pool.tag.c_str()) : uvm_resume(0, pool.tag.c_str()), pause ? "uvm_pause" : "uvm_resume");
        const Kind kind = !pause ? Kind::onload : pool.backup != UVM_BACKUP_NONE ? Kind::offload : Kind::discard;
        const bool copies_kept = pool.backup == UVM_BACKUP_HOST || pool.backup == UVM_BACKUP_MMAP;
        for (Segment& segment : pool.segments) {
          if (segment.paused == pause) continue;  // pause skips what is paused, resume what is not
          segment.paused = pause;
          for (Tensor& tensor : tensors_) {
            if (tensor.pool == p && tensor.ptr >= segment.base && tensor.ptr < segment.base + segment.size) {
              const bool had_bytes = tensor.held == Held::away;
              moved(tensor, kind, pool.backup == UVM_BACKUP_DISK ? UVM_STRATEGY_DISK : UVM_STRATEGY_STAGED, retain);
              if (retain && copies_kept && had_bytes && alone_) check_retained(tensor);
            }
          }
        }
        if (pause && pool.compressed && pool.backup != UVM_BACKUP_NONE) {
          size_t raw = 0;
          expect_ok(uvm_get_compressed_copies(0, pool.tag.c_str(), &raw, nullptr), "uvm_get_compressed_copies");
          compressed_ += raw > 0 ? 1 : 0;
        }
        size_t count = 0;
        expect_ok(uvm_paused_count(0, pool.tag.c_str(), &count), "uvm_paused_count");
        size_t expected = 0;
        for (const Segment& segment : pool.segments) expected += segment.paused ? 1 : 0;
        if (count != expected) fail("uvm_paused_count differs from the segments paused");
        break;
      }
      case 22: case 23: {
        // Streaming: a fetch of some tensors (an onload that keeps the host copies), or a pool's.
        const std::vector<size_t> chosen = some_tensors();
        if (chance(30)) {
          const size_t pool = pick(pools_.size());
          what << "fetch the pool " << pools_[pool].tag;
          note(what.str());
          move_pools(Kind::fetch, {pool}, UVM_STRATEGY_AUTO, Whole::pool);
          break;
        }
        what << "fetch " << chosen.size() << " tensors:";
        for (size_t i : chosen) what << " " << static_cast<const void*>(tensors_[i].ptr);
        note(what.str());
        move_tensors(Kind::fetch, chosen, UVM_STRATEGY_AUTO);
        break;
      }
      case 24: {
        drop_tensors();
        break;
      }
      case 25: {
        share_tensor();
        break;
      }
      case 26: {
        // Pinning ahead for a pool's next pause (uvm_prepare_pause), bounded or not: it moves no
        // byte; a pause after it copies into what it pinned, and in the threaded run a pause or a
        // release beside it stops it.
        const size_t p = pick(pools_.size());
        const size_t bound = pick(2) ? 0 : pick(4) * kSmallSegment;
        what << "prepare the pause of " << pools_[p].tag << ", bound " << bound;
        note(what.str());
        size_t pinned = 0;
        expect_ok(uvm_prepare_pause(0, pools_[p].tag.c_str(), bound, &pinned), "uvm_prepare_pause");
        prepared_ += pinned > 0 ? 1 : 0;
        break;
      }
      case 16: {
        note("release_staging");
        expect_ok(uvm_release_staging(), "uvm_release_staging");
        break;
      }
      case 17: {
        uvm_stats stats{};
        expect_ok(uvm_get_stats(0, &stats), "uvm_get_stats");
        const size_t limit = pick(2) ? 0 : stats.live_bytes + pick(4) * kSmallSegment;
        // Spare memory: released segments keep their physical memory for the next map of their
        // size (the fake fills every map with kFreshPhysical, spare or new).
        const size_t spare_limits[] = {0, 2 * kMiB, 8 * kMiB, 64 * kMiB};
        const size_t spare = spare_limits[pick(4)];
        what << "set_limit " << limit << ", spare limit " << spare;
        note(what.str());
        expect_ok(uvm_set_limit(0, limit), "uvm_set_limit");
        expect_ok(uvm_set_spare_limit(0, spare), "uvm_set_spare_limit");
        break;
      }
      case 18: {
        note("empty_cache");
        empty_cache();
        break;
      }
      default: {
        note("books");
        uvm_residency r{};
        expect_ok(uvm_get_residency(UVM_ANY_DEVICE, nullptr, &r), "uvm_get_residency");
        size_t staged = 0;
        expect_ok(uvm_get_staging(nullptr, &staged), "uvm_get_staging");
        (void)staged;  // another model's thread may stage meanwhile; each sum is checked at teardown
        if (r.device_bytes + r.host_bytes + r.discarded_bytes != r.live_bytes) fail("residency does not add up");
        if (r.staged_bytes > r.host_bytes) fail("more bytes staged than on the host");
        break;
      }
    }
  }

  // Frees everything, as a process that drops its pools: nothing may stay staged or pinned.
  void teardown() {
    note("teardown");
    while (!tensors_.empty()) free_tensor(tensors_.size() - 1);
    empty_cache();
    expect_ok(uvm_set_limit(0, 0), "uvm_set_limit");
    expect_ok(uvm_set_spare_limit(0, 0), "uvm_set_spare_limit");
    uvm_stats stats{};
    expect_ok(uvm_get_stats(0, &stats), "uvm_get_stats");
    // Beside another model, its thread may set a spare limit of its own meanwhile.
    if (alone_ && stats.spare_bytes != 0) fail("spare memory left after the spare limit went to 0");
    if (alone_ && fake::physical_handles() != fake::mapped_reservations()) {
      fail("physical memory neither mapped nor spare was not given back");
    }
    for (const Pool& pool : pools_) {
      uvm_residency r{};
      expect_ok(uvm_get_residency(UVM_ANY_DEVICE, pool.tag.c_str(), &r), "uvm_get_residency");
      if (r.allocations != 0 || r.staged_bytes != 0) fail("a freed pool left allocations or staged bytes");
      uvm_kept_copies kept{};
      expect_ok(uvm_get_kept_copies(UVM_ANY_DEVICE, pool.tag.c_str(), &kept), "uvm_get_kept_copies");
      if (kept.pageable_bytes != 0 || kept.disk_bytes != 0 || kept.disk_files != 0 || kept.retained_bytes != 0) {
        fail("a freed pool left copies in mmap'ed memory, on disk or retained");
      }
    }
  }


 public:
  size_t retained_checked() const { return retained_checked_; }
  size_t dropped() const { return dropped_; }
  size_t sliced() const { return sliced_; }
  size_t shared() const { return shared_; }
  size_t refused() const { return refused_; }
  size_t compressed() const { return compressed_; }
  size_t prepared() const { return prepared_; }

 private:
  std::mt19937_64 rng_;
  uint64_t seed_;
  size_t retained_checked_ = 0;
  size_t dropped_ = 0;  // tensors dropped clean
  size_t sliced_ = 0;   // moves given in slices inside a group of moves
  size_t shared_ = 0;   // tensors read and written through an import
  size_t compressed_ = 0;  // pauses that kept compressed copies
  size_t prepared_ = 0;    // uvm_prepare_pause calls that pinned something
  size_t refused_ = 0;  // exports refused: bytes of the segment off the device
  bool alone_;
  std::vector<Pool> pools_;
  std::vector<Tensor> tensors_;
  cudaStream_t stream_;
  std::vector<std::string> log_;
  std::string last_step_;
  std::string failure_;
};

long env_number(const char* name, long fallback) {
  const char* text = std::getenv(name);
  return text && *text ? std::strtol(text, nullptr, 10) : fallback;
}

// Sets how many backup files a move holds at once while it lives (0: the library's rule).
struct FilesAtOnce {
  explicit FilesAtOnce(size_t most) { uvm::set_files_at_once_for_test(most); }
  ~FilesAtOnce() { uvm::set_files_at_once_for_test(0); }
  FilesAtOnce(const FilesAtOnce&) = delete;
  FilesAtOnce& operator=(const FilesAtOnce&) = delete;
};

// After a sequence (all of its models torn down) no byte may stay staged; every `every` sequences
// (and after the last) release_staging must also leave no pinned memory. Not after each: pinning
// the staging memory again costs more than a sequence.
std::string check_nothing_held(long sequence, long sequences, long every = 25) {
  size_t staged = 1, capacity = 1;
  if (uvm_get_staging(nullptr, &staged) != UVM_OK || staged != 0) return "bytes left staged after the teardown";
  if (!backup_files(test_disk_dir()).empty()) return "disk backup files left after the teardown";
  if ((sequence + 1) % every != 0 && sequence + 1 != sequences) return "";
  if (uvm_release_staging() != UVM_OK) return std::string("release_staging failed: ") + uvm_last_error();
  if (uvm_get_staging(&capacity, nullptr) != UVM_OK || capacity != 0) {
    uvm_staging_info info{};
    uvm_get_staging_info(&info);
    return "pinned memory left after release_staging: " + std::to_string(info.capacity_bytes) + " bytes in " +
           std::to_string(info.blocks) + " blocks, " + std::to_string(info.pinning_bytes) + " not pinned yet";
  }
  return "";
}

}  // namespace

TEST_CASE("random sequences of allocation, reuse and moves keep every tensor's bytes", "[model][cuda13]") {
  const long replay = env_number("UVM_MODEL_SEED", -1);
  const long sequences = replay >= 0 ? 1 : env_number("UVM_MODEL_SEQUENCES", 2000);
  FakeMachine machine;
  test_disk_dir();
  // A model's disk moves have a few files each: UVM_MODEL_FILES_AT_ONCE=1 moves them one file at
  // a time, as a move of more files than a quarter of the descriptor limit would go.
  const FilesAtOnce files_at_once(static_cast<size_t>(env_number("UVM_MODEL_FILES_AT_ONCE", 0)));
  size_t retained = 0, dropped = 0, sliced = 0, shared = 0, refused = 0, compressed = 0, prepared = 0;
  for (long n = 0; n < sequences; ++n) {
    const uint64_t seed = replay >= 0 ? static_cast<uint64_t>(replay) : static_cast<uint64_t>(n);
    Model model(seed, "model", true);
    std::string failure = model.run(kSteps);
    if (failure.empty()) failure = check_nothing_held(n, sequences);
    INFO("sequence " << n << " (seed " << seed << "): " << failure);
    REQUIRE(failure.empty());
    retained += model.retained_checked();
    dropped += model.dropped();
    sliced += model.sliced();
    shared += model.shared();
    refused += model.refused();
    compressed += model.compressed();
    prepared += model.prepared();
  }
  if (sequences >= 200) CHECK(retained > 0);  // the sequences did reach retained copies
  if (sequences >= 200) CHECK(dropped > 0);   // and clean drops
  if (sequences >= 200) CHECK(sliced > 0);    // and moves in slices
  if (sequences >= 200) CHECK(shared > 0);    // and tensors shared
  if (sequences >= 200) CHECK(refused > 0);   // and exports refused
  if (sequences >= 200) CHECK(compressed > 0);  // and compressed pauses
  if (sequences >= 200) CHECK(prepared > 0);    // and pauses prepared ahead
  std::printf("model: %ld sequences of %d steps kept every tensor's bytes (%zu retained copies checked, "
              "%zu tensors dropped clean, %zu moves in slices, %zu tensors shared, %zu exports refused, "
              "%zu compressed pauses, %zu preparations that pinned)\n", sequences, kSteps, retained, dropped, sliced,
              shared, refused, compressed, prepared);
}

TEST_CASE("two threads running random sequences on pools of their own keep every tensor's bytes",
          "[model][threads][cuda13]") {
  const long sequences = env_number("UVM_MODEL_THREADED_SEQUENCES", 100);
  FakeMachine machine;
  test_disk_dir();
  for (long n = 0; n < sequences; ++n) {
    std::string failures[2];
    std::thread second([&] {
      fake::set_thread_context(0);
      Model model(1000000 + static_cast<uint64_t>(n), "second", false);
      failures[1] = model.run(kSteps);
    });
    Model model(2000000 + static_cast<uint64_t>(n), "first", false);
    failures[0] = model.run(kSteps);
    second.join();
    std::string failure = failures[0].empty() ? failures[1] : failures[0];
    if (failure.empty()) failure = check_nothing_held(n, sequences, 5);
    INFO(failure);
    REQUIRE(failure.empty());
  }
  std::printf("model: %ld sequences of %d steps on two threads kept every tensor's bytes\n", sequences, kSteps);
}
