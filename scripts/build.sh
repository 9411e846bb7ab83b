# Sourced by demo.sh and test.sh: installs missing tools, then configures (once) and builds uvm
# into ${UVM_BUILD_DIR:-build}, which it leaves in $build.
source scripts/install_deps.sh
build=${UVM_BUILD_DIR:-build}
[ -f "$build/build.ninja" ] || meson setup "$build" >/dev/null
ninja -C "$build"
