"""How fast can a backup file come back from this disk, read which way? (issue 26: uvm's disk resume)

Writes one file of --gib GiB with O_DIRECT, then reads it into host memory every way below, the page
cache dropped before each read (posix_fadvise DONTNEED on the file, and /proc/sys/vm/drop_caches
where writable), in rounds so that the disk's drift touches every way alike:

  direct T×M   O_DIRECT, T threads taking M MiB requests in file order from a shared cursor (uvm today:
               8 threads × 16 MiB)
  buffered 1×256  one thread, buffered pread of 256 MiB at a time (torch_memory_saver 0.0.10's resume)
  buffered T×M + seq   T threads, buffered, the file advised POSIX_FADV_SEQUENTIAL
  willneed T×M  the whole file advised POSIX_FADV_WILLNEED first, then T threads read it buffered

--ram-disk GIB probes a loop-mounted ext4 image in /dev/shm instead of --dir (bench/ram_disk.py).

Prints GB/s per way and round, and the median; --json writes them. Needs no GPU.
"""
from __future__ import annotations

import argparse
import json
import mmap
import os
import statistics
import threading
import time

from ram_disk import ram_disk

MiB = 1 << 20


def drop_cache(path: str) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
        os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
    finally:
        os.close(fd)
    try:
        with open("/proc/sys/vm/drop_caches", "w") as f:
            f.write("1\n")
    except OSError:
        pass


def write_file(path: str, size: int) -> float:
    buffer = mmap.mmap(-1, 64 * MiB)
    for i in range(0, 64 * MiB, 4096):
        buffer[i:i + 8] = i.to_bytes(8, "little")
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_DIRECT, 0o600)
    start = time.perf_counter()
    try:
        for offset in range(0, size, 64 * MiB):
            os.pwritev(fd, [buffer], offset)
        os.fsync(fd)
    finally:
        os.close(fd)
    return size / (time.perf_counter() - start) / 1e9


def read_threads(path: str, size: int, threads: int, request: int, direct: bool, advice: int | None,
                 willneed: bool) -> float:
    fd = os.open(path, os.O_RDONLY | (os.O_DIRECT if direct else 0))
    cursor = [0]
    lock = threading.Lock()
    failures: list[BaseException] = []

    def work():
        buffer = mmap.mmap(-1, request)  # page-aligned, as O_DIRECT wants
        view = memoryview(buffer)
        try:
            while True:
                with lock:
                    offset = cursor[0]
                    cursor[0] += request
                if offset >= size:
                    return
                want = min(request, size - offset)
                got = os.preadv(fd, [view[:want]], offset)
                if got != want:
                    raise OSError(f"short read at {offset}: {got} of {want}")
        except BaseException as error:  # noqa: BLE001 - reported by the caller
            failures.append(error)
        finally:
            view.release()
            buffer.close()

    try:
        start = time.perf_counter()
        if advice is not None:
            os.posix_fadvise(fd, 0, 0, advice)
        if willneed:
            os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_WILLNEED)
        workers = [threading.Thread(target=work) for _ in range(threads)]
        for w in workers:
            w.start()
        for w in workers:
            w.join()
        seconds = time.perf_counter() - start
    finally:
        os.close(fd)
    if failures:
        raise failures[0]
    return size / seconds / 1e9


WAYS = {
    "direct 1x64": dict(threads=1, request=64 * MiB, direct=True, advice=None, willneed=False),
    "direct 2x64": dict(threads=2, request=64 * MiB, direct=True, advice=None, willneed=False),
    "direct 1x16": dict(threads=1, request=16 * MiB, direct=True, advice=None, willneed=False),
    "direct 8x16 (uvm)": dict(threads=8, request=16 * MiB, direct=True, advice=None, willneed=False),
    "direct 16x16": dict(threads=16, request=16 * MiB, direct=True, advice=None, willneed=False),
    "direct 4x64": dict(threads=4, request=64 * MiB, direct=True, advice=None, willneed=False),
    "direct 8x64": dict(threads=8, request=64 * MiB, direct=True, advice=None, willneed=False),
    "direct 2x256": dict(threads=2, request=256 * MiB, direct=True, advice=None, willneed=False),
    "buffered 1x256 (peer)": dict(threads=1, request=256 * MiB, direct=False, advice=None, willneed=False),
    "buffered 8x16 + seq": dict(threads=8, request=16 * MiB, direct=False, advice=os.POSIX_FADV_SEQUENTIAL,
                                willneed=False),
    "buffered 1x16 + seq": dict(threads=1, request=16 * MiB, direct=False, advice=os.POSIX_FADV_SEQUENTIAL,
                                willneed=False),
    "willneed 8x16": dict(threads=8, request=16 * MiB, direct=False, advice=None, willneed=True),
}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--dir", default="/var/tmp/uvm-disk-probe")
    parser.add_argument("--gib", type=float, default=4.0)
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--ram-disk", type=float, metavar="GIB", help="probe a RAM-backed loop disk of GIB GiB (root)")
    parser.add_argument("--json")
    args = parser.parse_args()
    if args.ram_disk:
        with ram_disk(args.ram_disk) as mount:
            args.dir = mount
            probe(args)
    else:
        os.makedirs(args.dir, exist_ok=True)
        probe(args)


def probe(args: argparse.Namespace) -> None:
    path = os.path.join(args.dir, "probe.bin")
    size = int(args.gib * (1 << 30))
    results: dict[str, list[float]] = {"write direct 1x64": [write_file(path, size)]}
    try:
        for _ in range(args.rounds):
            for name, way in WAYS.items():
                drop_cache(path)
                results.setdefault(name, []).append(read_threads(path, size, **way))
                print(f"{name:24s} {results[name][-1]:6.2f} GB/s", flush=True)
    finally:
        os.unlink(path)
    print(f"\n{'way':24s} {'median GB/s':>11s}  rounds")
    for name, values in results.items():
        print(f"{name:24s} {statistics.median(values):11.2f}  {' '.join(f'{v:.2f}' for v in values)}")
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"gib": args.gib, "dir": args.dir, "ram_disk_gib": args.ram_disk, "results": results}, f, indent=1)


if __name__ == "__main__":
    main()
