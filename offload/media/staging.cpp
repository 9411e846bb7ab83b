#include "staging.hpp"

#include <algorithm>
#include <thread>

#include "../../alloc/devices.hpp"
#include "../../alloc/registry.hpp"
#include "../../hints/moves/trace.hpp"
#include "copies.hpp"
#include "pinned.hpp"
#include "spill.hpp"

namespace uvm {
namespace {

// Blocks are at least this big, so a model of many small tensors costs one pinned allocation, not one
// per tensor; the first offload of a big model gets one block of its whole size.
constexpr size_t kMinBlockBytes = size_t{256} << 20;
constexpr size_t kHostAlignment = 256;

size_t aligned(size_t bytes) { return (bytes + kHostAlignment - 1) / kHostAlignment * kHostAlignment; }

// Drops the events that have completed, so the list stays short.
void prune(std::vector<EventRef>* events) {
  events->erase(std::remove_if(events->begin(), events->end(),
                               [](const EventRef& e) {
                                 return clear_cuda_error(cudaEventQuery(e->handle)) == cudaSuccess;
                               }),
                events->end());
}

}  // namespace

// First fit, as reserve() places: the bytes no existing block could take.
size_t Staging::unplaced_bytes(const std::vector<Span>& spans, bool pinning_done) const {
  std::vector<size_t> free_bytes;
  for (const auto& block : blocks_) {
    const size_t usable = pinning_done ? pinned_bytes_eventually(block->memory) : pinned_bytes_now(block->memory);
    const size_t used = block->live == 0 ? 0 : block->used;
    free_bytes.push_back(usable > used ? usable - used : 0);
  }
  size_t unplaced = 0;
  for (const Span& span : spans) {
    const size_t need = aligned(span.size());
    auto fits = std::find_if(free_bytes.begin(), free_bytes.end(), [&](size_t bytes) { return bytes >= need; });
    if (fits != free_bytes.end()) *fits -= need;
    else unplaced += need;
  }
  return unplaced;
}

uvm_status Staging::new_block(const Call& call, size_t bytes, bool in_steps, std::shared_ptr<Block>* out) {
  auto block = std::make_shared<Block>();
  PinnedMemory memory;
  clear_cuda_error(cudaGetDevice(&block->device));
  bytes = std::max(kMinBlockBytes, bytes);
  if (in_steps && configured_pinned_kind() == PinnedKind::registered) {
    if (uvm_status s = pin_host_memory_in_steps(call, bytes, block->device, &memory, StepPacing::copies_first)) return s;
  } else {
    HostPhase pinning(Phase::pin);
    if (uvm_status s = pin_host_memory(call, bytes, configured_pinned_kind(), &memory, block->device)) return s;
    pinning.finish(memory.bytes);
  }
  block->memory = memory;
  *out = std::move(block);
  return UVM_OK;
}

uvm_status Staging::ensure_capacity(const Call& call, const std::vector<Span>& spans, bool in_steps, size_t ahead,
                                    std::shared_ptr<StepPinning>* paced, size_t* added) {
  if (added != nullptr) *added = 0;
  std::lock_guard<std::mutex> growing(growth_mutex_);
  size_t missing = 0;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    for (const auto& block : blocks_) {
      if (pinning_failed(block->memory)) step_pinning_failed_ = true;
    }
    missing = unplaced_bytes(spans, true);
    in_steps = in_steps && !step_pinning_failed_;
  }
  if (missing == 0) return UVM_OK;
  std::shared_ptr<Block> block;
  if (uvm_status s = new_block(call, missing + ahead, in_steps, &block)) return s;
  if (paced != nullptr && block->memory.steps) *paced = block->memory.steps;
  if (added != nullptr) *added = block->memory.bytes;
  std::lock_guard<std::mutex> lock(mutex_);
  blocks_.push_back(std::move(block));
  return UVM_OK;
}

std::shared_ptr<char> Staging::lend(const std::shared_ptr<Block>& block, char* host, size_t bytes) {
  block->live += bytes;
  return std::shared_ptr<char>(host, [this, block, bytes](char*) {
    std::lock_guard<std::mutex> lock(mutex_);
    block->live -= bytes;
  });
}

bool Staging::has_room(const std::vector<Span>& spans) const {
  if (spans.empty()) return true;
  std::lock_guard<std::mutex> lock(mutex_);
  return unplaced_bytes(spans, true) == 0;
}

Reservation Staging::reserve_prefix(const std::vector<Span>& spans) {
  Reservation reserved;
  std::lock_guard<std::mutex> lock(mutex_);
  for (auto& block : blocks_) {
    if (block->live == 0) block->used = 0;  // rewind: its readers are waited for below
  }
  std::vector<size_t> usable;
  for (const auto& block : blocks_) usable.push_back(pinned_bytes_now(block->memory));
  auto room = [&](size_t b) { return usable[b] > blocks_[b]->used ? usable[b] - blocks_[b]->used : 0; };
  std::vector<std::shared_ptr<Block>> touched;
  auto place = [&](size_t b, const Span& span) {
    Block& block = *blocks_[b];
    reserved.spans.push_back(span);
    reserved.leases.push_back(lend(blocks_[b], block.memory.host + block.used, span.size()));
    block.used += aligned(span.size());
    if (std::find(touched.begin(), touched.end(), blocks_[b]) == touched.end()) touched.push_back(blocks_[b]);
  };
  // First fit by the whole span, as unplaced_bytes counts: a block pinned in steps takes a span
  // its steps will hold once one of them has room, and gets it part by part.
  auto fits = [&](size_t b, size_t whole) {
    const Block& block = *blocks_[b];
    if (!block.memory.steps) return room(b) >= whole;
    return room(b) > 0 && pinned_bytes_eventually(block.memory) - block.used >= whole;
  };
  for (const Span& span : spans) {
    size_t b = 0;
    while (b < blocks_.size() && !fits(b, aligned(span.size()))) ++b;
    if (b == blocks_.size()) break;
    if (!blocks_[b]->memory.steps) {
      place(b, span);
      continue;
    }
    // Cut where steps end: from the bump pointer to the end of its step, then a step at a time.
    uintptr_t at = span.begin;
    while (at < span.end && room(b) > 0) {
      const size_t to_step_end = kPinStepBytes - blocks_[b]->used % kPinStepBytes;
      const size_t part = std::min({static_cast<size_t>(span.end - at), to_step_end, room(b)});
      place(b, Span{at, at + part});
      at += part;
    }
    if (at < span.end) break;  // the rest waits for the next steps
  }
  for (auto& block : touched) {
    prune(&block->reads);
    reserved.reused.insert(reserved.reused.end(), block->reads.begin(), block->reads.end());
    if (const auto& pinning = block->memory.steps) {
      note_steps_reserved(*pinning, block->used);
      reserved.steps_taken.push_back(StepsTaken{pinning, block->used});
    }
  }
  return reserved;
}

bool Staging::wait_for_pinning() {
  std::shared_ptr<StepPinning> pinning;
  size_t seen = 0;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    for (const auto& block : blocks_) {
      if (!block->memory.steps) continue;
      std::lock_guard<std::mutex> progress(block->memory.steps->mutex);
      if (block->memory.steps->done) continue;
      pinning = block->memory.steps;
      seen = pinning->pinned;
      break;
    }
  }
  if (!pinning) return false;
  HostPhase waiting(Phase::pin);
  std::unique_lock<std::mutex> progress(pinning->mutex);
  pinning->changed.wait(progress, [&] { return pinning->done || pinning->pinned > seen; });
  waiting.finish(pinning->pinned - seen);
  return true;
}

void Staging::note_use(const std::vector<const char*>& hosts, const EventRef& use) {
  if (!use) return;  // complete already
  std::lock_guard<std::mutex> lock(mutex_);
  std::vector<Block*> noted;
  for (const char* host : hosts) {
    const auto block = block_holding(host);
    if (!block || std::find(noted.begin(), noted.end(), block.get()) != noted.end()) continue;
    noted.push_back(block.get());
    prune(&block->reads);
    block->reads.push_back(use);
  }
}

std::shared_ptr<Staging::Block> Staging::block_holding(const char* host) const {
  for (const auto& block : blocks_) {
    if (host >= block->memory.host && host < block->memory.host + block->memory.bytes) return block;
  }
  return nullptr;
}

bool Staging::still_pinning(const Block& block) {
  if (!block.memory.steps) return false;
  std::lock_guard<std::mutex> progress(block.memory.steps->mutex);
  return !block.memory.steps->done;
}

uvm_status Staging::free_block(const Call& call, Block& block) {
  ContextScope scope;
  if (uvm_status s = scope.enter(call, block.device, ContextScope::When::only_if_none_current)) return s;
  for (const EventRef& read : block.reads) {
    if (cudaError_t e = cudaEventSynchronize(read->handle)) return fail_cuda(call, e, "cudaEventSynchronize");
  }
  return unpin_host_memory(call, &block.memory);
}

Staging::RoomClaim::RoomClaim(Staging& store) : store_(store) {
  std::lock_guard<std::mutex> lock(store_.mutex_);
  ++store_.room_claims_;
}

Staging::RoomClaim::~RoomClaim() {
  std::lock_guard<std::mutex> lock(store_.mutex_);
  --store_.room_claims_;
}

uvm_status Staging::free_unused(const Call& call) {
  wait_for_background_free();
  return free_unused_now(call);
}

size_t Staging::unused_step_bytes(const Block& block) {
  const PinnedMemory& memory = block.memory;
  if (!memory.steps || block.live == 0) return 0;  // a block holding nothing is freed whole
  {
    std::lock_guard<std::mutex> progress(memory.steps->mutex);
    if (!memory.steps->done || !memory.steps->failure.empty() || memory.steps->stop) return 0;
  }
  const size_t kept = (block.used + kPinStepBytes - 1) / kPinStepBytes * kPinStepBytes;
  return memory.bytes > kept ? memory.bytes - kept : 0;
}

uvm_status Staging::trim_steps(const Call& call) {
  struct Tail {
    char* host;
    size_t bytes;
    int device;
    std::vector<EventRef> reads;
  };
  std::vector<Tail> tails;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    if (room_claims_ > 0) return UVM_OK;  // an offload is about to fill the room
    for (auto& block : blocks_) {
      const size_t cut = unused_step_bytes(*block);
      if (cut == 0) continue;
      PinnedMemory& memory = block->memory;
      memory.bytes -= cut;  // a multiple of kPinStepBytes: the tail starts where a step does
      {
        std::lock_guard<std::mutex> progress(memory.steps->mutex);
        memory.steps->pinned = memory.bytes;
      }
      prune(&block->reads);
      tails.push_back(Tail{memory.host + memory.bytes, cut, block->device, block->reads});
    }
  }
  uvm_status status = UVM_OK;
  for (const Tail& tail : tails) {
    ContextScope scope;
    uvm_status s = scope.enter(call, tail.device, ContextScope::When::only_if_none_current);
    for (size_t i = 0; s == UVM_OK && i < tail.reads.size(); ++i) {
      if (cudaError_t e = cudaEventSynchronize(tail.reads[i]->handle)) s = fail_cuda(call, e, "cudaEventSynchronize");
    }
    size_t given_back = 0;
    if (s == UVM_OK) s = unpin_steps(call, tail.host, tail.bytes, &given_back);
    if (s != UVM_OK) keep_as_block(tail.host + given_back, tail.bytes - given_back, tail.device, tail.reads);
    if (status == UVM_OK) status = s;
  }
  return status;
}

void Staging::keep_as_block(char* host, size_t bytes, int device, std::vector<EventRef> reads) {
  auto block = std::make_shared<Block>();
  block->memory.host = host;
  block->memory.bytes = bytes;
  block->memory.kind = PinnedKind::registered;
  block->memory.steps = std::make_shared<StepPinning>();
  block->memory.steps->pinned = bytes;
  block->memory.steps->done = true;
  block->device = device;
  block->reads = std::move(reads);
  std::lock_guard<std::mutex> lock(mutex_);
  blocks_.push_back(std::move(block));
}

std::vector<std::shared_ptr<StepPinning>> Staging::stop_unused_pinnings() {
  std::vector<std::shared_ptr<StepPinning>> stopped;
  std::lock_guard<std::mutex> lock(mutex_);
  if (room_claims_ > 0) return stopped;  // an offload is about to take the room
  for (const auto& block : blocks_) {
    if (block->live != 0 || !still_pinning(*block)) continue;
    stop_pinning(*block->memory.steps);
    stopped.push_back(block->memory.steps);
  }
  return stopped;
}

uvm_status Staging::free_unused_now(const Call& call) {
  const uvm_status trimmed = trim_steps(call);
  std::vector<std::shared_ptr<Block>> unused;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    if (room_claims_ > 0) return trimmed;  // an offload is about to fill the empty blocks
    // An unused block still being pinned in steps (uvm_prepare_pause's) stays until its pinning has
    // ended: freeing it would wait for it (stop_unused_pinnings ends it soon).
    auto holding = std::stable_partition(blocks_.begin(), blocks_.end(),
                                         [](const auto& b) { return b->live != 0 || still_pinning(*b); });
    unused.assign(holding, blocks_.end());
    blocks_.erase(holding, blocks_.end());
  }
  uvm_status status = UVM_OK;
  std::vector<std::shared_ptr<Block>> kept;
  for (const auto& block : unused) {
    if (status == UVM_OK) status = free_block(call, *block);
    if (status != UVM_OK) kept.push_back(block);  // that one and the rest: the next call tries again
  }
  std::lock_guard<std::mutex> lock(mutex_);
  blocks_.insert(blocks_.end(), kept.begin(), kept.end());
  return trimmed != UVM_OK ? trimmed : status;
}

void Staging::free_unused_in_background() {
  {
    std::lock_guard<std::mutex> lock(mutex_);
    const bool any_to_free = std::any_of(blocks_.begin(), blocks_.end(), [](const auto& b) {
      return b->live == 0 || unused_step_bytes(*b) != 0;
    });
    if (!any_to_free) return;
    ++background_frees_asked_;
    if (freeing_in_background_) {  // the running thread frees once more: these blocks may have emptied after its look
      free_again_ = true;
      return;
    }
    freeing_in_background_ = true;
  }
  // A failure keeps the block, as free_unused does; the next offload or uvm_release_staging tries again.
  std::thread([this] {
    for (;;) {
      (void)free_unused_now(Call::of("uvm_release_staging (in the background)"));
      std::lock_guard<std::mutex> lock(mutex_);
      if (!free_again_) {
        freeing_in_background_ = false;
        background_done_.notify_all();
        return;
      }
      free_again_ = false;
    }
  }).detach();
}

size_t Staging::capacity_bytes() const {
  std::lock_guard<std::mutex> lock(mutex_);
  size_t total = 0;
  for (const auto& block : blocks_) total += block->memory.bytes;
  return total;
}

void Staging::wait_for_background_free() {
  std::unique_lock<std::mutex> lock(mutex_);
  background_done_.wait(lock, [&] { return !freeing_in_background_; });
}

uint64_t Staging::background_frees_asked() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return background_frees_asked_;
}

uvm_staging_info Staging::info() const {
  uvm_staging_info info{};
  std::lock_guard<std::mutex> lock(mutex_);
  for (const auto& block : blocks_) {
    const PinnedMemory& memory = block->memory;
    info.capacity_bytes += memory.bytes;
    ++info.blocks;
    switch (memory.kind) {
      case PinnedKind::registered:
        info.registered_bytes += memory.bytes;
        info.pinning_bytes += memory.bytes - pinned_bytes_now(memory);
        break;
      case PinnedKind::host_alloc:
        info.host_alloc_bytes += memory.bytes;
        break;
      case PinnedKind::pageable:
        info.pageable_bytes += memory.bytes;
        break;
    }
  }
  info.configured_kind = static_cast<int>(configured_pinned_kind());
  return info;
}

bool Staging::one_registration(const char* host, size_t bytes) const {
  std::lock_guard<std::mutex> lock(mutex_);
  const auto block = block_holding(host);
  if (!block || bytes == 0) return false;
  const size_t offset = static_cast<size_t>(host - block->memory.host);
  if (offset + bytes > block->memory.bytes) return false;
  return !block->memory.steps || offset / kPinStepBytes == (offset + bytes - 1) / kPinStepBytes;
}

Staging& staging() {
  static Staging* instance = new Staging();
  return *instance;
}

}  // namespace uvm

extern "C" {

uvm_status uvm_get_staging(size_t* capacity_bytes, size_t* staged_bytes) {
  const uvm::Call call = uvm::Call::of("uvm_get_staging");
  return uvm::guarded(call, [&] {
    if (capacity_bytes) *capacity_bytes = uvm::staging().capacity_bytes();
    if (staged_bytes) *staged_bytes = uvm::staged_copy_bytes();
    return UVM_OK;
  });
}

uvm_status uvm_get_staging_info(uvm_staging_info* info) {
  const uvm::Call call = uvm::Call::of("uvm_get_staging_info");
  return uvm::guarded(call, [&] {
    if (info == nullptr) return uvm::fail(call, UVM_ERROR_INVALID_ARGUMENT, "info is NULL");
    if (uvm_status s = uvm::check_options(call)) return s;
    *info = uvm::staging().info();
    info->staged_bytes = uvm::staged_copy_bytes();
    return UVM_OK;
  });
}

uvm_status uvm_reserve_staging(size_t bytes) {
  const uvm::Call call = uvm::Call::of("uvm_reserve_staging").with_size(bytes);
  return uvm::guarded(call, [&] {
    if (uvm_status s = uvm::check_options(call)) return s;
    if (bytes == 0) return UVM_OK;
    return uvm::staging().ensure_capacity(call, {uvm::Span{0, bytes}});
  });
}

uvm_status uvm_release_staging(void) {
  const uvm::Call call = uvm::Call::of("uvm_release_staging");
  uvm::note_staging_released();
  // The steps in flight end first (one registration each, at most 256 MiB), so that what they
  // pinned goes back with the rest before this returns.
  for (const auto& pinning : uvm::staging().stop_unused_pinnings()) uvm::wait_for_pinning_end(*pinning);
  // Takes no moves lock: the blocks it frees hold nothing staged, so no onload reads them, and
  // they leave the store before any offload could reserve them again.
  return uvm::guarded(call, [&] {
    const uvm_status staging = uvm::staging().free_unused(call);
    const uvm_status bounce = uvm::free_bounce_buffers(call);
    return staging != UVM_OK ? staging : bounce;
  });
}

uvm_status uvm_release_staging_async(void) {
  const uvm::Call call = uvm::Call::of("uvm_release_staging_async");
  uvm::note_staging_released();
  uvm::staging().stop_unused_pinnings();  // a block stopped mid-step goes at the next release
  return uvm::guarded(call, [&] {
    uvm::staging().free_unused_in_background();
    return uvm::free_bounce_buffers(call);
  });
}

}  // extern "C"
