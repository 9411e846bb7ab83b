// Devices: how many there are, what each can do (probed once, cached), and a scope that makes a
// device's primary context current and afterwards restores exactly what the caller had.
#pragma once

#include <cstddef>

#include "errors.hpp"

namespace uvm {

constexpr int kMaxDevices = 64;

struct DeviceCaps {
  bool managed_memory = false;
  bool concurrent_managed_access = false;
  bool pageable_memory_access = false;
  bool discard_supported = false;
  size_t total_memory = 0;
};

// Number of CUDA devices, probed once per process (the set cannot change after CUDA starts).
uvm_status device_count(const Call& call, int* count);

// OK if 0 <= device < count (or device is UVM_LOCATION_CPU and allow_cpu); else records why.
uvm_status check_device(const Call& call, int device, bool allow_cpu);

// The device's capabilities, probed once with attribute queries (no context is created).
uvm_status device_caps(const Call& call, int device, DeviceCaps* caps);

// Makes `device`'s primary context current until the scope ends, then restores the caller's exact
// context (including "none"), through the driver API so that the runtime's selected device is never
// changed and no context is created on any other device. Falls back to cudaSetDevice if the driver
// entry points cannot be had.
class ContextScope {
 public:
  enum class When { always, only_if_none_current };

  ContextScope() = default;
  ContextScope(const ContextScope&) = delete;
  ContextScope& operator=(const ContextScope&) = delete;
  ~ContextScope();

  uvm_status enter(const Call& call, int device, When when);

 private:
  bool switched_ = false;
  bool used_runtime_fallback_ = false;
  void* saved_context_ = nullptr;
  int saved_device_ = 0;
};

}  // namespace uvm
