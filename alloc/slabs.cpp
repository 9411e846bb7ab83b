#include "slabs.hpp"

#include <cuda_runtime_api.h>

#include "options.hpp"

#include <bitset>
#include <map>
#include <mutex>

namespace uvm {
namespace {

struct Slab {
  int device = 0;
  std::bitset<kSlotsPerSlab> used;     // handed out
  std::bitset<kSlotsPerSlab> retired;  // given back, but not to be handed out again (see give_back_slot)
};

struct Slabs {
  std::mutex mutex;
  std::map<uintptr_t, Slab> by_base;
  std::map<uintptr_t, Slab> closing;  // emptied, being freed: handed no slot until close_slab says how it went
};

Slabs& slabs() {
  static Slabs* instance = new Slabs();  // never destroyed: no CUDA calls from static destructors
  return *instance;
}

}  // namespace

bool slab_serves(size_t size) { return options().slabs && size == kSlotBytes; }

uvm_status take_slot(const Call& call, int device, void** slot, uintptr_t* slab) {
  Slabs& all = slabs();
  std::lock_guard<std::mutex> lock(all.mutex);
  for (auto& [base, found] : all.by_base) {
    if (found.device != device) continue;
    const auto free_slots = ~(found.used | found.retired);
    if (free_slots.none()) continue;
    size_t index = 0;
    while (!free_slots.test(index)) ++index;
    found.used.set(index);
    *slot = reinterpret_cast<void*>(base + index * kSlotBytes);
    *slab = base;
    return UVM_OK;
  }
  void* memory = nullptr;
  if (cudaError_t e = cudaMallocManaged(&memory, kSlotBytes * kSlotsPerSlab, cudaMemAttachGlobal)) {
    return fail_cuda(call, e, "cudaMallocManaged(%zu bytes: a slab of %zu small-tensor segments)",
                     kSlotBytes * kSlotsPerSlab, kSlotsPerSlab);
  }
  Slab fresh;
  fresh.device = device;
  fresh.used.set(0);
  const auto base = reinterpret_cast<uintptr_t>(memory);
  all.by_base[base] = fresh;
  *slot = memory;
  *slab = base;
  return UVM_OK;
}

uvm_status give_back_slot(const Call& call, uintptr_t slab, void* ptr, bool reusable, bool* emptied) {
  *emptied = false;
  Slabs& all = slabs();
  std::lock_guard<std::mutex> lock(all.mutex);
  auto it = all.by_base.find(slab);
  const size_t index = (reinterpret_cast<uintptr_t>(ptr) - slab) / kSlotBytes;
  if (it == all.by_base.end() || index >= kSlotsPerSlab || !it->second.used.test(index)) {
    return fail(call, UVM_ERROR_INTERNAL, "slot %p is not in use in the slab at %p", ptr, reinterpret_cast<void*>(slab));
  }
  Slab& found = it->second;
  found.used.reset(index);
  if (!reusable) found.retired.set(index);
  if (found.used.none()) {
    all.closing.insert(all.by_base.extract(it));
    *emptied = true;
  }
  return UVM_OK;
}

void close_slab(uintptr_t slab, bool freed) {
  Slabs& all = slabs();
  std::lock_guard<std::mutex> lock(all.mutex);
  auto it = all.closing.find(slab);
  if (it == all.closing.end()) return;
  if (freed) all.closing.erase(it);
  else all.by_base.insert(all.closing.extract(it));
}

size_t live_slabs() {
  Slabs& all = slabs();
  std::lock_guard<std::mutex> lock(all.mutex);
  return all.by_base.size() + all.closing.size();
}

}  // namespace uvm
