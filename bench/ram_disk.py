"""A disk faster than the device machine's virtual one, for the disk-backup benchmarks.

The device machine has one virtual disk (about 1.3 GB/s) and no NVMe drive, so both libraries' disk
backups run into it alike. `ram_disk(gib)` loop-mounts an ext4 image kept in /dev/shm, which reads
at 4-5 GB/s: a stand-in for a local NVMe drive, where what each library's way of moving the bytes
costs shows. Needs root (mount), mkfs.ext4 and losetup; the image uses host memory while it lives.
"""
from __future__ import annotations

import contextlib
import os
import subprocess
import tempfile


@contextlib.contextmanager
def ram_disk(gib: float):
    """Yields the mount point of a fresh ext4 file system of `gib` GiB whose image lives in /dev/shm,
    and removes both after."""
    fd, image = tempfile.mkstemp(prefix="uvm-ram-disk-", suffix=".img", dir="/dev/shm")
    os.close(fd)
    mount = tempfile.mkdtemp(prefix="uvm-ram-disk-")
    try:
        subprocess.run(["truncate", "-s", f"{int(gib * 1024)}M", image], check=True)
        subprocess.run(["mkfs.ext4", "-q", "-F", "-m", "0", image], check=True)
        subprocess.run(["mount", "-o", "loop", image, mount], check=True)
        try:
            yield mount
        finally:
            subprocess.run(["umount", mount], check=False)
    finally:
        os.unlink(image)
        os.rmdir(mount)
