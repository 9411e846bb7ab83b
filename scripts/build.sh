# Sourced by demo.sh and test.sh: installs missing tools, then configures and builds uvm into
# ${UVM_BUILD_DIR:-build}, which it leaves in $build. With UVM_DEPS=tests (test.sh) it builds
# everything, the test programs too; otherwise (demo.sh) only the library and the demo: a build
# directory made by the demo has the tests off, and test.sh turns them on in the same directory,
# keeping the library's objects.
source scripts/install_deps.sh
build=${UVM_BUILD_DIR:-build}
if [ "${UVM_DEPS:-build}" = tests ]; then
  if [ ! -f "$build/build.ninja" ]; then
    meson setup "$build" >/dev/null
  elif meson introspect --buildoptions "$build" |
       python3 -c 'import json, sys; sys.exit(any(o["name"] == "tests" and o["value"] is False for o in json.load(sys.stdin)) == 0)'; then
    meson configure "$build" -Dtests=true >/dev/null
  fi
  ninja -C "$build"
else
  [ -f "$build/build.ninja" ] || meson setup "$build" -Dtests=false >/dev/null
  ninja -C "$build" uvm_demo
fi
