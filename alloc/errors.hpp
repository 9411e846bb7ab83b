// The one error path: every failure in uvm goes through fail() or fail_cuda(), which record a
// thread-local message naming the call, and every C entry runs inside guarded() so no exception
// crosses the ABI.
#pragma once

#include <cuda_runtime_api.h>

#include <cstddef>
#include <cstring>
#include <string>

#include "uvm.h"

namespace uvm {

constexpr int kNoDevice = -3;  // "this call has no device argument" (distinct from CPU -1, NONE -2)

// What an entry point was asked to do; printed at the head of every error message.
struct Call {
  const char* name;
  const void* ptr = nullptr;
  size_t size = 0;
  int device = kNoDevice;
  bool has_ptr = false;
  bool has_size = false;

  static Call of(const char* name) { return Call{name}; }
  Call& with_ptr(const void* p) { ptr = p; has_ptr = true; return *this; }
  Call& with_size(size_t s) { size = s; has_size = true; return *this; }
  Call& with_device(int d) { device = d; return *this; }
  std::string describe() const;  // e.g. "uvm_prefetch(ptr=0x7f00, size=4096, device=cpu)"
};

// Records `status` and "<call>: <reason>" as this thread's last error. Returns `status`.
uvm_status fail(const Call& call, uvm_status status, const char* reason_format, ...)
    __attribute__((format(printf, 3, 4)));

// Records a failed CUDA call as "<call>: <what> failed: cudaErrorName (description)", maps the error
// to a status (out of memory, no device, capturing, else UVM_ERROR_CUDA), clears the pending CUDA
// error and returns the status.
uvm_status fail_cuda(const Call& call, cudaError_t error, const char* what_format, ...)
    __attribute__((format(printf, 3, 4)));

// Clears the thread's pending CUDA error after a call we expect may fail (a probe), so the caller's
// next kernel launch does not report it. Returns `error` unchanged.
cudaError_t clear_cuda_error(cudaError_t error);

// The status a CUDA error maps to.
uvm_status status_for(cudaError_t error);

// The int a caller passed for an enum parameter, read without an enum load: C callers can pass any
// int, and loading a value outside the enum's range is undefined behaviour (UBSan flags it).
template <typename Enum>
int raw_enum(const Enum& value) {
  static_assert(sizeof(Enum) == sizeof(int), "uvm's C enums are int-sized");
  int raw = 0;
  std::memcpy(&raw, &value, sizeof raw);
  return raw;
}

// Runs `body` (returning uvm_status) and turns any exception into UVM_ERROR_INTERNAL.
template <typename Body>
uvm_status guarded(const Call& call, Body&& body) noexcept {
  try {
    return body();
  } catch (const std::bad_alloc&) {
    return fail(call, UVM_ERROR_INTERNAL, "host memory exhausted inside uvm");
  } catch (const std::exception& e) {
    return fail(call, UVM_ERROR_INTERNAL, "internal error: %s", e.what());
  } catch (...) {
    return fail(call, UVM_ERROR_INTERNAL, "internal error (unknown exception)");
  }
}

}  // namespace uvm
