// Sharing releasable memory with other processes (uvm.h, "Sharing with other processes"). The
// exporter's side keeps, per exported allocation, the processes that map it now; moves that would
// take its bytes or memory ask here first, under the moves lock, which the import of the memory
// also takes, so an import and a pause never cross.
#pragma once

#include <sys/types.h>

#include <cstdint>
#include <optional>
#include <vector>

#include "../alloc/errors.hpp"

namespace uvm {

// A process mapping an export: counted while its connection is open.
struct Importer {
  int connection;  // its socket: closed by the importer's close, exit or crash
  pid_t pid;
};

// One exported allocation: the id and secret token its handles carry, and who maps it now.
struct Export {
  uint64_t id = 0;
  uint8_t token[16] = {};  // share_wire.hpp's kShareTokenBytes
  unsigned long long memory = 0;  // the physical memory (Mapping::handle) it was made for
  std::vector<Importer> importers;
};

// UVM_ERROR_SHARED naming the allocation at `base` and its importers if another process maps it.
// `what`: the move, for the message ("an offload"). Under the moves lock.
uvm_status check_not_shared(const Call& call, uintptr_t base, const char* what);

// The allocation at `base` is being freed: its export is taken out (importers keep the memory they
// map) and returned, for restore_export to put back should the free fail, so that a pause still
// sees who maps it. Under the moves lock.
std::optional<Export> forget_export(uintptr_t base);

// Puts back an export forget_export took, when the free failed and the allocation stays (its
// address range is still uvm's, so nothing else was exported there meanwhile); importers that
// closed meanwhile stay out.
void restore_export(uintptr_t base, Export exported);

}  // namespace uvm
