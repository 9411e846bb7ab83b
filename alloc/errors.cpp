#include "errors.hpp"

#include <cstdarg>
#include <cstdio>

namespace uvm {
namespace {

struct LastError {
  uvm_status status = UVM_OK;
  std::string message;
  long long range_index = -1;
  int cuda_error = 0;  // the CUDA call's own error code behind a failure, 0 for failures of uvm's
};

LastError& last_error() {
  thread_local LastError error;
  return error;
}

std::string vformat(const char* format, va_list args) {
  va_list copy;
  va_copy(copy, args);
  const int length = std::vsnprintf(nullptr, 0, format, copy);
  va_end(copy);
  if (length <= 0) return {};
  std::string text(static_cast<size_t>(length), '\0');
  std::vsnprintf(&text[0], text.size() + 1, format, args);
  return text;
}

void record(uvm_status status, long long range_index, std::string message, int cuda_error = 0) noexcept {
  LastError& error = last_error();
  error.status = status;
  error.range_index = range_index;
  error.cuda_error = cuda_error;
  try {
    error.message = std::move(message);
  } catch (...) {
    error.message.clear();  // the message could not be stored; the status still is
  }
}

}  // namespace

std::string device_text(int device, DeviceArg meaning) {
  if (meaning == DeviceArg::location && device == UVM_LOCATION_CPU) return "cpu";
  if (meaning == DeviceArg::location && device == UVM_LOCATION_NONE) return "none";
  if (meaning == DeviceArg::selection && device == UVM_ANY_DEVICE) return "any";
  return std::to_string(device);
}

std::string Call::describe() const {
  std::string text = name;
  text += '(';
  const char* separator = "";
  char buffer[64];
  if (has_ptr) {
    std::snprintf(buffer, sizeof buffer, "ptr=%p", ptr);
    text += buffer;
    separator = ", ";
  }
  if (has_size) {
    std::snprintf(buffer, sizeof buffer, "%s%s=%zu", separator, size_is_count ? "count" : "size", size);
    text += buffer;
    separator = ", ";
  }
  if (device_arg != DeviceArg::none) {
    text += separator;
    text += "device=" + device_text(device, device_arg);
    separator = ", ";
  }
  if (has_tag) {
    text += separator;
    text += tag == nullptr ? std::string("tag=any") : "tag=\"" + std::string(tag) + '"';
  }
  if (has_tags) {
    text += separator;
    text += "tags=";
    if (tags == nullptr || tag_count == 0) text += "any";
    for (size_t i = 0; tags != nullptr && i < tag_count && i < 4; ++i) {
      text += i > 0 ? ", " : "";
      text += tags[i] == nullptr ? std::string("NULL") : '"' + std::string(tags[i]) + '"';
    }
    if (tags != nullptr && tag_count > 4) text += " and " + std::to_string(tag_count - 4) + " more";
  }
  return text + ')';
}

uvm_status fail(const Call& call, uvm_status status, const char* reason_format, ...) {
  try {
    va_list args;
    va_start(args, reason_format);
    std::string reason = vformat(reason_format, args);
    va_end(args);
    record(status, call.range_index, call.describe() + ": " + reason);
  } catch (...) {
    record(status, call.range_index, std::string());
  }
  return status;
}

cudaError_t clear_cuda_error(cudaError_t error) {
  if (error != cudaSuccess) (void)cudaGetLastError();
  return error;
}

uvm_status status_for(cudaError_t error) {
  switch (error) {
    case cudaSuccess:
      return UVM_OK;
    case cudaErrorMemoryAllocation:
      return UVM_ERROR_OUT_OF_MEMORY;
    case cudaErrorNoDevice:
    case cudaErrorInsufficientDriver:
    case cudaErrorInitializationError:
    case cudaErrorCompatNotSupportedOnDevice:
      return UVM_ERROR_NO_DEVICE;
    case cudaErrorStreamCaptureUnsupported:
    case cudaErrorStreamCaptureImplicit:
    case cudaErrorStreamCaptureInvalidated:
      return UVM_ERROR_CAPTURING;
    default:
      return UVM_ERROR_CUDA;
  }
}

uvm_status fail_cuda(const Call& call, cudaError_t error, const char* what_format, ...) {
  clear_cuda_error(error);
  const uvm_status status = status_for(error);
  try {
    va_list args;
    va_start(args, what_format);
    std::string what = vformat(what_format, args);
    va_end(args);
    std::string message = call.describe() + ": " + what + " failed: " + cudaGetErrorName(error) +
                          " (" + cudaGetErrorString(error) + ")";
    if (status == UVM_ERROR_NO_DEVICE) message += " — no usable CUDA device or driver";
    record(status, call.range_index, std::move(message), error);
  } catch (...) {
    record(status, call.range_index, std::string(), error);
  }
  return status;
}

uvm_status fail_errno(const Call& call, int error, const char* what_format, ...) {
  try {
    va_list args;
    va_start(args, what_format);
    std::string what = vformat(what_format, args);
    va_end(args);
    const char* name = strerrorname_np(error);
    std::string message = call.describe() + ": " + what + " failed: " + std::strerror(error) + " (" +
                          (name != nullptr ? name : std::to_string(error).c_str()) + ")";
    record(UVM_ERROR_IO, call.range_index, std::move(message));
  } catch (...) {
    record(UVM_ERROR_IO, call.range_index, std::string());
  }
  return UVM_ERROR_IO;
}

void note_cuda_error(int code) noexcept { last_error().cuda_error = code; }

Failure last_failure() {
  const LastError& error = last_error();
  return Failure{error.status, error.message, error.cuda_error};
}

uvm_status adopt(const Failure& failure) {
  record(failure.status, -1, failure.message, failure.cuda_error);
  return failure.status;
}

}  // namespace uvm

extern "C" {

const char* uvm_status_string(int status) {
  switch (status) {
    case UVM_OK: return "UVM_OK";
    case UVM_ERROR_INVALID_ARGUMENT: return "UVM_ERROR_INVALID_ARGUMENT";
    case UVM_ERROR_NOT_MANAGED: return "UVM_ERROR_NOT_MANAGED";
    case UVM_ERROR_UNSUPPORTED: return "UVM_ERROR_UNSUPPORTED";
    case UVM_ERROR_LIMIT_EXCEEDED: return "UVM_ERROR_LIMIT_EXCEEDED";
    case UVM_ERROR_CAPTURING: return "UVM_ERROR_CAPTURING";
    case UVM_ERROR_CUDA: return "UVM_ERROR_CUDA";
    case UVM_ERROR_OUT_OF_MEMORY: return "UVM_ERROR_OUT_OF_MEMORY";
    case UVM_ERROR_NO_DEVICE: return "UVM_ERROR_NO_DEVICE";
    case UVM_ERROR_INTERNAL: return "UVM_ERROR_INTERNAL";
    case UVM_ERROR_IO: return "UVM_ERROR_IO";
    case UVM_ERROR_SHARED: return "UVM_ERROR_SHARED";
    default: return "UVM_ERROR_UNKNOWN";
  }
}

const char* uvm_last_error(void) { return uvm::last_error().message.c_str(); }

uvm_status uvm_last_status(void) { return uvm::last_error().status; }

int64_t uvm_last_error_index(void) { return uvm::last_error().range_index; }

int uvm_last_cuda_error(void) { return uvm::last_error().cuda_error; }

void uvm_clear_last_error(void) {
  uvm::LastError& error = uvm::last_error();
  error.status = UVM_OK;
  error.range_index = -1;
  error.cuda_error = 0;
  error.message.clear();
}

#define UVM_STRINGIFY_(x) #x
#define UVM_STRINGIFY(x) UVM_STRINGIFY_(x)
const char* uvm_version(void) {
  return UVM_STRINGIFY(UVM_VERSION_MAJOR) "." UVM_STRINGIFY(UVM_VERSION_MINOR) "." UVM_STRINGIFY(
      UVM_VERSION_PATCH);
}

}  // extern "C"
