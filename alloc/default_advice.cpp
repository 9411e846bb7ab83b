#include "default_advice.hpp"

#include <atomic>

#include "options.hpp"

namespace uvm {
namespace {

constexpr int kNotChosen = -1;
std::atomic<int> chosen_mode{kNotChosen};

}  // namespace

uvm_status default_advice(const Call& call, uvm_advice_mode* mode) {
  const int chosen = chosen_mode.load(std::memory_order_acquire);
  if (chosen != kNotChosen) {
    *mode = static_cast<uvm_advice_mode>(chosen);
    return UVM_OK;
  }
  if (uvm_status s = check_options(call)) return s;
  *mode = options().default_advice;
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
