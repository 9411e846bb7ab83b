// What passes between an exporting process and an importing one (share/export.hpp): the handle's
// layout inside uvm_share_handle, the socket's name, and the messages on it. Both sides are the
// same library, so the layout is checked only by a magic number and a version.
#pragma once

#include <sys/socket.h>
#include <sys/un.h>

#include <cstddef>
#include <cstdint>
#include <string>

#include "uvm.h"

namespace uvm {

constexpr uint32_t kShareMagic = 0x32534d55;  // "UMS2": handles and messages carry a token
// Random bytes (getrandom) per export: export ids run 1, 2, 3, and any process of the user can list
// the abstract socket names (/proc/net/unix), so an id alone would let it map every export.
constexpr size_t kShareTokenBytes = 16;

// The handle, as uvm_share_handle's bytes hold it.
struct ShareHandle {
  uint32_t magic = kShareMagic;
  int32_t owner_pid = 0;   // the exporting process
  uint64_t server = 0;     // its socket's name: its start time, so that a new process with the pid reused is another
  uint64_t export_id = 0;  // the allocation, as exported: a new one at the same address has another
  uint64_t offset = 0;     // of the exported pointer in the allocation
  uint64_t size = 0;       // bytes of the allocation's physical memory (its reserved size)
  int32_t device = 0;      // the exporter's device
  uint8_t token[kShareTokenBytes] = {};  // the export's secret: the exporter maps nothing without it
};
static_assert(sizeof(ShareHandle) <= sizeof(uvm_share_handle), "a handle fits uvm_share_handle");

// Whether two tokens are equal, in time that does not depend on where they differ.
inline bool same_token(const uint8_t* a, const uint8_t* b) {
  uint8_t differ = 0;
  for (size_t i = 0; i < kShareTokenBytes; ++i) differ |= static_cast<uint8_t>(a[i] ^ b[i]);
  return differ == 0;
}

enum class ShareRequest : uint32_t { import_memory = 1, close_import = 2 };

struct ShareMessage {
  uint32_t magic = kShareMagic;
  ShareRequest request = ShareRequest::import_memory;
  uint64_t export_id = 0;
  uint8_t token[kShareTokenBytes] = {};  // the handle's: an import without the export's is refused
};

// The exporter's answer: a status, its message when it refused, and with UVM_OK the memory's file
// descriptor beside it (SCM_RIGHTS).
struct ShareReply {
  int32_t status = UVM_OK;
  char message[400] = {};
};

// The socket's address in Linux's abstract namespace (sun_path begins with a NUL byte: no file).
inline socklen_t share_address(int32_t pid, uint64_t server, sockaddr_un* address) {
  *address = sockaddr_un{};
  address->sun_family = AF_UNIX;
  const std::string name = "uvm-share-" + std::to_string(pid) + "-" + std::to_string(server);
  name.copy(address->sun_path + 1, sizeof(address->sun_path) - 2);
  return static_cast<socklen_t>(offsetof(sockaddr_un, sun_path) + 1 + name.size());
}

}  // namespace uvm
