#include "export.hpp"

#include <poll.h>
#include <pthread.h>
#include <sys/random.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <chrono>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <system_error>
#include <thread>
#include <vector>

#include "../alloc/devices.hpp"
#include "../alloc/malloc.hpp"
#include "../alloc/moves.hpp"
#include "../alloc/registry.hpp"
#include "wire.hpp"
#include "../alloc/vmm.hpp"

namespace uvm {
namespace {

static_assert(sizeof(Export::token) == kShareTokenBytes, "an export's token is a handle's");

// A new export's secret token, from the kernel's random source.
uvm_status random_token(const Call& call, uint8_t* token) {
  size_t got = 0;
  while (got < kShareTokenBytes) {
    const ssize_t n = getrandom(token + got, kShareTokenBytes - got, 0);
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) return fail_errno(call, errno, "getrandom(%zu bytes for the export's token)", kShareTokenBytes);
    got += static_cast<size_t>(n);
  }
  return UVM_OK;
}

// The exporter's side. Its thread and socket are made at the first export; the state is never
// destroyed (no code runs from static destructors), and a child made by fork starts without them.
struct Exports {
  std::mutex mutex;
  std::map<uintptr_t, Export> by_base;
  std::map<uint64_t, uintptr_t> base_of;
  uint64_t next_id = 1;
  int listening = -1;
  uint64_t server = 0;             // the socket's name (share_wire.hpp)
  std::vector<int> connections;    // accepted, importers or not yet
};

Exports& exports() {
  static auto* made = [] {
    auto* state = new Exports();
    // A free takes an allocation's export out with its record (its importers keep the memory they
    // map), and puts it back should the free fail: alloc/ holds it without knowing what it is.
    set_kept_by_a_part(KeptByAPart{
        [](uintptr_t base) -> std::shared_ptr<void> {
          std::optional<Export> taken = forget_export(base);
          return taken ? std::make_shared<Export>(std::move(*taken)) : nullptr;
        },
        [](uintptr_t base, std::shared_ptr<void> kept) {
          restore_export(base, std::move(*std::static_pointer_cast<Export>(kept)));
        }});
    pthread_atfork([] { exports().mutex.lock(); }, [] { exports().mutex.unlock(); },
                   [] {
                     Exports& child = exports();
                     // The parent's server and importers are the parent's: the child closes its copies.
                     if (child.listening >= 0) close(child.listening);
                     for (int connection : child.connections) close(connection);
                     child.listening = -1;
                     child.connections.clear();
                     child.by_base.clear();
                     child.base_of.clear();
                     child.mutex.unlock();
                   });
    return state;
  }();
  return *made;
}

bool send_reply(int connection, const ShareReply& reply, int fd) {
  iovec part{const_cast<ShareReply*>(&reply), sizeof(reply)};
  msghdr message{};
  message.msg_iov = &part;
  message.msg_iovlen = 1;
  alignas(cmsghdr) char control[CMSG_SPACE(sizeof(int))] = {};
  if (fd >= 0) {
    message.msg_control = control;
    message.msg_controllen = sizeof(control);
    cmsghdr* header = CMSG_FIRSTHDR(&message);
    header->cmsg_level = SOL_SOCKET;
    header->cmsg_type = SCM_RIGHTS;
    header->cmsg_len = CMSG_LEN(sizeof(int));
    std::memcpy(CMSG_DATA(header), &fd, sizeof(int));
  }
  return sendmsg(connection, &message, MSG_NOSIGNAL) == static_cast<ssize_t>(sizeof(reply));
}

ShareReply refusal(uvm_status status) {
  ShareReply reply;
  reply.status = status;
  std::snprintf(reply.message, sizeof(reply.message), "%s", uvm_last_error());
  uvm_clear_last_error();
  return reply;
}

// The process at the other end of `connection`, as the kernel saw it connect; false if unknown.
bool peer_of(int connection, ucred* peer) {
  *peer = ucred{};
  socklen_t length = sizeof(*peer);
  return getsockopt(connection, SOL_SOCKET, SO_PEERCRED, peer, &length) == 0;
}

// The physical memory of the releasable allocation `found`, which must hold all of its bytes: one
// offloaded or paused has none to share, or bytes another process would not see. Discarded bytes
// (a region's free space after a pause and resume) are on the device, with nothing to lose.
uvm_status all_on_device(const Call& call, const AllocationView& found, Mapping* mapping) {
  BlockState bytes;
  if (!registry().mapping(found.base, mapping) || !mapping->mapped ||
      !registry().block_state(found.base, found.base + found.size, &bytes) || bytes.on_host) {
    return fail(call, UVM_ERROR_INVALID_ARGUMENT,
                "the allocation at %p (%zu bytes) is offloaded or paused: onload or resume it before sharing it",
                reinterpret_cast<void*>(found.base), found.size);
  }
  return UVM_OK;
}

// An import of export `id` with `token` over `connection`: under the moves lock, so that no move of
// the allocation runs between the check that its bytes are on the device and the count of the importer.
void answer_import(int connection, uint64_t id, const uint8_t* token) {
  const Call call = Call::of("uvm_share_import (answered by the exporting process)");
  const auto moves = lock_moves();
  uintptr_t base = 0;
  bool token_matches = false;
  unsigned long long exported_memory = 0;  // the physical memory the export was made for
  {
    Exports& state = exports();
    std::lock_guard<std::mutex> lock(state.mutex);
    auto it = state.base_of.find(id);
    if (it != state.base_of.end()) {
      base = it->second;
      token_matches = same_token(state.by_base[base].token, token);
      exported_memory = state.by_base[base].memory;
    }
  }
  AllocationView found;
  Mapping mapping;
  uvm_status status = UVM_OK;
  if (base != 0 && !token_matches) {
    status = fail(call, UVM_ERROR_INVALID_ARGUMENT,
                  "the handle's token is not export %llu's: only a handle uvm_share_export made maps it",
                  static_cast<unsigned long long>(id));
  } else if (base == 0 || !registry().find(reinterpret_cast<const void*>(base), &found)) {
    status = fail(call, UVM_ERROR_INVALID_ARGUMENT,
                  "export %llu is gone: its allocation was freed, or paused or offloaded and exported again since "
                  "(its memory is new: the new handle maps it)",
                  static_cast<unsigned long long>(id));
  } else {
    status = all_on_device(call, found, &mapping);
  }
  if (status == UVM_OK && (!mapping.exportable || mapping.handle != exported_memory)) {
    // A slow receiver of a handle from before a pause must not map the memory mapped since.
    status = fail(call, UVM_ERROR_INVALID_ARGUMENT,
                  "the allocation at %p (%zu bytes) was paused or offloaded after it was exported, and its "
                  "memory is new: export it again (uvm_share_export)",
                  reinterpret_cast<void*>(found.base), found.size);
  }
  int fd = -1;
  if (status == UVM_OK) {
    ContextScope scope;
    status = scope.enter(call, found.device, ContextScope::When::always);
    if (status == UVM_OK) status = vmm_export(call, base, mapping, &fd);
  }
  if (status != UVM_OK) {
    send_reply(connection, refusal(status), -1);
    return;
  }
  ucred peer;
  peer_of(connection, &peer);  // accepted, so known (accept_one)
  {
    Exports& state = exports();
    std::lock_guard<std::mutex> lock(state.mutex);
    state.by_base[base].importers.push_back(Importer{connection, peer.pid});
  }
  send_reply(connection, ShareReply{}, fd);
  close(fd);  // the importer holds its own copy now, or the import failed there and it has none
}

// The importer at `connection` maps nothing of ours any more.
void drop_importer(int connection) {
  Exports& state = exports();
  std::lock_guard<std::mutex> lock(state.mutex);
  for (auto& [base, exported] : state.by_base) {
    auto& list = exported.importers;
    list.erase(std::remove_if(list.begin(), list.end(), [&](const Importer& i) { return i.connection == connection; }),
               list.end());
  }
}

void close_connection(int connection) {
  drop_importer(connection);
  Exports& state = exports();
  {
    std::lock_guard<std::mutex> lock(state.mutex);
    auto& list = state.connections;
    list.erase(std::remove(list.begin(), list.end(), connection), list.end());
  }
  close(connection);
}

// A message from `connection`; false once it closed (its importer is gone).
bool answer(int connection) {
  ShareMessage message;
  const ssize_t got = recv(connection, &message, sizeof(message), 0);
  if (got != static_cast<ssize_t>(sizeof(message)) || message.magic != kShareMagic) return false;
  if (message.request == ShareRequest::import_memory) {
    answer_import(connection, message.export_id, message.token);
  } else {
    drop_importer(connection);
    send_reply(connection, ShareReply{}, -1);
  }
  return true;
}

// Accepts importers of the same user only: the abstract namespace has no file permissions.
void accept_one(int listening) {
  const int connection = accept4(listening, nullptr, nullptr, SOCK_CLOEXEC);
  if (connection < 0) return;
  ucred peer;
  if (!peer_of(connection, &peer) || peer.uid != getuid()) {
    close(connection);
    return;
  }
  Exports& state = exports();
  std::lock_guard<std::mutex> lock(state.mutex);
  state.connections.push_back(connection);
}

void serve(int listening) noexcept {
  std::vector<pollfd> watched;
  for (;;) {
    watched.assign(1, pollfd{listening, POLLIN, 0});
    {
      Exports& state = exports();
      std::lock_guard<std::mutex> lock(state.mutex);
      if (state.listening != listening) return;  // forked away: not this process's server
      for (int connection : state.connections) watched.push_back(pollfd{connection, POLLIN, 0});
    }
    if (poll(watched.data(), watched.size(), -1) < 0) {
      if (errno == EINTR) continue;
      return;
    }
    if (watched[0].revents & POLLIN) accept_one(listening);
    for (size_t i = 1; i < watched.size(); ++i) {
      if (watched[i].revents == 0) continue;
      if (!(watched[i].revents & POLLIN) || !answer(watched[i].fd)) close_connection(watched[i].fd);
    }
  }
}

// The server's socket and thread, made once per process. Under the state's mutex.
uvm_status start_server(const Call& call, Exports& state) {
  if (state.listening >= 0) return UVM_OK;
  const int listening = socket(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0);
  if (listening < 0) return fail_errno(call, errno, "socket(AF_UNIX) for the export server");
  // Unique to this process's life, so that a process given the pid later has another name; not a
  // secret (the peer's user is what is checked). No std::random_device: it needs a newer glibc than
  // the wheel's tag (arc4random).
  const uint64_t server = static_cast<uint64_t>(std::chrono::system_clock::now().time_since_epoch().count());
  sockaddr_un address;
  const socklen_t length = share_address(getpid(), server, &address);
  if (bind(listening, reinterpret_cast<sockaddr*>(&address), length) != 0 || listen(listening, 64) != 0) {
    const int error = errno;
    close(listening);
    return fail_errno(call, error, "bind/listen on the export server's abstract Unix socket");
  }
  try {
    std::thread(serve, listening).detach();
  } catch (const std::system_error&) {
    close(listening);
    return fail(call, UVM_ERROR_INTERNAL, "no thread for the export server");
  }
  state.listening = listening;
  state.server = server;
  return UVM_OK;
}

// An export of memory made without an exportable handle. It is not swapped for exportable memory
// here: the swap (wait for the device, copy, unmap, map new memory at the address) cannot be
// ordered against kernels other threads launch meanwhile, and one launched during it lost the GPU
// context (docs/measurements.md, "An export beside a writing thread"). The allocation is marked
// instead, and its next map (a resume, an onload) makes exportable memory; where the device cannot
// export, says so.
uvm_status refuse_unexportable(const Call& call, const AllocationView& found, Mapping* mapping) {
  const void* at = reinterpret_cast<const void*>(found.base);
  if (mapping->shared) {  // asked, and mapped since: the export itself says why it cannot be
    ContextScope scope;
    int fd = -1;
    uvm_status s = scope.enter(call, found.device, ContextScope::When::always);
    if (s == UVM_OK) s = vmm_export(call, found.base, *mapping, &fd);
    if (fd >= 0) close(fd);
    return s != UVM_OK ? s : fail(call, UVM_ERROR_INTERNAL, "the allocation at %p asked for exportable memory and "
                                                            "was mapped without it", at);
  }
  mapping->shared = true;
  registry().set_mapping(found.base, *mapping);
  return fail(call, UVM_ERROR_UNSUPPORTED,
              "the allocation at %p (%zu bytes) was not made exportable: allocate it so (uvm_set_thread_exportable(1); "
              "in Python, UVM_SHAREABLE or uvm.sharing.exportable()); swapping its memory now could lose the GPU "
              "context under work other threads launch. It is exportable from its next map on (a resume or onload)",
              at, found.size);
}

uvm_status export_allocation(const Call& call, const void* ptr, uvm_share_handle* out) {
  if (out == nullptr) return fail(call, UVM_ERROR_INVALID_ARGUMENT, "handle is NULL");
  const auto moves = lock_moves();
  AllocationView found;
  if (!registry().find(ptr, &found)) {
    return fail(call, UVM_ERROR_NOT_MANAGED, "the pointer is not in a uvm allocation");
  }
  if (found.backing != Backing::releasable) {
    return fail(call, UVM_ERROR_UNSUPPORTED,
                "the allocation at %p (%zu bytes) is managed memory (cudaMallocManaged), which CUDA cannot "
                "share with another process; allocate it releasable (uvm_malloc_releasable, a releasable pool "
                "or a uvm.memory_saver region) to send it",
                reinterpret_cast<void*>(found.base), found.size);
  }
  Mapping mapping;
  if (uvm_status s = all_on_device(call, found, &mapping)) return s;
  if (!mapping.exportable) return refuse_unexportable(call, found, &mapping);
  Exports& state = exports();
  bool first_of_memory = true;  // no export of this memory yet: whether the driver exports it is tried here
  {
    std::lock_guard<std::mutex> lock(state.mutex);
    auto it = state.by_base.find(found.base);
    first_of_memory = it == state.by_base.end() || it->second.id == 0 || it->second.memory != mapping.handle;
  }
  if (first_of_memory) {  // so that a driver that cannot export fails here, not in the importer
    ContextScope scope;
    int fd = -1;
    uvm_status s = scope.enter(call, found.device, ContextScope::When::always);
    if (s == UVM_OK) s = vmm_export(call, found.base, mapping, &fd);
    if (fd >= 0) close(fd);
    if (s != UVM_OK) return s;
  }
  std::lock_guard<std::mutex> lock(state.mutex);
  if (uvm_status s = start_server(call, state)) return s;
  Export& exported = state.by_base[found.base];
  if (exported.id != 0 && exported.memory != mapping.handle) {
    // New memory (a pause or offload mapped it since): handles of the old must not map this one.
    state.base_of.erase(exported.id);
    exported.id = 0;
  }
  if (exported.id == 0) {
    if (uvm_status s = random_token(call, exported.token)) {
      state.by_base.erase(found.base);
      return s;
    }
    exported.id = state.next_id++;
    exported.memory = mapping.handle;
    state.base_of[exported.id] = found.base;
  }
  ShareHandle handle;
  handle.owner_pid = getpid();
  handle.server = state.server;
  handle.export_id = exported.id;
  handle.offset = reinterpret_cast<uintptr_t>(ptr) - found.base;
  handle.size = mapping.reserved;
  handle.device = found.device;
  std::memcpy(handle.token, exported.token, kShareTokenBytes);
  *out = uvm_share_handle{};
  std::memcpy(out->bytes, &handle, sizeof(handle));
  return UVM_OK;
}

std::vector<pid_t> importers_of(uintptr_t base) {
  Exports& state = exports();
  std::lock_guard<std::mutex> lock(state.mutex);
  std::vector<pid_t> pids;
  auto it = state.by_base.find(base);
  if (it == state.by_base.end()) return pids;
  for (const Importer& importer : it->second.importers) pids.push_back(importer.pid);
  return pids;
}

}  // namespace

uvm_status check_not_shared(const Call& call, uintptr_t base, const char* what) {
  const std::vector<pid_t> pids = importers_of(base);
  if (pids.empty()) return UVM_OK;
  AllocationView found;
  const size_t size = registry().find(reinterpret_cast<const void*>(base), &found) ? found.size : 0;
  return fail(call, UVM_ERROR_SHARED,
              "the allocation at %p (%zu bytes) is mapped by process %d%s (uvm_share_import, or a tensor sent "
              "through torch.multiprocessing): %s would take its bytes from under it; the importer closes it "
              "first (uvm_share_close, or drops the tensor)",
              reinterpret_cast<void*>(base), size, static_cast<int>(pids.front()),
              pids.size() > 1 ? (" and " + std::to_string(pids.size() - 1) + " more").c_str() : "", what);
}

std::optional<Export> forget_export(uintptr_t base) {
  Exports& state = exports();
  std::lock_guard<std::mutex> lock(state.mutex);
  auto it = state.by_base.find(base);
  if (it == state.by_base.end()) return std::nullopt;
  Export taken = std::move(it->second);
  state.base_of.erase(taken.id);
  state.by_base.erase(it);  // importers keep the memory they map; their close is answered all the same
  return taken;
}

void restore_export(uintptr_t base, Export exported) {
  Exports& state = exports();
  std::lock_guard<std::mutex> lock(state.mutex);
  auto& list = exported.importers;
  const auto& open = state.connections;
  list.erase(std::remove_if(list.begin(), list.end(),
                            [&](const Importer& i) {
                              return std::find(open.begin(), open.end(), i.connection) == open.end();
                            }),
             list.end());
  state.base_of[exported.id] = base;
  state.by_base[base] = std::move(exported);
}

}  // namespace uvm

extern "C" uvm_status uvm_share_export(const void* ptr, uvm_share_handle* handle) {
  const uvm::Call call = uvm::Call::of("uvm_share_export").with_ptr(ptr);
  return uvm::guarded(call, [&] { return uvm::export_allocation(call, ptr, handle); });
}

extern "C" uvm_status uvm_share_importers(const void* ptr, int* pids, size_t capacity, size_t* count) {
  const uvm::Call call = uvm::Call::of("uvm_share_importers").with_ptr(ptr);
  return uvm::guarded(call, [&] {
    if (count == nullptr) return uvm::fail(call, UVM_ERROR_INVALID_ARGUMENT, "count is NULL");
    if (pids == nullptr && capacity > 0) return uvm::fail(call, UVM_ERROR_INVALID_ARGUMENT, "pids is NULL");
    uvm::AllocationView found;
    if (!uvm::registry().find(ptr, &found)) {
      return uvm::fail(call, UVM_ERROR_NOT_MANAGED, "the pointer is not in a uvm allocation");
    }
    const std::vector<pid_t> importers = uvm::importers_of(found.base);
    for (size_t i = 0; i < importers.size() && i < capacity; ++i) pids[i] = importers[i];
    *count = importers.size();
    return UVM_OK;
  });
}
