/* uvm.h from strict C99, linked against the real libuvm.so. On a machine without a GPU it also
 * proves the real library fails cleanly: uvm_malloc returns NULL with a "no CUDA device/driver"
 * message and leaves no CUDA error pending. */
#include <stdio.h>
#include <string.h>

#include "uvm.h"

static int failures = 0;
#define EXPECT(cond)                                                   \
  do {                                                                 \
    if (!(cond)) {                                                     \
      fprintf(stderr, "%s:%d: expected %s\n", __FILE__, __LINE__, #cond); \
      ++failures;                                                      \
    }                                                                  \
  } while (0)

/* The layouts the Python shim declares (tests/python/test_surface.py), on LP64. */
#if defined(__LP64__)
typedef char move_phase_is_40_bytes[sizeof(uvm_move_phase) == 40 ? 1 : -1];
typedef char move_report_is_368_bytes[sizeof(uvm_move_report) == 368 ? 1 : -1];
typedef char staging_info_is_64_bytes[sizeof(uvm_staging_info) == 64 ? 1 : -1];
#endif

int main(void) {
  uvm_range range;
  uvm_stats stats;
  uvm_device_caps caps;
  void* ptr;
  /* Without a driver every runtime call, this one included, reports cudaErrorInsufficientDriver:
   * a state of the process, not a pending error. uvm must add nothing to it. */
  const cudaError_t baseline = cudaPeekAtLastError();
  range.ptr = NULL;
  range.size = 0;
  EXPECT(strcmp(uvm_status_string(UVM_ERROR_LIMIT_EXCEEDED), "UVM_ERROR_LIMIT_EXCEEDED") == 0);
  EXPECT(strcmp(uvm_version(), "0.1.0") == 0);
  EXPECT(uvm_malloc(0, 0, NULL) == NULL);
  uvm_free(NULL, 0, 0, NULL);
  EXPECT(uvm_last_status() == UVM_OK);
  EXPECT(uvm_prefetch_ranges(&range, 1, 0, NULL) == UVM_OK);
  EXPECT(uvm_is_managed(&range) == 0);
  {
    uvm_move_report report;
    EXPECT(uvm_last_move(UVM_ANY_DEVICE, &report) == UVM_OK);
    EXPECT(report.call == NULL && report.phase_count == 0); /* no move made */
    EXPECT(uvm_trace_flush() == UVM_OK);
  }

  if (uvm_device_count() == 0) {
    printf("no GPU: checking the real library's no-device path\n");
    uvm_clear_last_error();
    ptr = uvm_malloc(4096, 0, NULL);
    EXPECT(ptr == NULL);
    EXPECT(uvm_last_status() == UVM_ERROR_NO_DEVICE);
    EXPECT(strstr(uvm_last_error(), "uvm_malloc(size=4096, device=0)") != NULL);
    EXPECT(strstr(uvm_last_error(), "no usable CUDA device or driver") != NULL);
    EXPECT(uvm_get_stats(0, &stats) == UVM_ERROR_NO_DEVICE);
    EXPECT(uvm_device_capabilities(0, &caps) == UVM_ERROR_NO_DEVICE);
    EXPECT(cudaPeekAtLastError() == baseline);
    printf("message: %s\n", uvm_last_error());
  } else {
    printf("GPU present: checking one real allocation\n");
    ptr = uvm_malloc(4096, 0, NULL);
    EXPECT(ptr != NULL);
    EXPECT(uvm_is_managed(ptr) == 1);
    EXPECT(uvm_get_stats(0, &stats) == UVM_OK && stats.live_bytes >= 4096);
    uvm_free(ptr, 4096, 0, NULL);
    EXPECT(uvm_last_status() == UVM_OK);
    EXPECT(uvm_prefetch(&range, 64, 0, NULL) == UVM_ERROR_NOT_MANAGED);
    EXPECT(cudaPeekAtLastError() == cudaSuccess);
  }
  if (failures == 0) printf("All tests passed (C99 ABI)\n");
  return failures == 0 ? 0 : 1;
}
