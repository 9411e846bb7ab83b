// The importer's side of sharing (uvm.h, "Sharing with other processes"): asks the exporter for the
// memory's file descriptor over its socket, maps it, and keeps the connection open while it is
// mapped, so that the exporter counts this process among the allocation's importers until
// uvm_share_close, or until this process ends, however it ends.
#include <pthread.h>
#include <sys/socket.h>
#include <sys/time.h>
#include <sys/un.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <map>
#include <mutex>
#include <tuple>

#include "../alloc/devices.hpp"
#include "../alloc/options.hpp"
#include "../alloc/registry.hpp"
#include "wire.hpp"
#include "../alloc/vmm.hpp"

namespace uvm {
namespace {

// Which export a mapping is of: the exporting process's life, its export, and the device mapping it.
using ExportKey = std::tuple<int32_t, uint64_t, uint64_t, int>;

struct Imported {
  size_t size = 0;
  unsigned long long handle = 0;
  int connection = -1;
  int device = 0;
  ExportKey key;
  size_t imports = 1;  // uvm_share_import calls it answered, each closed by one uvm_share_close
};

// One mapping per export and device, however many imports ask for it: a model's tensors come in
// hundreds from a few allocations, and each would otherwise map (and pay for) its whole allocation.
struct Imports {
  std::mutex mutex;
  std::map<uintptr_t, Imported> by_base;
  std::map<ExportKey, uintptr_t> base_of;
};

// Never destroyed: no CUDA calls from static destructors. A child made by fork closes its copies of
// the connections: the exporter counts an importer while any process holds its connection, so a
// DataLoader worker forked from a crashed importer would hold off the exporter's pauses for its
// whole life. The child has no CUDA context of its own, so it has no mapping to keep either.
Imports& imports() {
  static auto* made = [] {
    auto* state = new Imports();
    pthread_atfork([] { imports().mutex.lock(); }, [] { imports().mutex.unlock(); },
                   [] {
                     Imports& child = imports();
                     for (const auto& [base, imported] : child.by_base) close(imported.connection);
                     child.by_base.clear();
                     child.base_of.clear();
                     child.mutex.unlock();
                   });
    return state;
  }();
  return *made;
}

// Sends `message` and waits for the reply, and the file descriptor beside it when the reply is
// UVM_OK and `fd` asks for one. Every other descriptor that arrives (beside a refusal, a close's
// reply, or more than one) is closed here: none is left open in this process.
bool ask(int connection, const ShareMessage& message, ShareReply* reply, int* fd) {
  if (fd != nullptr) *fd = -1;
  if (send(connection, &message, sizeof(message), MSG_NOSIGNAL) != static_cast<ssize_t>(sizeof(message))) return false;
  iovec part{reply, sizeof(*reply)};
  msghdr received{};
  received.msg_iov = &part;
  received.msg_iovlen = 1;
  alignas(cmsghdr) char control[CMSG_SPACE(4 * sizeof(int))] = {};
  received.msg_control = control;
  received.msg_controllen = sizeof(control);
  ssize_t got;
  do {
    got = recvmsg(connection, &received, MSG_CMSG_CLOEXEC);
  } while (got < 0 && errno == EINTR);
  const bool whole = got == static_cast<ssize_t>(sizeof(*reply));
  for (cmsghdr* header = CMSG_FIRSTHDR(&received); header != nullptr; header = CMSG_NXTHDR(&received, header)) {
    if (header->cmsg_level != SOL_SOCKET || header->cmsg_type != SCM_RIGHTS) continue;
    const size_t count = (header->cmsg_len - CMSG_LEN(0)) / sizeof(int);
    for (size_t i = 0; i < count; ++i) {
      int received_fd = -1;
      std::memcpy(&received_fd, CMSG_DATA(header) + i * sizeof(int), sizeof(int));
      if (whole && fd != nullptr && *fd < 0 && reply->status == UVM_OK) {
        *fd = received_fd;
      } else {
        close(received_fd);
      }
    }
  }
  return whole;
}

// Whether the process answering at `connection` is the exporter the handle names: after it exits,
// any process of the user could bind its socket's name and hand over memory of its own.
uvm_status check_exporter(const Call& call, int connection, const ShareHandle& handle) {
  ucred peer{};
  socklen_t length = sizeof(peer);
  if (getsockopt(connection, SOL_SOCKET, SO_PEERCRED, &peer, &length) != 0) {
    return fail_errno(call, errno, "getsockopt(SO_PEERCRED) on the connection to process %d", handle.owner_pid);
  }
  if (peer.pid != handle.owner_pid || peer.uid != getuid()) {
    return fail(call, UVM_ERROR_INVALID_ARGUMENT,
                "the socket of exporting process %d is answered by process %d (user %u): the exporter has exited "
                "and another process took its socket's name, or the exporter runs in another PID namespace; "
                "nothing was sent to it",
                handle.owner_pid, static_cast<int>(peer.pid), static_cast<unsigned>(peer.uid));
  }
  return UVM_OK;
}

uvm_status connect_to(const Call& call, const ShareHandle& handle, int* connection) {
  const int s = socket(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0);
  if (s < 0) return fail_errno(call, errno, "socket(AF_UNIX)");
  // Every answer is waited for at most UVM_SHARE_TIMEOUT_S (ask fails past it, errno EAGAIN).
  const timeval wait{options().share_timeout_s, 0};
  setsockopt(s, SOL_SOCKET, SO_RCVTIMEO, &wait, sizeof(wait));
  sockaddr_un address;
  const socklen_t length = share_address(handle.owner_pid, handle.server, &address);
  if (connect(s, reinterpret_cast<sockaddr*>(&address), length) != 0) {
    const int error = errno;
    close(s);
    return fail(call, UVM_ERROR_INVALID_ARGUMENT,
                "the exporting process %d cannot be reached (%s): it has exited, or it runs in another network "
                "namespace (a container of its own: the abstract Unix socket is per namespace)",
                handle.owner_pid, std::strerror(error));
  }
  *connection = s;
  return UVM_OK;
}

uvm_status import_allocation(const Call& call, const uvm_share_handle* raw, int device, void** out) {
  if (raw == nullptr || out == nullptr) return fail(call, UVM_ERROR_INVALID_ARGUMENT, "handle or ptr is NULL");
  ShareHandle handle;
  std::memcpy(&handle, raw->bytes, sizeof(handle));
  if (handle.magic != kShareMagic || handle.size == 0 || handle.offset >= handle.size) {
    return fail(call, UVM_ERROR_INVALID_ARGUMENT, "not a handle made by uvm_share_export (of this uvm version)");
  }
  if (uvm_status s = check_device(call, device, false)) return s;
  const ExportKey key{handle.owner_pid, handle.server, handle.export_id, device};
  {
    Imports& state = imports();
    std::lock_guard<std::mutex> lock(state.mutex);
    auto known = state.base_of.find(key);
    if (known != state.base_of.end()) {  // mapped here already, and the exporter counts this process
      ++state.by_base.at(known->second).imports;
      *out = reinterpret_cast<void*>(known->second + handle.offset);
      return UVM_OK;
    }
  }
  int connection = -1;
  if (uvm_status s = connect_to(call, handle, &connection)) return s;
  if (uvm_status s = check_exporter(call, connection, handle)) {  // before the token is sent
    close(connection);
    return s;
  }
  ShareMessage message;
  message.export_id = handle.export_id;
  std::memcpy(message.token, handle.token, kShareTokenBytes);
  ShareReply reply;
  int fd = -1;
  if (!ask(connection, message, &reply, &fd)) {
    const bool timed_out = errno == EAGAIN || errno == EWOULDBLOCK;
    close(connection);  // the exporter counts this process out, should it answer later
    if (timed_out) {
      return fail(call, UVM_ERROR_INVALID_ARGUMENT,
                  "the exporting process %d did not answer within %d s (UVM_SHARE_TIMEOUT_S): a pause or move there "
                  "holds its moves lock, or it hangs",
                  handle.owner_pid, options().share_timeout_s);
    }
    return fail(call, UVM_ERROR_INVALID_ARGUMENT, "the exporting process %d closed the connection before answering",
                handle.owner_pid);
  }
  if (reply.status != UVM_OK || fd < 0) {  // no descriptor is left open (ask)
    close(connection);
    reply.message[sizeof(reply.message) - 1] = '\0';
    return fail(call, reply.status != UVM_OK ? static_cast<uvm_status>(reply.status) : UVM_ERROR_INTERNAL,
                "process %d refused: %s", handle.owner_pid, reply.message);
  }
  ContextScope scope;
  uvm_status status = scope.enter(call, device, ContextScope::When::always);
  Imported imported;
  uintptr_t base = 0;
  if (status == UVM_OK) status = vmm_import(call, fd, handle.size, device, &base, &imported.handle);
  close(fd);
  if (status != UVM_OK) {
    close(connection);  // the exporter counts this process out
    return status;
  }
  imported.size = handle.size;
  imported.connection = connection;
  imported.device = device;
  imported.key = key;
  {
    Imports& state = imports();
    std::lock_guard<std::mutex> lock(state.mutex);
    state.by_base[base] = imported;
    // Another thread may have mapped it meanwhile: both mappings stand, each closed on its own, and
    // the next import reuses the first.
    state.base_of.emplace(key, base);
  }
  *out = reinterpret_cast<void*>(base + handle.offset);
  return UVM_OK;
}

uvm_status close_import(const Call& call, void* ptr) {
  const auto at = reinterpret_cast<uintptr_t>(ptr);
  Imported imported;
  uintptr_t base = 0;
  {
    Imports& state = imports();
    std::lock_guard<std::mutex> lock(state.mutex);
    auto it = state.by_base.upper_bound(at);
    if (it == state.by_base.begin() || at >= std::prev(it)->first + std::prev(it)->second.size) {
      return fail(call, UVM_ERROR_INVALID_ARGUMENT, "the pointer is not in memory mapped by uvm_share_import");
    }
    --it;
    if (--it->second.imports > 0) return UVM_OK;  // other imports still use the mapping
    base = it->first;
    imported = it->second;
    state.by_base.erase(it);
    auto indexed = state.base_of.find(imported.key);
    if (indexed != state.base_of.end() && indexed->second == base) state.base_of.erase(indexed);
  }
  ContextScope scope;
  uvm_status status = scope.enter(call, imported.device, ContextScope::When::always);
  if (status == UVM_OK) {
    // Work on it may still run: the memory must not go while it does.
    const cudaError_t e = cudaDeviceSynchronize();
    if (e != cudaSuccess) status = fail_cuda(call, e, "cudaDeviceSynchronize before unmapping imported memory");
  }
  if (status == UVM_OK) status = vmm_close_import(call, base, imported.size, imported.handle);
  if (status != UVM_OK) {  // still mapped: recorded again, for another close
    Imports& state = imports();
    std::lock_guard<std::mutex> lock(state.mutex);
    imported.imports = 1;
    state.by_base[base] = imported;
    state.base_of.emplace(imported.key, base);
    return status;
  }
  // Counted out before this returns: a pause the importer asks for next finds it gone. An exporter
  // that has exited answers nothing, which is as good.
  ShareMessage message;
  message.request = ShareRequest::close_import;
  ShareReply reply;
  (void)ask(imported.connection, message, &reply, nullptr);
  close(imported.connection);
  return UVM_OK;
}

}  // namespace
}  // namespace uvm

extern "C" uvm_status uvm_share_import(const uvm_share_handle* handle, int device, void** ptr) {
  const uvm::Call call = uvm::Call::of("uvm_share_import").with_device(device);
  return uvm::guarded(call, [&] { return uvm::import_allocation(call, handle, device, ptr); });
}

extern "C" uvm_status uvm_share_close(void* ptr) {
  const uvm::Call call = uvm::Call::of("uvm_share_close").with_ptr(ptr);
  return uvm::guarded(call, [&] { return uvm::close_import(call, ptr); });
}
