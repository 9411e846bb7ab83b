#!/usr/bin/env bash
# Builds docs/examples/offload_demo.c the way another runtime would: against an installed uvm
# found by `pkg-config uvm` (staged with meson install --destdir), then runs it.
#   cpu mode: without a GPU the program must say so and exit 2; with one, its run is the gpu test's.
#   gpu mode: exits 77 (skip) without a GPU; else the program must finish its offload cycle.
set -euo pipefail
build=$1 source=$2 mode=$3
stage=$(mktemp -d)
trap 'rm -rf "$stage"' EXIT
meson install -C "$build" --destdir "$stage" --no-rebuild --quiet >/dev/null
pc=$(find "$stage" -name uvm.pc | head -n 1)
[ -n "$pc" ] || { echo "FAIL: meson install wrote no uvm.pc"; exit 1; }
prefix=$(sed -n 's/^prefix=//p' "$pc")
flags=$(PKG_CONFIG_PATH=$(dirname "$pc") pkg-config --define-variable=prefix="$stage$prefix" --cflags --libs uvm)
cc -std=c99 -Wall -Wextra -Werror -o "$stage/offload_demo" "$source/docs/examples/offload_demo.c" $flags
echo "built with: cc offload_demo.c $flags"
# At run time, every -L directory pkg-config named (staged uvm; a CUDA toolkit that ld.so may not know).
libdirs=$(tr ' ' '\n' <<<"$flags" | sed -n 's/^-L//p' | paste -sd:)
set +e
output=$(LD_LIBRARY_PATH="$libdirs${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}" "$stage/offload_demo" 2>&1)
status=$?
set -e
echo "$output"
if [ "$status" -eq 2 ]; then
  if [ "$mode" = gpu ]; then echo "SKIP: no CUDA device, so the example cannot run"; exit 77; fi
  grep -q "no CUDA device is present" <<<"$output" || { echo "FAIL: no clear no-device message"; exit 1; }
  echo "All tests passed (example built via pkg-config; no-device path)"
  exit 0
fi
if [ "$mode" = cpu ]; then echo "All tests passed (example built via pkg-config; run left to the gpu suite)"; exit 0; fi
[ "$status" -eq 0 ] && grep -q '^done$' <<<"$output" || { echo "FAIL: example exited $status"; exit 1; }
echo "All tests passed (example ran on the GPU)"
