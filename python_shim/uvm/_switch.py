"""The switch (UVM_SWITCH), by its name inside the package: the module itself is uvm_switch, beside
the package, so that uvm_switch.pth imports it without uvm's modules."""
import sys

import uvm_switch

sys.modules[__name__] = uvm_switch  # one module: one finder class, one record of what was said
