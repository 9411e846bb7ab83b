#include "kernels.hpp"

#include <map>
#include <mutex>
#include <string>
#include <tuple>

#include "../../alloc/driver_api.hpp"

namespace uvm {
namespace {

struct KernelApi {
  CUresult (*module_load_data)(CUmodule*, const void*) = nullptr;
  CUresult (*module_get_function)(CUfunction*, CUmodule, const char*) = nullptr;
  CUresult (*launch_kernel)(CUfunction, unsigned, unsigned, unsigned, unsigned, unsigned, unsigned, unsigned,
                            CUstream, void**, void**) = nullptr;
  bool available = false;
};

const KernelApi& kernel_api() {
  static KernelApi* api = [] {
    auto* a = new KernelApi();
    a->available = resolve_driver("cuModuleLoadData", &a->module_load_data) &&
                   resolve_driver("cuModuleGetFunction", &a->module_get_function) &&
                   resolve_driver("cuLaunchKernel", &a->launch_kernel);
    return a;
  }();
  return *api;
}

// What is loaded, never destroyed: modules by (device, PTX text), functions by (device, PTX, name).
struct LoadedModules {
  std::mutex mutex;
  std::map<std::pair<int, const char*>, CUmodule> modules;
  std::map<std::tuple<int, const char*, std::string>, CUfunction> functions;
};
LoadedModules& loaded_modules() {
  static LoadedModules* table = new LoadedModules();
  return *table;
}

}  // namespace

bool kernels_available() { return kernel_api().available; }

uvm_status load_kernel_function(const Call& call, int device, const char* ptx, const char* name, const char* what,
                                CUfunction* out) {
  LoadedModules& table = loaded_modules();
  std::lock_guard<std::mutex> lock(table.mutex);
  const auto key = std::make_tuple(device, ptx, std::string(name));
  if (auto found = table.functions.find(key); found != table.functions.end()) {
    *out = found->second;
    return UVM_OK;
  }
  const KernelApi& api = kernel_api();
  if (!api.available) {
    return fail(call, UVM_ERROR_UNSUPPORTED, "%s needs cuModuleLoadData, cuModuleGetFunction and cuLaunchKernel, "
                "which the driver does not offer", what);
  }
  // A module is kept once a function of it was found: one whose lookup failed is loaded again next
  // time (the failed one stays loaded, as every module does).
  auto kept = table.modules.find({device, ptx});
  CUmodule module = kept != table.modules.end() ? kept->second : nullptr;
  if (module == nullptr) {
    if (CUresult r = api.module_load_data(&module, ptx)) {
      return fail_driver(call, r, "cuModuleLoadData(%s, device %d)", what, device);
    }
  }
  CUfunction function = nullptr;
  if (CUresult r = api.module_get_function(&function, module, name)) {
    return fail_driver(call, r, "cuModuleGetFunction(%s, device %d)", name, device);
  }
  table.modules[{device, ptx}] = module;
  table.functions[key] = function;
  *out = function;
  return UVM_OK;
}

void forget_loaded_kernels_for_test() {
  LoadedModules& table = loaded_modules();
  std::lock_guard<std::mutex> lock(table.mutex);
  table.modules.clear();
  table.functions.clear();
}

CUresult launch_kernel(CUfunction function, unsigned blocks, unsigned threads, cudaStream_t stream, void** params) {
  return kernel_api().launch_kernel(function, blocks, 1, 1, threads, 1, 1, 0, reinterpret_cast<CUstream>(stream), params,
                                    nullptr);
}

}  // namespace uvm
