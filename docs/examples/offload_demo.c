/* offload_demo.c — uvm from plain C: allocate managed memory on GPU 0, fill it on the GPU, move it
 * to the host and back, and print what uvm recorded. Builds with `cc demo.c $(pkg-config --cflags
 * --libs uvm)`. Exit status: 0 done, 2 no CUDA device, 1 any other failure. */
#include <stdio.h>
#include <string.h>

#include <uvm.h>

#define MiB ((size_t)1 << 20)

static int failed(const char* what, int status) {
  fprintf(stderr, "uvm demo: %s failed: %s: %s\n", what, uvm_status_string(status), uvm_last_error());
  return 1;
}

int main(void) {
  const size_t size = 256 * MiB;
  const int device = 0;
  printf("uvm %s\n", uvm_version());
  if (uvm_device_count() == 0) {
    printf("no CUDA device is present: %s\n", uvm_last_error());
    printf("uvm was built; the demo needs a GPU to run.\n");
    return 2;
  }
  uvm_device_caps caps;
  if (uvm_device_capabilities(device, &caps) != UVM_OK) return failed("uvm_device_capabilities", uvm_last_status());
  printf("device %d: %zu MiB, concurrentManagedAccess=%d, discard=%d\n", device, caps.total_memory / MiB,
         caps.concurrent_managed_access, caps.discard_supported);

  unsigned char* data = (unsigned char*)uvm_malloc(size, device, NULL);
  if (data == NULL) return failed("uvm_malloc", uvm_last_status());

  /* The GPU writes the bytes; the host then reads them through the same pointer. */
  if (cudaMemset(data, 0x5A, size) != cudaSuccess || cudaDeviceSynchronize() != cudaSuccess) {
    fprintf(stderr, "uvm demo: cudaMemset on managed memory failed\n");
    return 1;
  }
  int status = uvm_prefetch(data, size, UVM_LOCATION_CPU, NULL);
  if (status != UVM_OK) return failed("uvm_prefetch to CPU", status);
  cudaDeviceSynchronize();
  int preferred = 0, last = 0;
  if ((status = uvm_query_location(data, size, &preferred, &last)) != UVM_OK) return failed("uvm_query_location", status);
  printf("offloaded %zu MiB: preferred location %d, last prefetch %d (-1 = CPU)\n", size / MiB, preferred, last);
  for (size_t i = 0; i < size; i += 4096) {
    if (data[i] != 0x5A) {
      fprintf(stderr, "uvm demo: byte %zu is %d after offload, expected 90\n", i, data[i]);
      return 1;
    }
  }
  if ((status = uvm_prefetch(data, size, device, NULL)) != UVM_OK) return failed("uvm_prefetch to GPU", status);
  cudaDeviceSynchronize();
  uvm_stats stats;
  if ((status = uvm_get_stats(device, &stats)) != UVM_OK) return failed("uvm_get_stats", status);
  printf("onloaded again: live %zu MiB, on host %zu MiB, moved to host %llu MiB, to GPU %llu MiB\n",
         stats.live_bytes / MiB, stats.host_resident_bytes / MiB,
         (unsigned long long)(stats.bytes_to_host / MiB), (unsigned long long)(stats.bytes_to_device / MiB));
  uvm_free(data, size, device, NULL);
  if (uvm_last_status() != UVM_OK) return failed("uvm_free", uvm_last_status());
  printf("done\n");
  return 0;
}
