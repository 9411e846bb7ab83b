#!/usr/bin/env bash
# Runs the offload tests' [small_fs] cases on a real, small file system: ext4 made in a 24 MiB
# file (no journal, no blocks reserved for root, so that free space is what root can write) and
# loop-mounted, so that a full disk is the kernel's ENOSPC and not a stand-in. Loop
# mounts need root (or CAP_SYS_ADMIN) and loop devices; where either is missing this exits 77
# (meson's skip) and says which.
# Usage: small_fs.sh OFFLOAD_TESTS_PROGRAM
set -uo pipefail
program=$1

skip() {
  echo "SKIP: the small-file-system disk-full test needs $1"
  exit 77
}
[ "$(id -u)" = 0 ] || skip "root to loop-mount a file system (running as uid $(id -u))"
command -v mkfs.ext4 >/dev/null || skip "mkfs.ext4 (Debian package e2fsprogs)"

work=$(mktemp -d "$PWD/uvm-small-fs-XXXXXX")  # meson's working directory: the build directory
cleanup() {
  mountpoint -q "$work/mnt" && umount "$work/mnt"
  rm -rf "$work"
}
trap cleanup EXIT
truncate -s 24M "$work/image"
mkfs.ext4 -q -m 0 -O ^has_journal "$work/image" || { echo "mkfs.ext4 failed"; exit 1; }
mkdir "$work/mnt"
if ! why=$(mount -o loop "$work/image" "$work/mnt" 2>&1); then
  skip "a loop mount, which this machine refused: $why"
fi
mkdir "$work/mnt/backups"
echo "small file system: $(df -h "$work/mnt" | tail -1)"
UVM_TEST_SMALL_FS="$work/mnt/backups" "$program" '[small_fs]'
