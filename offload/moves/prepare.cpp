// uvm_prepare_pause: the pinned staging memory a first pause will copy into, pinned ahead of it (at
// model load), so that the first pause runs as fast as the later ones. Pinning 8 GiB takes a second
// or more (docs/measurements.md, "The first offload"); the pause that pins for itself pays it, and a
// node's ranks pinning at once share the host's page-fault rate.
#include <algorithm>
#include <atomic>
#include <cstdint>
#include <mutex>
#include <set>
#include <vector>

#include "../../alloc/devices.hpp"
#include "../../alloc/registry.hpp"
#include "../coder/codec.hpp"
#include "../media/coded.hpp"
#include "../media/copies.hpp"
#include "../media/plan.hpp"
#include "../media/staging.hpp"
#include "prepare.hpp"

namespace uvm {
namespace {

// Pinned in batches of about this much (a staging block's least size), each block in steps of
// kPinStepBytes on a thread of its own (an allocation larger than a batch, a 40 GiB pool segment, is
// one block): uvm_release_staging stops a preparation after the step in flight, and a pause that
// comes meanwhile copies into the steps pinned so far while the rest is pinned.
constexpr size_t kBatchBytes = size_t{256} << 20;

// uvm_release_staging's count: a preparation that sees it change stops after its batch.
std::atomic<uint64_t> releases{0};

// Whether two selections can take the same allocation (the narrower fields of a pause's are left
// out: a preparation stops for any pause of its tags and devices).
bool overlap(const Selection& a, const Selection& b) {
  if (a.device != UVM_ANY_DEVICE && b.device != UVM_ANY_DEVICE && a.device != b.device) return false;
  if (a.any_tag || b.any_tag) return true;
  return std::any_of(a.tags.begin(), a.tags.end(),
                     [&](TagId tag) { return std::find(b.tags.begin(), b.tags.end(), tag) != b.tags.end(); });
}

// The pauses (PauseUnderway) and preparations under way, each with its selection.
struct Underway {
  std::mutex mutex;
  std::vector<const Selection*> pauses;
  struct Preparing {
    const Selection* selection;
    std::atomic<bool>* paused_meanwhile;
  };
  std::vector<Preparing> preparations;
};
Underway& underway() {
  static auto* all = new Underway();  // never destroyed: no code runs from static destructors
  return *all;
}

// One preparation, known to pauses for as long as it lives.
class Preparation {
 public:
  explicit Preparation(const Selection& selection) : selection_(selection) {
    std::lock_guard<std::mutex> lock(underway().mutex);
    for (const Selection* pause : underway().pauses) {
      if (overlap(*pause, selection_)) paused_meanwhile_ = true;
    }
    underway().preparations.push_back({&selection_, &paused_meanwhile_});
  }
  ~Preparation() {
    std::lock_guard<std::mutex> lock(underway().mutex);
    auto& all = underway().preparations;
    all.erase(std::remove_if(all.begin(), all.end(), [&](const auto& p) { return p.selection == &selection_; }),
              all.end());
  }
  Preparation(const Preparation&) = delete;
  Preparation& operator=(const Preparation&) = delete;
  // Whether a pause of its allocations is under way, or began since it did.
  bool pause_came() const { return paused_meanwhile_.load(); }

 private:
  const Selection& selection_;
  std::atomic<bool> paused_meanwhile_{false};
};

// The pinned bytes a compressed copy of `bytes` takes, as bf16 weights code (0.72 of them): whole
// chunks coded, the tail kept raw. Data that codes worse makes its pause pin the rest itself.
size_t coded_estimate(size_t bytes) {
  return codec::chunks_in(bytes) * codec::kCodedBytes + bytes % codec::kChunkBytes;
}

// What a pause of `selection` would stage in pinned memory now, in the order it stages it: the
// pieces of each allocation kept in host memory that is on its device and holds no copy (a retained
// one is written again in place), without its free space (blocks its runtime reported free are
// dropped, not copied); a compressed allocation's pieces at the size they code to. `*device`: the
// first one's device.
std::vector<Span> spans_to_stage(const Selection& selection, int* device) {
  Selection kept = selection;
  kept.backup = UVM_BACKUP_HOST;
  kept.paused = false;
  std::vector<Span> spans;
  for (const AllocationView& found : registry().select(kept)) {
    const uintptr_t end = found.base + found.size;
    if (!staged_copies(found.base, end).empty() || !retained_copies(found.base, end).empty()) continue;
    const RangeSplit split = split_range(Span{found.base, end}, {}, registry().free_space(found.base, found.base, end));
    for (const Span& piece : split.rest) {
      if (spans.empty()) *device = found.device;
      spans.push_back(found.compressed ? Span{piece.begin, piece.begin + coded_estimate(piece.size())} : piece);
    }
  }
  return spans;
}

// The coder's kernels on each device where `selection` has compressed allocations not paused: the
// driver compiles their PTX when they first load, which a first compressed pause would wait for.
// Where they cannot load, coder_usable says why, once, and the pause keeps plain copies.
uvm_status load_coder_ahead(const Call& call, const Selection& selection) {
  Selection compressed = selection;
  compressed.compressed = true;
  compressed.paused = false;
  std::set<int> devices;
  for (const AllocationView& found : registry().select(compressed)) devices.insert(found.device);
  for (int on : devices) {
    ContextScope scope;
    if (uvm_status s = scope.enter(call, on, ContextScope::When::always)) return s;
    coder_usable(on);
  }
  return UVM_OK;
}

// Takes none of the steps of the block it made (its pacing ends: nothing copies into them here), and
// waits until every step is pinned or uvm_release_staging stopped the pinning. A pause that reserves
// steps meanwhile paces it with its copies.
void wait_until_pinned(StepPinning& steps) {
  end_pacing(steps);
  wait_for_pinning_end(steps);
}

uvm_status prepare_pause(const Call& call, int device, const char* tag, size_t max_bytes, size_t* pinned) {
  if (pinned != nullptr) *pinned = 0;
  if (uvm_status s = check_options(call)) return s;
  Selection selection;
  if (uvm_status s = select_arguments(call, device, tag, &selection)) return s;
  if (uvm_status s = load_coder_ahead(call, selection)) return s;
  const Preparation preparation(selection);
  const uint64_t asked_at = releases.load();
  const size_t before = staging().capacity_bytes();
  size_t added = 0;  // by this call's own blocks (a free meanwhile changes the capacity too)
  // The bound, in bytes of allocations: what the room held now (not holding copies) takes, plus
  // `max_bytes` of new blocks.
  const size_t room_now = before - std::min(before, staged_copy_bytes());
  const size_t limit = max_bytes == 0 ? SIZE_MAX : room_now + max_bytes;
  for (size_t reach = kBatchBytes;; reach += kBatchBytes) {
    if (releases.load() != asked_at) break;  // uvm_release_staging: stop here
    if (preparation.pause_came()) break;       // the pause pins what it still needs
    int on = 0;
    // Asked again each batch: a pause meanwhile has staged its allocations (they hold copies now).
    std::vector<Span> spans = spans_to_stage(selection, &on);
    const size_t all = spans.size();
    size_t total = 0, count = 0;
    bool bounded = false;
    while (count < all && total < reach) {
      if (total + spans[count].size() > limit) {
        bounded = true;
        break;
      }
      total += spans[count++].size();
    }
    spans.resize(count);
    if (!spans.empty()) {
      ContextScope scope;  // pinned for every device, from the context of the allocations' device
      if (uvm_status s = scope.enter(call, on, ContextScope::When::always)) return s;
      size_t block = 0;
      std::shared_ptr<StepPinning> steps;
      const uvm_status s = staging().ensure_capacity(call, spans, true, 0, &steps, &block);
      added += block;
      if (pinned != nullptr) *pinned = added;
      if (s != UVM_OK) return s;
      if (steps) wait_until_pinned(*steps);
    }
    if (bounded || count == all) break;
  }
  if (releases.load() != asked_at) {
    // uvm_release_staging came while a batch was being pinned, and may have returned before it
    // ended: what this call pinned and nothing holds goes back now, so none stays after both return.
    if (uvm_status s = staging().free_unused(call)) return s;
  }
  if (pinned != nullptr) *pinned = added;
  return UVM_OK;
}

}  // namespace

void note_staging_released() { releases.fetch_add(1); }

PauseUnderway::PauseUnderway(const Selection& selection) : selection_(selection) {
  std::lock_guard<std::mutex> lock(underway().mutex);
  underway().pauses.push_back(&selection_);
  for (const auto& preparing : underway().preparations) {
    if (overlap(*preparing.selection, selection_)) *preparing.paused_meanwhile = true;
  }
}

PauseUnderway::~PauseUnderway() {
  std::lock_guard<std::mutex> lock(underway().mutex);
  auto& pauses = underway().pauses;
  pauses.erase(std::find(pauses.begin(), pauses.end(), &selection_));
}

}  // namespace uvm

extern "C" uvm_status uvm_prepare_pause(int device, const char* tag, size_t max_bytes, size_t* pinned) {
  const uvm::Call call = uvm::Call::of("uvm_prepare_pause").with_selection(device).with_tag(tag).with_size(max_bytes);
  return uvm::guarded(call, [&] { return uvm::prepare_pause(call, device, tag, max_bytes, pinned); });
}
