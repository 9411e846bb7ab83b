// Staging memory near its GPU. On a host with more than one NUMA node (several CPU sockets), host
// memory on the far node reaches a GPU across the link between the sockets; pinned memory for a
// GPU's copies is placed on the node its PCI device hangs off. On a host with one node nothing
// changes. UVM_PIN_NUMA=off leaves the placement to the kernel.
#pragma once

#include <cstddef>
#include <string>

namespace uvm {

// The NUMA node of the PCI device `pci_bus_id` ("0000:18:00.0", as cudaDeviceGetPCIBusId writes
// it) under the sysfs tree at `sysfs` ("/sys"); -1 where the host has one node or fewer, or sysfs
// does not say (no such device, "-1" in its numa_node).
int numa_node_of_pci(const std::string& sysfs, const std::string& pci_bus_id);

// The node staging memory for `device`'s copies goes on: numa_node_of_pci for its PCI address,
// looked up once per device; -1 (nowhere in particular) under UVM_PIN_NUMA=off, for no device
// (-1), or where the runtime cannot name its PCI address (its error cleared).
int staging_node_for(int device);

// Asks the kernel to place the pages of `bytes` at `host`, mapped and not yet faulted in, on
// `node` (preferred: where that node is full, elsewhere, never a failure at fault time). A hint as
// huge pages are: false, and `*why` says why, where the kernel refused (a container's seccomp
// profile may forbid mbind); the memory works either way.
bool prefer_node(void* host, size_t bytes, int node, std::string* why);

}  // namespace uvm
