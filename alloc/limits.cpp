#include "limits.hpp"

#include <atomic>
#include <limits>

#include "devices.hpp"

namespace uvm {
namespace {

constexpr size_t kUseDefault = 0;

std::atomic<size_t>* explicit_limits() {
  static auto* limits = new std::atomic<size_t>[kMaxDevices]();
  return limits;
}

}  // namespace

size_t default_limit(const Options& options, size_t total_memory) {
  if (options.limit_bytes != 0) return options.limit_bytes;
  if (options.limit_fraction == 0) return total_memory;
  const double bytes = options.limit_fraction * static_cast<double>(total_memory);
  return bytes >= static_cast<double>(std::numeric_limits<size_t>::max()) ? std::numeric_limits<size_t>::max()
                                                                           : static_cast<size_t>(bytes);
}

uvm_status effective_limit(const Call& call, int device, size_t* limit) {
  const size_t explicit_limit = explicit_limits()[device].load(std::memory_order_acquire);
  if (explicit_limit != kUseDefault) {
    *limit = explicit_limit;
    return UVM_OK;
  }
  DeviceCaps caps;
  if (uvm_status s = device_caps(call, device, &caps)) return s;
  if (uvm_status s = check_options(call)) return s;
  *limit = default_limit(options(), caps.total_memory);
  return UVM_OK;
}

}  // namespace uvm

extern "C" {

uvm_status uvm_set_limit(int device, size_t bytes) {
  const uvm::Call call = uvm::Call::of("uvm_set_limit").with_size(bytes).with_device(device);
  return uvm::guarded(call, [&] {
    if (uvm_status s = uvm::check_device(call, device, false)) return s;
    uvm::explicit_limits()[device].store(bytes, std::memory_order_release);
    return UVM_OK;
  });
}

uvm_status uvm_get_limit(int device, size_t* bytes) {
  const uvm::Call call = uvm::Call::of("uvm_get_limit").with_device(device);
  return uvm::guarded(call, [&] {
    if (bytes == nullptr) return uvm::fail(call, UVM_ERROR_INVALID_ARGUMENT, "bytes is NULL");
    if (uvm_status s = uvm::check_device(call, device, false)) return s;
    return uvm::effective_limit(call, device, bytes);
  });
}

}  // extern "C"
