// GPU suite entry: needs one CUDA device (GPU 0) with managed memory. Without one it prints why and
// exits 77, which meson reports as a skip.
#ifndef UVM_CATCH2_V3
#define CATCH_CONFIG_RUNNER
#endif
#include <cstdio>

#include "catch.hpp"
#include "gpu_support.hpp"

int main(int argc, char** argv) {
  if (uvm_device_count() == 0) {
    std::printf("SKIP: no CUDA device: %s\n", uvm_last_error());
    return 77;
  }
  cudaDeviceProp properties{};
  cudaGetDeviceProperties(&properties, 0);
  int driver = 0, runtime = 0;
  cudaDriverGetVersion(&driver);
  cudaRuntimeGetVersion(&runtime);
  std::printf("GPU 0: %s, %zu MiB, driver %d, runtime %d; managed budget %zu MiB (25%%)\n",
              properties.name, properties.totalGlobalMem >> 20, driver, runtime,
              gpu::managed_budget() >> 20);
  return Catch::Session().run(argc, argv);
}
