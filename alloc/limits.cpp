#include "limits.hpp"

#include <atomic>
#include <cerrno>
#include <cmath>
#include <cstdlib>
#include <limits>

#include "devices.hpp"

namespace uvm {
namespace {

constexpr size_t kUseDefault = 0;

std::atomic<size_t>* explicit_limits() {
  static auto* limits = new std::atomic<size_t>[kMaxDevices]();
  return limits;
}

bool parse_bytes(const char* text, size_t* bytes) {
  errno = 0;
  char* end = nullptr;
  const unsigned long long value = std::strtoull(text, &end, 10);
  if (end == text || errno == ERANGE || *text == '-') return false;
  unsigned shift = 0;
  switch (*end) {
    case '\0': break;
    case 'K': case 'k': shift = 10; ++end; break;
    case 'M': case 'm': shift = 20; ++end; break;
    case 'G': case 'g': shift = 30; ++end; break;
    case 'T': case 't': shift = 40; ++end; break;
    default: return false;
  }
  if (*end == 'i' && shift) ++end;   // accept "GiB" as well as "G"
  if ((*end == 'B' || *end == 'b') && shift) ++end;
  if (*end != '\0') return false;
  if (value > (std::numeric_limits<size_t>::max() >> shift)) return false;
  *bytes = static_cast<size_t>(value) << shift;
  return *bytes > 0;
}

}  // namespace

bool parse_limit_env(const char* bytes_text, const char* fraction_text, size_t total_memory,
                     size_t* limit, std::string* why) {
  const bool has_bytes = bytes_text != nullptr && *bytes_text != '\0';
  const bool has_fraction = fraction_text != nullptr && *fraction_text != '\0';
  if (has_bytes && has_fraction) {
    *why = "set only one of UVM_LIMIT_BYTES and UVM_LIMIT_FRACTION";
    return false;
  }
  if (has_bytes) {
    if (!parse_bytes(bytes_text, limit)) {
      *why = std::string("UVM_LIMIT_BYTES='") + bytes_text +
             "' is not a byte count > 0 (e.g. 68719476736 or 64G)";
      return false;
    }
    return true;
  }
  if (has_fraction) {
    char* end = nullptr;
    const double fraction = std::strtod(fraction_text, &end);
    if (end == fraction_text || *end != '\0' || !(fraction > 0) || !std::isfinite(fraction)) {
      *why = std::string("UVM_LIMIT_FRACTION='") + fraction_text +
             "' is not a number > 0 (e.g. 0.5; above 1 oversubscribes)";
      return false;
    }
    const double bytes = fraction * static_cast<double>(total_memory);
    *limit = bytes >= static_cast<double>(std::numeric_limits<size_t>::max())
                 ? std::numeric_limits<size_t>::max()
                 : static_cast<size_t>(bytes);
    return true;
  }
  *limit = total_memory;
  return true;
}

uvm_status effective_limit(const Call& call, int device, size_t* limit) {
  const size_t explicit_limit = explicit_limits()[device].load(std::memory_order_acquire);
  if (explicit_limit != kUseDefault) {
    *limit = explicit_limit;
    return UVM_OK;
  }
  DeviceCaps caps;
  if (uvm_status s = device_caps(call, device, &caps)) return s;
  std::string why;
  if (!parse_limit_env(std::getenv("UVM_LIMIT_BYTES"), std::getenv("UVM_LIMIT_FRACTION"),
                       caps.total_memory, limit, &why)) {
    return fail(call, UVM_ERROR_INVALID_ARGUMENT, "%s", why.c_str());
  }
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
