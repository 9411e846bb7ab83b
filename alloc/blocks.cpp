// uvm_report_blocks: whether a runtime reports the blocks it cuts out of the allocations made from
// now on (the registry then records them, and an offload drops the free space between them).
#include <atomic>

#include "blocks.hpp"
#include "uvm.h"

namespace uvm {
namespace {

std::atomic<bool> runtime_reports_blocks{false};

}  // namespace

bool blocks_are_reported() { return runtime_reports_blocks.load(std::memory_order_relaxed); }

}  // namespace uvm

extern "C" {

uvm_status uvm_report_blocks(int enabled) {
  uvm::runtime_reports_blocks = enabled != 0;
  return UVM_OK;
}

}  // extern "C"
