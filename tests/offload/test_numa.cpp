// Staging memory near its GPU (offload/media/numa.cpp): the node a PCI device hangs off, read from a
// sysfs tree made here, and the kernel's placement of mapped pages on a node.
#include <sys/mman.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <cerrno>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <string>

#include "../../offload/media/numa.hpp"
#include "fixture.hpp"

namespace {

namespace fs = std::filesystem;

// A sysfs tree with `nodes` NUMA nodes and the PCI device 0000:18:00.0 on `device_node` (as
// written in its numa_node file); removed with the object.
struct FakeSysfs {
  FakeSysfs(int nodes, const std::string& device_node) {
    char pattern[] = "/tmp/uvm-sysfs-XXXXXX";
    REQUIRE(mkdtemp(pattern) != nullptr);
    root = pattern;
    fs::create_directories(root / "devices/system/node");
    fs::create_directories(root / "devices/system/node/power");  // not a node: sysfs has such entries
    for (int n = 0; n < nodes; ++n) fs::create_directories(root / "devices/system/node" / ("node" + std::to_string(n)));
    fs::create_directories(root / "bus/pci/devices/0000:18:00.0");
    std::ofstream(root / "bus/pci/devices/0000:18:00.0/numa_node") << device_node << "\n";
  }
  ~FakeSysfs() { fs::remove_all(root); }
  fs::path root;
};

}  // namespace

TEST_CASE("a GPU's NUMA node is its PCI device's, where the host has more than one node", "[numa]") {
  const FakeSysfs two(2, "1");
  // The runtime writes an eight-digit domain in capitals; sysfs names four, in lower case.
  CHECK(uvm::numa_node_of_pci(two.root, "00000000:18:00.0") == 1);
  CHECK(uvm::numa_node_of_pci(two.root, "0000:18:00.0") == 1);
  CHECK(uvm::numa_node_of_pci(two.root, "00000000:3B:00.0") == -1);  // not in the tree
  const FakeSysfs unknown(2, "-1");
  CHECK(uvm::numa_node_of_pci(unknown.root, "0000:18:00.0") == -1);
  const FakeSysfs one(1, "0");
  CHECK(uvm::numa_node_of_pci(one.root, "0000:18:00.0") == -1);  // one node: nothing to choose
  CHECK(uvm::numa_node_of_pci("/nonexistent", "0000:18:00.0") == -1);
  // A domain wider than four digits (Intel VMD puts GPUs behind domain 10000): sysfs names it whole.
  fs::create_directories(two.root / "bus/pci/devices/10000:e1:00.0");
  std::ofstream(two.root / "bus/pci/devices/10000:e1:00.0/numa_node") << "0\n";
  CHECK(uvm::numa_node_of_pci(two.root, "00010000:E1:00.0") == 0);
}

TEST_CASE("mapped pages are placed on the node asked for, before any is faulted in", "[numa]") {
  const size_t bytes = size_t{4} << 20;
  void* host = mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  REQUIRE(host != MAP_FAILED);
  std::string why;
  CHECK_FALSE(uvm::prefer_node(host, bytes, -1, &why));  // no node: nothing asked
  if (uvm::prefer_node(host, bytes, 0, &why)) {
    int mode = -1;
    unsigned long nodes[16] = {};
    constexpr unsigned long kFlagAddress = 2;  // MPOL_F_ADDR: the policy of the page at `host`
    REQUIRE(syscall(SYS_get_mempolicy, &mode, nodes, 16 * 64 + 1, host, kFlagAddress) == 0);
    CHECK(mode == 1);  // MPOL_PREFERRED
    CHECK(nodes[0] == 1);  // node 0 only
    static_cast<char*>(host)[0] = 1;  // and the memory works
  } else {
    WARN("the kernel refused mbind here (" << why << "): placement is a hint, not checked on this machine");
    CHECK(why.find("mbind(node 0)") == 0);
  }
  munmap(host, bytes);
}

TEST_CASE("staging memory goes on the node sysfs gives for the runtime's PCI address of the device", "[numa]") {
  FakeMachine machine;
  char id[64] = {};
  REQUIRE(cudaDeviceGetPCIBusId(id, sizeof id, 0) == cudaSuccess);
  CHECK(uvm::staging_node_for(0) == uvm::numa_node_of_pci("/sys", id));  // this machine's tree
  CHECK(uvm::staging_node_for(0) == uvm::staging_node_for(0));
  CHECK(uvm::staging_node_for(-1) == -1);  // no device: nowhere in particular
  // Where the runtime cannot say, nowhere in particular, and no error is left pending.
  fake::fail_next("cudaDeviceGetPCIBusId", cudaErrorInvalidDevice);
  CHECK(uvm::staging_node_for(2) == -1);
  CHECK(!fake::injection_left("cudaDeviceGetPCIBusId"));  // asked, not taken from an earlier answer
  CHECK(cudaPeekAtLastError() == cudaSuccess);
}
