#include "default_advice.hpp"

#include <strings.h>

#include <atomic>
#include <cstdlib>

namespace uvm {
namespace {

constexpr int kNotChosen = -1;
std::atomic<int> chosen_mode{kNotChosen};

}  // namespace

bool parse_advice_mode(const char* text, uvm_advice_mode* mode) {
  if (text == nullptr) return false;
  if (strcasecmp(text, "device") == 0) *mode = UVM_ADVICE_DEVICE;
  else if (strcasecmp(text, "host") == 0) *mode = UVM_ADVICE_HOST;
  else if (strcasecmp(text, "none") == 0) *mode = UVM_ADVICE_NONE;
  else return false;
  return true;
}

uvm_status default_advice(const Call& call, uvm_advice_mode* mode) {
  const int chosen = chosen_mode.load(std::memory_order_acquire);
  if (chosen != kNotChosen) {
    *mode = static_cast<uvm_advice_mode>(chosen);
    return UVM_OK;
  }
  const char* text = std::getenv("UVM_DEFAULT_ADVICE");
  if (text == nullptr || *text == '\0') {
    *mode = UVM_ADVICE_DEVICE;
    return UVM_OK;
  }
  if (!parse_advice_mode(text, mode)) {
    return fail(call, UVM_ERROR_INVALID_ARGUMENT,
                "UVM_DEFAULT_ADVICE='%s' is not one of device, host, none", text);
  }
  return UVM_OK;
}

}  // namespace uvm

extern "C" {

uvm_status uvm_set_default_advice(uvm_advice_mode mode) {
  const uvm::Call call = uvm::Call::of("uvm_set_default_advice");
  const int raw = uvm::raw_enum(mode);
  if (raw != UVM_ADVICE_DEVICE && raw != UVM_ADVICE_HOST && raw != UVM_ADVICE_NONE) {
    return uvm::fail(call, UVM_ERROR_INVALID_ARGUMENT,
                     "mode %d is not UVM_ADVICE_DEVICE, UVM_ADVICE_HOST or UVM_ADVICE_NONE", raw);
  }
  uvm::chosen_mode.store(raw, std::memory_order_release);
  return UVM_OK;
}

uvm_advice_mode uvm_get_default_advice(void) {
  uvm_advice_mode mode = UVM_ADVICE_DEVICE;
  (void)uvm::default_advice(uvm::Call::of("uvm_get_default_advice"), &mode);
  return mode;
}

}  // extern "C"
