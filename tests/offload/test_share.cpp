// Sharing releasable memory with another process (uvm_share_export / import / close) against the
// fake driver, whose exportable physical memory lives in a memfd: the importer is a child made by
// fork, a process of its own with its own uvm, talking to the exporter over its socket. Children
// report by exit code (Catch2 is the parent's).
#include <dirent.h>
#include <poll.h>
#include <signal.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstring>
#include <string>
#include <thread>
#include <vector>

#include "../../share/wire.hpp"
#include "fixture.hpp"

namespace {
constexpr size_t kMiB = size_t{1} << 20;
constexpr size_t kSize = 4 * kMiB;

// Bytes one way between parent and child. After the fork each side keeps only its end, so that a
// reader whose writer died reads the end of the pipe instead of waiting for ever.
struct Pipe {
  int fds[2] = {-1, -1};
  Pipe() { REQUIRE(pipe(fds) == 0); }
  ~Pipe() {
    for (int fd : fds) {
      if (fd >= 0) close(fd);
    }
  }
  void keep(int end) {
    close(fds[1 - end]);
    fds[1 - end] = -1;
  }
  void reads() { keep(0); }
  void writes() { keep(1); }
  void send(char c = 'x') const { (void)!write(fds[1], &c, 1); }
  char receive() const {
    char c = 0;
    return read(fds[0], &c, 1) == 1 ? c : '\0';
  }
};

int exit_code_of(pid_t child) {
  int status = 0;
  REQUIRE(waitpid(child, &status, 0) == child);
  return WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
}

std::vector<int> importers(const void* ptr) {
  std::vector<int> pids(8);
  size_t count = 0;
  REQUIRE(uvm_share_importers(ptr, pids.data(), pids.size(), &count) == UVM_OK);
  pids.resize(count);
  return pids;
}

// An importer that exits or crashes is counted out by the exporter's thread once it sees the socket
// close: waited for, not slept on.
bool importers_drop_to_zero(const void* ptr) {
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::milliseconds(fake::kHeldWithinMs);
  while (!importers(ptr).empty()) {
    if (std::chrono::steady_clock::now() > deadline) return false;
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
  return true;
}

// The file descriptors this process has open now.
size_t open_descriptors() {
  size_t count = 0;
  DIR* dir = opendir("/proc/self/fd");
  REQUIRE(dir != nullptr);
  while (const dirent* entry = readdir(dir)) count += entry->d_name[0] != '.';
  closedir(dir);
  return count;
}

uvm::ShareHandle handle_fields(const uvm_share_handle& handle) {
  uvm::ShareHandle fields;
  std::memcpy(&fields, handle.bytes, sizeof(fields));
  return fields;
}

uvm_share_handle with_fields(const uvm::ShareHandle& fields) {
  uvm_share_handle handle{};
  std::memcpy(handle.bytes, &fields, sizeof(fields));
  return handle;
}

// A socket listening at the name a handle of (pid, server) is reached at: another process's.
int listen_as(int32_t pid, uint64_t server) {
  const int listening = socket(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0);
  REQUIRE(listening >= 0);
  sockaddr_un address;
  const socklen_t length = uvm::share_address(pid, server, &address);
  REQUIRE(bind(listening, reinterpret_cast<sockaddr*>(&address), length) == 0);
  REQUIRE(listen(listening, 4) == 0);
  return listening;
}

// The next connection to `listening`, within a few seconds; -1 if none came.
int accept_within(int listening) {
  pollfd watched{listening, POLLIN, 0};
  if (poll(&watched, 1, 5000) != 1) return -1;
  return accept(listening, nullptr, nullptr);
}

// Releasable memory made exportable (uvm_set_thread_exportable), as memory sent to another process is.
void* exportable_releasable(size_t size) {
  REQUIRE(uvm_set_thread_exportable(1) == UVM_OK);
  void* ptr = uvm_malloc_releasable(size, 0, nullptr);
  REQUIRE(uvm_set_thread_exportable(0) == UVM_OK);
  return ptr;
}

bool all_bytes(const unsigned char* p, size_t size, unsigned char value) {
  for (size_t i = 0; i < size; ++i) {
    if (p[i] != value) return false;
  }
  return true;
}
}  // namespace

TEST_CASE("another process maps exported releasable memory: the same bytes both ways, and no move takes them meanwhile",
          "[share]") {
  FakeMachine machine;
  auto* mine = static_cast<unsigned char*>(exportable_releasable(kSize));
  REQUIRE(mine != nullptr);
  std::memset(mine, 0x11, kSize);
  uvm_share_handle handle{};
  REQUIRE(uvm_share_export(mine + kMiB, &handle) == UVM_OK);  // a pointer inside it
  CHECK(importers(mine).empty());
  Pipe to_parent, to_child;
  const pid_t child = fork();
  if (child == 0) {
    to_parent.writes();
    to_child.reads();
    void* theirs = nullptr;
    if (uvm_share_import(&handle, 0, &theirs) != UVM_OK) _exit(10);
    auto* at = static_cast<unsigned char*>(theirs);  // the exported pointer: a MiB into the allocation
    if (!all_bytes(at - kMiB, kSize, 0x11)) _exit(11);
    std::memset(at, 0x22, kMiB);  // the importer writes
    to_parent.send();
    to_child.receive();
    if (!all_bytes(at + kMiB, kMiB, 0x33)) _exit(12);  // and sees what the exporter wrote meanwhile
    if (uvm_share_close(theirs) != UVM_OK) _exit(13);
    _exit(0);
  }
  to_parent.reads();
  to_child.writes();
  REQUIRE(to_parent.receive() == 'x');
  CHECK(all_bytes(mine + kMiB, kMiB, 0x22));
  CHECK(all_bytes(mine, kMiB, 0x11));  // its neighbours untouched
  CHECK(importers(mine) == std::vector<int>{child});
  // Mapped by the child: an offload, a discard or a pause would take its bytes; each fails naming it
  // and moves nothing.
  const uvm_range whole{mine, kSize};
  uvm_clear_last_error();
  CHECK(uvm_offload_ranges(&whole, 1, UVM_STRATEGY_STAGED, nullptr) == UVM_ERROR_SHARED);
  const std::string message = uvm_last_error();
  CHECK(message.find("mapped by process " + std::to_string(child)) != std::string::npos);
  CHECK(message.find("uvm_share_close") != std::string::npos);
  CHECK(cudaPeekAtLastError() == cudaSuccess);
  CHECK(uvm_discard(mine, kSize, nullptr) == UVM_ERROR_SHARED);
  REQUIRE(uvm_set_thread_tag(nullptr) == UVM_OK);
  CHECK(uvm_pause(0, "") == UVM_ERROR_SHARED);  // untagged: selects it
  CHECK(fake::mapped_reservations() >= 1);
  CHECK(all_bytes(mine + kMiB, kMiB, 0x22));
  std::memset(mine + 2 * kMiB, 0x33, kMiB);
  to_child.send();
  CHECK(exit_code_of(child) == 0);
  // The child's close waited for the exporter to count it out: no wait needed here.
  CHECK(importers(mine).empty());
  REQUIRE(uvm_offload_ranges(&whole, 1, UVM_STRATEGY_STAGED, nullptr) == UVM_OK);
  REQUIRE(uvm_onload_ranges(&whole, 1, nullptr) == UVM_OK);
  CHECK(all_bytes(mine + kMiB, kMiB, 0x22));
  CHECK(all_bytes(mine + 2 * kMiB, kMiB, 0x33));
  uvm_free(mine, kSize, 0, nullptr);
}

TEST_CASE("imports of one allocation in a process share one mapping, which stays until the last import's close",
          "[share]") {
  FakeMachine machine;
  auto* mine = static_cast<unsigned char*>(exportable_releasable(kSize));
  REQUIRE(mine != nullptr);
  std::memset(mine, 0x55, kSize);
  uvm_share_handle whole{}, inside{};
  REQUIRE(uvm_share_export(mine, &whole) == UVM_OK);
  REQUIRE(uvm_share_export(mine + kMiB, &inside) == UVM_OK);  // two tensors of one allocation
  Pipe to_parent, to_child;
  const pid_t child = fork();
  if (child == 0) {
    to_parent.writes();
    to_child.reads();
    const size_t before = fake::mapped_reservations();
    void* first = nullptr;
    void* second = nullptr;
    if (uvm_share_import(&whole, 0, &first) != UVM_OK || uvm_share_import(&inside, 0, &second) != UVM_OK) _exit(10);
    if (static_cast<unsigned char*>(second) != static_cast<unsigned char*>(first) + kMiB) _exit(11);
    if (fake::mapped_reservations() != before + 1) _exit(12);  // one mapping for both
    if (uvm_share_close(first) != UVM_OK) _exit(13);
    if (!all_bytes(static_cast<unsigned char*>(second), kMiB, 0x55)) _exit(14);  // the other import reads on
    to_parent.send();
    to_child.receive();
    if (uvm_share_close(second) != UVM_OK) _exit(15);
    if (fake::mapped_reservations() != before) _exit(16);
    if (uvm_share_close(second) != UVM_ERROR_INVALID_ARGUMENT) _exit(17);  // closed once per import, no more
    uvm_clear_last_error();
    to_parent.send();
    to_child.receive();
    _exit(0);
  }
  to_parent.reads();
  to_child.writes();
  REQUIRE(to_parent.receive() == 'x');
  CHECK(importers(mine) == std::vector<int>{child});  // one import closed, one still maps it
  to_child.send();
  REQUIRE(to_parent.receive() == 'x');
  CHECK(importers(mine).empty());  // the last close counted it out before it returned
  to_child.send();
  CHECK(exit_code_of(child) == 0);
  uvm_free(mine, kSize, 0, nullptr);
}

TEST_CASE("a region paused and resumed with free space in its segment can be shared, and an importer's writes survive "
          "the next pause",
          "[share]") {
  FakeMachine machine;
  REQUIRE(uvm_set_thread_tag("weights") == UVM_OK);
  REQUIRE(uvm_set_thread_backup(UVM_BACKUP_HOST) == UVM_OK);
  REQUIRE(uvm_report_blocks(1) == UVM_OK);  // as torch's allocator in a region: free space is dropped at a pause
  auto* mine = static_cast<unsigned char*>(exportable_releasable(kSize));
  uvm_report_blocks(0);
  uvm_set_thread_tag(nullptr);
  uvm_set_thread_backup(UVM_BACKUP_NONE);
  REQUIRE(mine != nullptr);
  const size_t live = kSize / 2;  // one tensor; the rest of the segment is free
  REQUIRE(uvm_block_allocated(mine, live) == UVM_OK);
  std::memset(mine, 0x66, live);
  REQUIRE(uvm_pause(0, "weights") == UVM_OK);
  REQUIRE(uvm_resume(0, "weights") == UVM_OK);  // the free space stays discarded: it has no bytes to keep
  REQUIRE(all_bytes(mine, live, 0x66));
  uvm_share_handle handle{};
  REQUIRE(uvm_share_export(mine, &handle) == UVM_OK);
  Pipe to_parent;
  const pid_t child = fork();
  if (child == 0) {
    to_parent.writes();
    void* theirs = nullptr;
    if (uvm_share_import(&handle, 0, &theirs) != UVM_OK) _exit(10);
    if (!all_bytes(static_cast<unsigned char*>(theirs), live, 0x66)) _exit(11);
    std::memset(theirs, 0x77, kMiB);  // the importer writes into the tensor
    if (uvm_share_close(theirs) != UVM_OK) _exit(12);
    to_parent.send();
    _exit(0);
  }
  to_parent.reads();
  REQUIRE(to_parent.receive() == 'x');
  CHECK(exit_code_of(child) == 0);
  REQUIRE(uvm_pause(0, "weights") == UVM_OK);
  REQUIRE(uvm_resume(0, "weights") == UVM_OK);
  CHECK(all_bytes(mine, kMiB, 0x77));
  CHECK(all_bytes(mine + kMiB, live - kMiB, 0x66));
  uvm_free(mine, kSize, 0, nullptr);
}

TEST_CASE("memory made exportable is exportable at every map, never swapped; a handle from before a pause maps "
          "nothing",
          "[share]") {
  FakeMachine machine;
  auto* mine = static_cast<unsigned char*>(exportable_releasable(kSize));
  auto* neighbour = static_cast<unsigned char*>(uvm_malloc_releasable(kSize, 0, nullptr));
  REQUIRE(mine != nullptr);
  REQUIRE(neighbour != nullptr);
  std::memset(mine, 0x5a, kSize);
  std::memset(neighbour, 0xa5, kSize);
  CHECK(fake::exportable_at(mine));
  // NCCL registers a peer's buffer by exporting its memory (user-buffer and graph registration):
  // memory made otherwise cannot be, and NCCL copies through its own buffers instead.
  CHECK_FALSE(fake::exportable_at(neighbour));
  fake::reset_ops();
  uvm_share_handle first{};
  REQUIRE(uvm_share_export(mine, &first) == UVM_OK);
  uvm_share_handle again{};
  REQUIRE(uvm_share_export(mine + kMiB, &again) == UVM_OK);
  for (const fake::Op& op : fake::ops()) {  // no swap: no memory made, nothing unmapped, nothing copied
    CHECK(op.call != fake::OpKind::vmm_create);
    CHECK(op.call != fake::OpKind::vmm_release);
  }
  CHECK(all_bytes(mine, kSize, 0x5a));
  // An offload, then an onload, maps new memory, exportable again; an import of the earlier export
  // is refused naming why (issue 73, item 7: a slow receiver must not map the memory mapped since).
  const uvm_range whole{mine, kSize};
  REQUIRE(uvm_offload_ranges(&whole, 1, UVM_STRATEGY_STAGED, nullptr) == UVM_OK);
  REQUIRE(uvm_onload_ranges(&whole, 1, nullptr) == UVM_OK);
  CHECK(fake::exportable_at(mine));
  CHECK(all_bytes(mine, kSize, 0x5a));
  pid_t child = fork();
  if (child == 0) {
    void* theirs = nullptr;
    const uvm_status s = uvm_share_import(&first, 0, &theirs);
    const std::string why = uvm_last_error();
    _exit(s != UVM_OK && why.find("paused or offloaded after it was exported") != std::string::npos &&
                  why.find("export it again") != std::string::npos && cudaPeekAtLastError() == cudaSuccess
              ? 0
              : 1);
  }
  CHECK(exit_code_of(child) == 0);
  uvm_share_handle later{};
  REQUIRE(uvm_share_export(mine, &later) == UVM_OK);
  child = fork();
  if (child == 0) {
    void* theirs = nullptr;
    if (uvm_share_import(&first, 0, &theirs) == UVM_OK) _exit(9);  // exported again: still refused
    if (uvm_share_import(&later, 0, &theirs) != UVM_OK) _exit(10);
    if (!all_bytes(static_cast<unsigned char*>(theirs), kSize, 0x5a)) _exit(11);
    _exit(uvm_share_close(theirs) == UVM_OK ? 0 : 12);
  }
  CHECK(exit_code_of(child) == 0);
  REQUIRE(importers_drop_to_zero(mine));
  // A free of exportable memory gives it back (never kept as spare memory for another allocation).
  REQUIRE(uvm_set_spare_limit(0, 64 * kMiB) == UVM_OK);
  uvm_free(mine, kSize, 0, nullptr);
  auto* next = static_cast<unsigned char*>(uvm_malloc_releasable(kSize, 0, nullptr));
  REQUIRE(next != nullptr);
  CHECK_FALSE(fake::exportable_at(next));
  uvm_free(next, kSize, 0, nullptr);
  uvm_free(neighbour, kSize, 0, nullptr);
  REQUIRE(uvm_set_spare_limit(0, 0) == UVM_OK);
}

// Issue 73, item 2: the first export swapped the allocation's memory for exportable memory (wait,
// copy, unmap, map at the same address), which nothing orders against kernels other threads launch:
// on an H200 a kernel launched during it lost the context (bench/probes/export_swap_race.py).
TEST_CASE("memory not made exportable is refused naming how, swapped for nothing, and exportable from its next map",
          "[share]") {
  FakeMachine machine;
  auto* mine = static_cast<unsigned char*>(uvm_malloc_releasable(kSize, 0, nullptr));
  REQUIRE(mine != nullptr);
  std::memset(mine, 0x3c, kSize);
  fake::reset_ops();
  uvm_share_handle handle{};
  CHECK(uvm_share_export(mine, &handle) == UVM_ERROR_UNSUPPORTED);
  CHECK(mentions(uvm_last_error(), "was not made exportable"));
  CHECK(mentions(uvm_last_error(), "uvm_set_thread_exportable(1)"));
  CHECK(mentions(uvm_last_error(), "exportable from its next map on"));
  CHECK(cudaPeekAtLastError() == cudaSuccess);
  CHECK(fake::ops().empty());  // no driver call: nothing swapped under running work
  CHECK_FALSE(fake::exportable_at(mine));
  CHECK(all_bytes(mine, kSize, 0x3c));
  const uvm_range whole{mine, kSize};
  REQUIRE(uvm_offload_ranges(&whole, 1, UVM_STRATEGY_STAGED, nullptr) == UVM_OK);
  REQUIRE(uvm_onload_ranges(&whole, 1, nullptr) == UVM_OK);
  CHECK(fake::exportable_at(mine));
  CHECK(all_bytes(mine, kSize, 0x3c));
  REQUIRE(uvm_share_export(mine, &handle) == UVM_OK);
  uvm_free(mine, kSize, 0, nullptr);
  // The thread's setting: 0 or 1, and only releasable allocations made while it is 1 are exportable.
  CHECK(uvm_set_thread_exportable(2) == UVM_ERROR_INVALID_ARGUMENT);
  CHECK(mentions(uvm_last_error(), "exportable is 2, not 0 or 1"));
  CHECK(uvm_get_thread_exportable() == 0);
}

// Issue 73, item 5: the export was forgotten before the driver's free; a free that failed put the
// record back but not the importers, and the next pause went through while another process mapped it.
TEST_CASE("a free that fails keeps the allocation's importers: a pause is still refused while one maps it",
          "[share][errors]") {
  FakeMachine machine;
  auto* mine = static_cast<unsigned char*>(exportable_releasable(kSize));
  REQUIRE(mine != nullptr);
  std::memset(mine, 0x44, kSize);
  uvm_share_handle handle{};
  REQUIRE(uvm_share_export(mine, &handle) == UVM_OK);
  Pipe to_parent, to_child;
  const pid_t child = fork();
  if (child == 0) {
    to_parent.writes();
    to_child.reads();
    void* theirs = nullptr;
    if (uvm_share_import(&handle, 0, &theirs) != UVM_OK) _exit(10);
    to_parent.send();
    to_child.receive();
    if (!all_bytes(static_cast<unsigned char*>(theirs), kSize, 0x44)) _exit(11);
    _exit(uvm_share_close(theirs) == UVM_OK ? 0 : 12);
  }
  to_parent.reads();
  to_child.writes();
  REQUIRE(to_parent.receive() == 'x');
  REQUIRE(importers(mine) == std::vector<int>{child});
  fake::fail_next("cuMemUnmap", cudaErrorLaunchFailure);
  uvm_free(mine, kSize, 0, nullptr);
  CHECK(uvm_last_status() == UVM_ERROR_CUDA);
  CHECK(importers(mine) == std::vector<int>{child});  // still recorded, and still counted
  REQUIRE(uvm_set_thread_tag(nullptr) == UVM_OK);
  CHECK(uvm_pause(0, "") == UVM_ERROR_SHARED);
  CHECK(mentions(uvm_last_error(), ("mapped by process " + std::to_string(child)).c_str()));
  CHECK(all_bytes(mine, kSize, 0x44));
  to_child.send();
  CHECK(exit_code_of(child) == 0);
  CHECK(importers(mine).empty());
  uvm_clear_last_error();
  uvm_free(mine, kSize, 0, nullptr);
  CHECK(uvm_last_status() == UVM_OK);
}

// Issue 73, item 3: export ids run 1, 2, 3 and the socket names are listed in /proc/net/unix, so
// an id alone let any process of the user map every export read-write.
TEST_CASE("an import needs the export's secret token: a forged or another export's handle maps nothing",
          "[share][trust]") {
  FakeMachine machine;
  auto* mine = static_cast<unsigned char*>(exportable_releasable(kSize));
  auto* other = static_cast<unsigned char*>(exportable_releasable(kSize));
  REQUIRE(mine != nullptr);
  REQUIRE(other != nullptr);
  std::memset(mine, 0x71, kSize);
  uvm_share_handle handle{}, other_handle{};
  REQUIRE(uvm_share_export(mine, &handle) == UVM_OK);
  REQUIRE(uvm_share_export(other, &other_handle) == UVM_OK);
  const uvm::ShareHandle fields = handle_fields(handle);
  CHECK_FALSE(uvm::same_token(fields.token, handle_fields(other_handle).token));  // each export its own
  uvm::ShareHandle zeroed = fields, flipped = fields, guessed = handle_fields(other_handle);
  std::memset(zeroed.token, 0, sizeof(zeroed.token));
  flipped.token[7] ^= 1;
  guessed.export_id = fields.export_id;  // this export's id, another export's token
  const uvm_share_handle forged[] = {with_fields(zeroed), with_fields(flipped), with_fields(guessed)};
  const pid_t child = fork();
  if (child == 0) {
    for (const uvm_share_handle& bad : forged) {
      void* theirs = nullptr;
      const uvm_status s = uvm_share_import(&bad, 0, &theirs);
      const std::string why = uvm_last_error();
      if (s != UVM_ERROR_INVALID_ARGUMENT || theirs != nullptr || why.find("token is not export") == std::string::npos) {
        _exit(10);
      }
      if (cudaPeekAtLastError() != cudaSuccess) _exit(11);
    }
    void* theirs = nullptr;
    if (uvm_share_import(&handle, 0, &theirs) != UVM_OK) _exit(12);  // the real one still maps
    if (!all_bytes(static_cast<unsigned char*>(theirs), kSize, 0x71)) _exit(13);
    _exit(uvm_share_close(theirs) == UVM_OK ? 0 : 14);
  }
  CHECK(exit_code_of(child) == 0);
  CHECK(importers(mine).empty());
  uvm_free(mine, kSize, 0, nullptr);
  uvm_free(other, kSize, 0, nullptr);
}

TEST_CASE("an importer sends its token only to the exporter: a process that took a gone exporter's socket name gets "
          "nothing and gives nothing",
          "[share][trust]") {
  FakeMachine machine;
  Pipe handle_pipe;
  const pid_t exporter = fork();
  if (exporter == 0) {
    handle_pipe.writes();
    void* theirs = exportable_releasable(kSize);
    uvm_share_handle handle{};
    if (theirs == nullptr || uvm_share_export(theirs, &handle) != UVM_OK) _exit(10);
    (void)!write(handle_pipe.fds[1], &handle, sizeof(handle));
    _exit(0);
  }
  handle_pipe.reads();
  uvm_share_handle handle{};
  REQUIRE(read(handle_pipe.fds[0], &handle, sizeof(handle)) == static_cast<ssize_t>(sizeof(handle)));
  REQUIRE(exit_code_of(exporter) == 0);
  const uvm::ShareHandle fields = handle_fields(handle);
  const int impostor = listen_as(fields.owner_pid, fields.server);  // this process: the name is free again
  const pid_t importer = fork();
  if (importer == 0) {
    void* theirs = nullptr;
    const uvm_status s = uvm_share_import(&handle, 0, &theirs);
    const std::string why = uvm_last_error();
    _exit(s == UVM_ERROR_INVALID_ARGUMENT &&
                  why.find("exporting process " + std::to_string(exporter) + " is answered by process " +
                           std::to_string(getppid())) != std::string::npos
              ? 0
              : 1);
  }
  const int connection = accept_within(impostor);
  REQUIRE(connection >= 0);
  uvm::ShareMessage message;
  CHECK(recv(connection, &message, sizeof(message), 0) == 0);  // closed: no token came
  CHECK(exit_code_of(importer) == 0);
  close(connection);
  close(impostor);
}

TEST_CASE("a descriptor that comes with a refusal is closed: an import that fails leaves no file open",
          "[share][trust]") {
  FakeMachine machine;
  uvm::ShareHandle fields;
  fields.owner_pid = getpid();
  fields.server = 0x5eedULL;  // a server of this process's, played by the test
  fields.export_id = 1;
  fields.size = kSize;
  const uvm_share_handle handle = with_fields(fields);
  const size_t before = open_descriptors();
  const int listening = listen_as(fields.owner_pid, fields.server);
  std::thread server([&] {
    const int connection = accept_within(listening);
    if (connection < 0) return;
    uvm::ShareMessage message;
    (void)!recv(connection, &message, sizeof(message), 0);
    uvm::ShareReply reply;
    reply.status = UVM_ERROR_INVALID_ARGUMENT;
    std::snprintf(reply.message, sizeof(reply.message), "refused by the test");
    const int memory = memfd_create("uvm-test-refused", MFD_CLOEXEC);
    iovec part{&reply, sizeof(reply)};
    msghdr sent{};
    sent.msg_iov = &part;
    sent.msg_iovlen = 1;
    alignas(cmsghdr) char control[CMSG_SPACE(sizeof(int))] = {};
    sent.msg_control = control;
    sent.msg_controllen = sizeof(control);
    cmsghdr* header = CMSG_FIRSTHDR(&sent);
    header->cmsg_level = SOL_SOCKET;
    header->cmsg_type = SCM_RIGHTS;
    header->cmsg_len = CMSG_LEN(sizeof(int));
    std::memcpy(CMSG_DATA(header), &memory, sizeof(int));
    (void)!sendmsg(connection, &sent, MSG_NOSIGNAL);
    close(memory);
    close(connection);
  });
  void* mapped = nullptr;
  CHECK(uvm_share_import(&handle, 0, &mapped) == UVM_ERROR_INVALID_ARGUMENT);
  CHECK(mentions(uvm_last_error(), "refused by the test"));
  server.join();
  close(listening);
  CHECK(open_descriptors() == before);
}

// Issue 73, item 10: an import is answered under the exporter's moves lock and waited for with no
// bound. Run with UVM_SHARE_TIMEOUT_S=1 (tests/meson.build, offload-share-timeout).
TEST_CASE("an exporter that does not answer fails the import after UVM_SHARE_TIMEOUT_S, naming it", "[.share_timeout]") {
  FakeMachine machine;
  uvm::ShareHandle fields;
  fields.owner_pid = getpid();
  fields.server = 0x7171ULL;  // a server of this process's, played by the test, that never answers
  fields.export_id = 1;
  fields.size = kSize;
  const uvm_share_handle handle = with_fields(fields);
  const int listening = listen_as(fields.owner_pid, fields.server);
  Pipe done;
  std::thread server([&] {
    const int connection = accept_within(listening);
    uvm::ShareMessage message;
    if (connection >= 0) (void)!recv(connection, &message, sizeof(message), 0);
    // Holds the connection, answering nothing, until the import has given up, or 10 s (an import
    // that never gives up then fails on the closed connection, not by hanging the test).
    pollfd given_up{done.fds[0], POLLIN, 0};
    poll(&given_up, 1, 10000);
    if (connection >= 0) close(connection);
  });
  void* mapped = nullptr;
  CHECK(uvm_share_import(&handle, 0, &mapped) == UVM_ERROR_INVALID_ARGUMENT);
  CHECK(mentions(uvm_last_error(), "did not answer within 1 s (UVM_SHARE_TIMEOUT_S)"));
  CHECK(mapped == nullptr);
  CHECK(cudaPeekAtLastError() == cudaSuccess);
  done.send();
  server.join();
  close(listening);
}

TEST_CASE("on a device that cannot export, memory asked to be exportable is refused naming the driver, at every map",
          "[scenario][no_export]") {
  FakeMachine machine;
  void* mine = exportable_releasable(kSize);
  void* plain = uvm_malloc_releasable(kSize, 0, nullptr);
  REQUIRE(mine != nullptr);
  REQUIRE(plain != nullptr);
  CHECK_FALSE(fake::exportable_at(mine));
  uvm_share_handle handle{};
  CHECK(uvm_share_export(mine, &handle) == UVM_ERROR_UNSUPPORTED);
  CHECK(mentions(uvm_last_error(), "cannot export VMM memory to another process"));
  CHECK(cudaPeekAtLastError() == cudaSuccess);
  // Memory not asked for is refused for that first; marked, its next map is refused as the other.
  CHECK(uvm_share_export(plain, &handle) == UVM_ERROR_UNSUPPORTED);
  CHECK(mentions(uvm_last_error(), "was not made exportable"));
  const uvm_range whole{plain, kSize};
  REQUIRE(uvm_offload_ranges(&whole, 1, UVM_STRATEGY_STAGED, nullptr) == UVM_OK);
  REQUIRE(uvm_onload_ranges(&whole, 1, nullptr) == UVM_OK);
  CHECK(uvm_share_export(plain, &handle) == UVM_ERROR_UNSUPPORTED);
  CHECK(mentions(uvm_last_error(), "cannot export VMM memory to another process"));
  CHECK(cudaPeekAtLastError() == cudaSuccess);
  uvm_free(mine, kSize, 0, nullptr);
  uvm_free(plain, kSize, 0, nullptr);
}

TEST_CASE("an importer that crashes, or exits without closing, counts no longer", "[share]") {
  for (const bool crash : {true, false}) {
    CAPTURE(crash);
    FakeMachine machine;
    void* mine = exportable_releasable(kSize);
    REQUIRE(mine != nullptr);
    uvm_share_handle handle{};
    REQUIRE(uvm_share_export(mine, &handle) == UVM_OK);
    Pipe to_parent;
    const pid_t child = fork();
    if (child == 0) {
      to_parent.writes();
      void* theirs = nullptr;
      if (uvm_share_import(&handle, 0, &theirs) != UVM_OK) _exit(10);
      to_parent.send();
      if (crash) raise(SIGKILL);
      _exit(0);  // never closes it
    }
    to_parent.reads();
    REQUIRE(to_parent.receive() == 'x');
    CHECK(exit_code_of(child) == (crash ? 128 + SIGKILL : 0));
    REQUIRE(importers_drop_to_zero(mine));
    const uvm_range whole{mine, kSize};
    CHECK(uvm_offload_ranges(&whole, 1, UVM_STRATEGY_STAGED, nullptr) == UVM_OK);
    uvm_free(mine, kSize, 0, nullptr);
  }
}

// Issue 73, item 4: a forked child (a DataLoader worker) kept the importer's connection, so a
// crashed importer stayed counted, and the exporter's pauses failed, for the child's whole life.
TEST_CASE("an importer that crashes counts no longer while a child it forked lives on", "[share]") {
  FakeMachine machine;
  void* mine = exportable_releasable(kSize);
  REQUIRE(mine != nullptr);
  uvm_share_handle handle{};
  REQUIRE(uvm_share_export(mine, &handle) == UVM_OK);
  Pipe to_parent, release_worker;
  const pid_t importer = fork();
  if (importer == 0) {
    to_parent.writes();
    void* theirs = nullptr;
    if (uvm_share_import(&handle, 0, &theirs) != UVM_OK) _exit(10);
    if (fork() == 0) {  // the worker: lives until the test lets it go
      release_worker.reads();
      release_worker.receive();
      _exit(0);
    }
    to_parent.send();
    raise(SIGKILL);
  }
  to_parent.reads();
  REQUIRE(to_parent.receive() == 'x');
  CHECK(exit_code_of(importer) == 128 + SIGKILL);
  CHECK(importers_drop_to_zero(mine));  // the worker still runs
  REQUIRE(uvm_set_thread_tag(nullptr) == UVM_OK);
  CHECK(uvm_pause(0, "") == UVM_OK);
  CHECK(uvm_resume(0, "") == UVM_OK);
  release_worker.writes();
  release_worker.send();
  uvm_free(mine, kSize, 0, nullptr);
}

TEST_CASE("an exporter that exits leaves the importer its memory, and the importer's close returns", "[share]") {
  FakeMachine machine;
  Pipe handle_pipe, to_child;
  const pid_t child = fork();
  if (child == 0) {  // the exporter
    handle_pipe.writes();
    to_child.reads();
    auto* theirs = static_cast<unsigned char*>(exportable_releasable(kSize));
    if (theirs == nullptr) _exit(10);
    std::memset(theirs, 0x44, kSize);
    uvm_share_handle handle{};
    if (uvm_share_export(theirs, &handle) != UVM_OK) _exit(11);
    (void)!write(handle_pipe.fds[1], &handle, sizeof(handle));
    to_child.receive();  // the parent has imported it
    _exit(0);  // with an importer that never closed: no hang, no abort
  }
  handle_pipe.reads();
  to_child.writes();
  uvm_share_handle handle{};
  REQUIRE(read(handle_pipe.fds[0], &handle, sizeof(handle)) == static_cast<ssize_t>(sizeof(handle)));
  void* mapped = nullptr;
  REQUIRE(uvm_share_import(&handle, 0, &mapped) == UVM_OK);
  to_child.send();
  CHECK(exit_code_of(child) == 0);
  CHECK(all_bytes(static_cast<unsigned char*>(mapped), kSize, 0x44));  // still there, the exporter gone
  CHECK(uvm_share_close(mapped) == UVM_OK);
  CHECK(fake::mapped_reservations() == 0);
  CHECK(fake::physical_handles() == 0);
  // A handle of a process that is gone fails naming it.
  void* again = nullptr;
  uvm_clear_last_error();
  CHECK(uvm_share_import(&handle, 0, &again) == UVM_ERROR_INVALID_ARGUMENT);
  CHECK(std::string(uvm_last_error()).find("process " + std::to_string(child) + " cannot be reached") !=
        std::string::npos);
  CHECK(cudaPeekAtLastError() == cudaSuccess);
}

TEST_CASE("what cannot be shared fails naming why, in the exporter or the importer", "[share]") {
  FakeMachine machine;
  SECTION("managed memory: CUDA has no IPC for it") {
    void* managed = uvm_malloc(kMiB, 0, nullptr);
    REQUIRE(managed != nullptr);
    uvm_share_handle handle{};
    CHECK(uvm_share_export(managed, &handle) == UVM_ERROR_UNSUPPORTED);
    CHECK(std::string(uvm_last_error()).find("managed memory (cudaMallocManaged), which CUDA cannot share") !=
          std::string::npos);
    uvm_free(managed, kMiB, 0, nullptr);
  }
  SECTION("memory that is not uvm's, a null handle, bytes that are not a handle") {
    int local = 0;
    uvm_share_handle handle{};
    CHECK(uvm_share_export(&local, &handle) == UVM_ERROR_NOT_MANAGED);
    void* p = nullptr;
    CHECK(uvm_share_import(&handle, 0, &p) == UVM_ERROR_INVALID_ARGUMENT);
    CHECK(std::string(uvm_last_error()).find("not a handle made by uvm_share_export") != std::string::npos);
    CHECK(uvm_share_import(nullptr, 0, &p) == UVM_ERROR_INVALID_ARGUMENT);
    CHECK(uvm_share_close(&local) == UVM_ERROR_INVALID_ARGUMENT);
  }
  SECTION("an offloaded allocation, exported or imported") {
    void* mine = exportable_releasable(kSize);
    REQUIRE(mine != nullptr);
    uvm_share_handle handle{};
    REQUIRE(uvm_share_export(mine, &handle) == UVM_OK);
    const uvm_range whole{mine, kSize};
    REQUIRE(uvm_offload_ranges(&whole, 1, UVM_STRATEGY_STAGED, nullptr) == UVM_OK);
    CHECK(uvm_share_export(mine, &handle) == UVM_ERROR_INVALID_ARGUMENT);
    CHECK(std::string(uvm_last_error()).find("offloaded or paused") != std::string::npos);
    const pid_t child = fork();
    if (child == 0) {
      void* theirs = nullptr;
      const uvm_status s = uvm_share_import(&handle, 0, &theirs);
      const std::string why = uvm_last_error();
      _exit(s == UVM_ERROR_INVALID_ARGUMENT && why.find("refused") != std::string::npos &&
                    why.find("offloaded or paused") != std::string::npos
                ? 0
                : 1);
    }
    CHECK(exit_code_of(child) == 0);
    REQUIRE(uvm_onload_ranges(&whole, 1, nullptr) == UVM_OK);
    uvm_free(mine, kSize, 0, nullptr);
  }
  SECTION("a freed allocation: a new one at its address is another export") {
    void* mine = exportable_releasable(kSize);
    REQUIRE(mine != nullptr);
    uvm_share_handle handle{};
    REQUIRE(uvm_share_export(mine, &handle) == UVM_OK);
    uvm_free(mine, kSize, 0, nullptr);
    fake::reserve_next_at(mine);
    void* again = exportable_releasable(kSize);
    REQUIRE(again == mine);
    const pid_t child = fork();
    if (child == 0) {
      void* theirs = nullptr;
      const uvm_status s = uvm_share_import(&handle, 0, &theirs);
      _exit(s == UVM_ERROR_INVALID_ARGUMENT && std::string(uvm_last_error()).find("was freed") != std::string::npos
                ? 0
                : 1);
    }
    CHECK(exit_code_of(child) == 0);
    uvm_free(again, kSize, 0, nullptr);
  }
  // (A colon far into a section's name makes Catch2 2.13 wrap it for ever when the section fails.)
  SECTION("a refused import: the driver cannot map it for a peer GPU; it fails naming the call and the device, "
          "maps nothing, and the exporter counts it out") {
    void* mine = exportable_releasable(kSize);
    REQUIRE(mine != nullptr);
    uvm_share_handle handle{};
    REQUIRE(uvm_share_export(mine, &handle) == UVM_OK);
    const pid_t child = fork();
    if (child == 0) {
      const size_t mapped_before = fake::mapped_reservations();
      fake::fail_next("cuMemSetAccess", cudaErrorPeerAccessUnsupported);
      void* theirs = nullptr;
      const uvm_status s = uvm_share_import(&handle, 1, &theirs);
      const std::string why = uvm_last_error();
      const bool named = why.find("cuMemSetAccess") != std::string::npos && why.find("device 1") != std::string::npos;
      const bool clean = cudaPeekAtLastError() == cudaSuccess && fake::mapped_reservations() == mapped_before;
      _exit(s == UVM_ERROR_CUDA && named && clean ? 0 : 1);
    }
    CHECK(exit_code_of(child) == 0);
    REQUIRE(importers_drop_to_zero(mine));
    const uvm_range whole{mine, kSize};
    CHECK(uvm_offload_ranges(&whole, 1, UVM_STRATEGY_STAGED, nullptr) == UVM_OK);
    uvm_free(mine, kSize, 0, nullptr);
  }
  SECTION("a driver that cannot export: the export fails, naming the call, with nothing pending") {
    void* mine = exportable_releasable(kSize);
    REQUIRE(mine != nullptr);
    uvm_share_handle handle{};
    fake::fail_next("cuMemExportToShareableHandle", cudaErrorNotSupported);
    CHECK(uvm_share_export(mine, &handle) == UVM_ERROR_CUDA);
    CHECK(std::string(uvm_last_error()).find("cuMemExportToShareableHandle") != std::string::npos);
    CHECK(cudaPeekAtLastError() == cudaSuccess);
    uvm_free(mine, kSize, 0, nullptr);
  }
}

TEST_CASE("exportable memory is never kept as spare memory: an importer may still map it, and a spare goes to any "
          "allocation",
          "[share]") {
  FakeMachine machine;
  REQUIRE(uvm_set_spare_limit(0, 4 * kSize) == UVM_OK);  // room to keep both
  auto* exported = static_cast<unsigned char*>(exportable_releasable(kSize));
  auto* plain = static_cast<unsigned char*>(uvm_malloc_releasable(kSize, 0, nullptr));
  REQUIRE((exported != nullptr && plain != nullptr));
  std::memset(exported, 0x5a, kSize);
  const uvm_range ranges[] = {{exported, kSize}, {plain, kSize}};
  fake::reset_ops();
  REQUIRE(uvm_offload_ranges(&ranges[0], 1, UVM_STRATEGY_STAGED, nullptr) == UVM_OK);
  CHECK(FakeMachine::ops_named(fake::OpKind::vmm_release).size() == 1);  // given back to the driver
  uvm_stats stats{};
  REQUIRE(uvm_get_stats(0, &stats) == UVM_OK);
  CHECK(stats.spare_bytes == 0);
  REQUIRE(uvm_offload_ranges(&ranges[1], 1, UVM_STRATEGY_STAGED, nullptr) == UVM_OK);  // memory of its own: kept
  REQUIRE(uvm_get_stats(0, &stats) == UVM_OK);
  CHECK(stats.spare_bytes >= kSize);
  REQUIRE(uvm_onload_ranges(ranges, 2, nullptr) == UVM_OK);
  CHECK(all_bytes(exported, kSize, 0x5a));
  CHECK(fake::exportable_at(exported));
  uvm_free(exported, kSize, 0, nullptr);
  uvm_free(plain, kSize, 0, nullptr);
  REQUIRE(uvm_set_spare_limit(0, 0) == UVM_OK);
  CHECK(cudaPeekAtLastError() == cudaSuccess);
}
