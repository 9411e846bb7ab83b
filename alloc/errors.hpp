// The one error path: every failure in uvm goes through fail() or fail_cuda(), which record a
// thread-local message naming the call, and every C entry runs inside guarded() so no exception
// crosses the ABI.
#pragma once

#include <cuda_runtime_api.h>

#include <cstddef>
#include <cstdint>
#include <cstring>
#include <string>

#include "uvm.h"

namespace uvm {

// What an int device argument means, so that a message prints its sentinels by name (uvm.h,
// "Devices and locations"): -1 is "cpu" for a location but "any" for a selection.
enum class DeviceArg : uint8_t {
  none,       // the call has no device argument
  ordinal,    // a CUDA device ordinal (uvm_malloc, uvm_set_limit…)
  location,   // an ordinal, UVM_LOCATION_CPU or UVM_LOCATION_NONE (prefetch, advise)
  selection,  // an ordinal or UVM_ANY_DEVICE (uvm_get_residency, uvm_list_allocations…)
};

// What an entry point was asked to do; printed at the head of every error message.
struct Call {
  const char* name;
  const void* ptr = nullptr;
  size_t size = 0;    // bytes, or for a batched call the number of ranges
  int device = 0;
  DeviceArg device_arg = DeviceArg::none;
  bool has_ptr = false;
  bool has_size = false;
  bool size_is_count = false;
  long long range_index = -1;  // the range of a batched call that failed, if one did
  const char* tag = nullptr;   // a selection's tag (the caller's string, alive for the call)
  bool has_tag = false;
  const char* const* tags = nullptr;  // or its tags (the caller's array, alive for the call)
  size_t tag_count = 0;
  bool has_tags = false;

  static Call of(const char* name) { return Call{name}; }
  Call& with_ptr(const void* p) { ptr = p; has_ptr = true; return *this; }
  Call& with_size(size_t s) { size = s; has_size = true; return *this; }
  Call& with_count(size_t n) { size = n; has_size = true; size_is_count = true; return *this; }
  Call& with_device(int d) { device = d; device_arg = DeviceArg::ordinal; return *this; }
  Call& with_location(int d) { device = d; device_arg = DeviceArg::location; return *this; }
  Call& with_selection(int d) { device = d; device_arg = DeviceArg::selection; return *this; }
  // A selection's tag: printed quoted, or "any" for NULL.
  Call& with_tag(const char* t) { tag = t; has_tag = true; return *this; }
  // A selection's tags: printed quoted (at most four, then how many more), or "any" for none.
  Call& with_tags(const char* const* list, size_t count) {
    tags = list;
    tag_count = count;
    has_tags = true;
    return *this;
  }
  // The same call, its failure tied to range `index` of the batch (uvm_last_error_index).
  Call at_range(size_t index) const { Call c = *this; c.range_index = static_cast<long long>(index); return c; }
  std::string describe() const;  // e.g. "uvm_prefetch_ranges(count=3, device=cpu)", "uvm_pause(device=0, tag=\"kv\")"
};

// A device argument as messages print it: "cpu", "none", "any" or the ordinal.
std::string device_text(int device, DeviceArg meaning);

// Records `status` and "<call>: <reason>" as this thread's last error (and the call's range index).
// Returns `status`.
uvm_status fail(const Call& call, uvm_status status, const char* reason_format, ...)
    __attribute__((format(printf, 3, 4)));

// Records a failed CUDA call as "<call>: <what> failed: cudaErrorName (description)", maps the error
// to a status (out of memory, no device, capturing, else UVM_ERROR_CUDA), clears the pending CUDA
// error and returns the status.
uvm_status fail_cuda(const Call& call, cudaError_t error, const char* what_format, ...)
    __attribute__((format(printf, 3, 4)));

// Records the driver's CUresult behind the failure just recorded (uvm_last_cuda_error).
void note_cuda_error(int code) noexcept;

// Records a failed file or host-memory operation (disk and mmap backups) as "<call>: <what> failed:
// <strerror> (<errno name>)" with UVM_ERROR_IO, and returns UVM_ERROR_IO.
uvm_status fail_errno(const Call& call, int error, const char* what_format, ...)
    __attribute__((format(printf, 3, 4)));

// A failure recorded on one thread (a worker of a C entry), carried to the thread that made the
// call: taken where it happened, adopted as the caller's last error.
struct Failure {
  uvm_status status = UVM_OK;
  std::string message;
  int cuda_error = 0;
};
Failure last_failure();
uvm_status adopt(const Failure& failure);

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
