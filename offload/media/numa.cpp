#include "numa.hpp"

#include <cuda_runtime_api.h>
#include <dirent.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <cctype>
#include <cerrno>
#include <cstring>
#include <fstream>
#include <map>
#include <mutex>
#include <vector>

#include "../../alloc/errors.hpp"
#include "../../alloc/options.hpp"

namespace uvm {
namespace {

// mbind's mode for "this node first, others when it is full" (linux/mempolicy.h's MPOL_PREFERRED:
// its header comes with libnuma's development files, which uvm does not need).
constexpr long kPreferred = 1;
constexpr size_t kMaskBits = 8 * sizeof(unsigned long);

// How many NUMA nodes sysfs lists (directories node0, node1, ...).
int node_count(const std::string& sysfs) {
  DIR* nodes = opendir((sysfs + "/devices/system/node").c_str());
  if (nodes == nullptr) return 0;
  int count = 0;
  while (const dirent* entry = readdir(nodes)) {
    const char* name = entry->d_name;
    if (std::strncmp(name, "node", 4) == 0 && name[4] != '\0' && std::isdigit(static_cast<unsigned char>(name[4]))) {
      ++count;
    }
  }
  closedir(nodes);
  return count;
}

// sysfs's name for a PCI address: lower case, a domain of at least four digits without the leading
// zeros the runtime pads it to eight with (a VMD domain, 10000, keeps all five).
std::string sysfs_pci_name(std::string id) {
  for (char& c : id) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  size_t colon = id.find(':');
  while (colon != std::string::npos && colon > 4 && id[0] == '0') {
    id.erase(0, 1);
    --colon;
  }
  return id;
}

}  // namespace

int numa_node_of_pci(const std::string& sysfs, const std::string& pci_bus_id) {
  if (node_count(sysfs) <= 1) return -1;
  std::ifstream file(sysfs + "/bus/pci/devices/" + sysfs_pci_name(pci_bus_id) + "/numa_node");
  int node = -1;
  if (!(file >> node) || node < 0) return -1;
  return node;
}

int staging_node_for(int device) {
  if (device < 0 || !options().pin_numa) return -1;
  static auto* mutex = new std::mutex();  // never destroyed: no code runs from static destructors
  static auto* known = new std::map<int, int>();
  std::lock_guard<std::mutex> lock(*mutex);
  if (auto found = known->find(device); found != known->end()) return found->second;
  char id[64] = {};
  int node = -1;
  if (clear_cuda_error(cudaDeviceGetPCIBusId(id, sizeof id, device)) == cudaSuccess) node = numa_node_of_pci("/sys", id);
  (*known)[device] = node;
  return node;
}

bool prefer_node(void* host, size_t bytes, int node, std::string* why) {
  if (node < 0) return false;
  std::vector<unsigned long> mask(static_cast<size_t>(node) / kMaskBits + 1, 0);
  mask[static_cast<size_t>(node) / kMaskBits] = 1UL << (static_cast<size_t>(node) % kMaskBits);
  // The kernel reads one bit fewer than the count it is given.
  const unsigned long bits = mask.size() * kMaskBits + 1;
  if (syscall(SYS_mbind, host, bytes, kPreferred, mask.data(), bits, 0) != 0) {
    *why = std::string("mbind(node ") + std::to_string(node) + "): " + std::strerror(errno);
    return false;
  }
  return true;
}

}  // namespace uvm
