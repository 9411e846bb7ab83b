"""How fast can a backup file come back from this disk, read which way? (issue 26: uvm's disk resume)

Writes one file of --gib GiB with O_DIRECT, then reads it into host memory every way below, the page
cache dropped before each read (posix_fadvise DONTNEED on the file, and /proc/sys/vm/drop_caches
where writable), in rounds so that the disk's drift touches every way alike:

  direct T×M   O_DIRECT, T threads taking M MiB requests in file order from a shared cursor (uvm today:
               8 threads × 16 MiB)
  buffered 1×256  one thread, buffered pread of 256 MiB at a time (torch_memory_saver 0.0.10's resume)
  buffered T×M + seq   T threads, buffered, the file advised POSIX_FADV_SEQUENTIAL
  willneed T×M  the whole file advised POSIX_FADV_WILLNEED first, then T threads read it buffered

--files runs instead the two libraries' whole disk patterns on many files, without a GPU: 64 MiB
files written uvm's way (fallocated, 8 threads writing 16 MiB O_DIRECT requests) or
torch_memory_saver's (fallocated, one thread, buffered, fsync), each set read back both ways (uvm: 4
threads, one 64 MiB O_DIRECT request a file; the peer: one thread, buffered 256 MiB reads), taking
turns, to tell whether a difference comes from how the files were written or how they are read.

--ram-disk GIB probes a loop-mounted ext4 image in /dev/shm instead of --dir (bench/ram_disk.py).

Prints GB/s per way and round, and the median; --json writes them. Needs no GPU.
"""
from __future__ import annotations

import argparse
import json
import mmap
import os
import statistics
import sys
import threading
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))  # bench/
from ram_disk import ram_disk  # noqa: E402

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


def write_files(directory: str, count: int, file_bytes: int, how: str) -> tuple[list[str], float]:
    paths = [os.path.join(directory, f"{how}-{i}.backup") for i in range(count)]
    source = mmap.mmap(-1, 16 * MiB)
    source.write(os.urandom(16 * MiB))
    start = time.perf_counter()
    if how == "uvm":
        fds = [os.open(p, os.O_RDWR | os.O_CREAT | os.O_EXCL | os.O_DIRECT, 0o600) for p in paths]
        for fd in fds:
            os.posix_fallocate(fd, 0, file_bytes)
        work = [(fd, offset) for fd in fds for offset in range(0, file_bytes, 16 * MiB)]
        lock = threading.Lock()

        def writer():
            while True:
                with lock:
                    if not work:
                        return
                    fd, offset = work.pop(0)
                os.pwritev(fd, [source], offset)

        threads = [threading.Thread(target=writer) for _ in range(8)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        for fd in fds:
            os.close(fd)
    else:
        for path in paths:
            fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_EXCL, 0o600)
            os.posix_fallocate(fd, 0, file_bytes)
            for offset in range(0, file_bytes, 16 * MiB):
                os.pwrite(fd, source, offset)
            os.fsync(fd)
            os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
            os.close(fd)
    seconds = time.perf_counter() - start
    source.close()
    return paths, count * file_bytes / seconds / 1e9


def read_files(paths: list[str], file_bytes: int, how: str) -> float:
    start = time.perf_counter()
    if how == "uvm":
        pending = list(paths)
        lock = threading.Lock()

        def reader():
            buffer = mmap.mmap(-1, file_bytes)
            try:
                while True:
                    with lock:
                        if not pending:
                            return
                        path = pending.pop(0)
                    fd = os.open(path, os.O_RDONLY | os.O_DIRECT)
                    try:
                        if os.preadv(fd, [buffer], 0) != file_bytes:
                            raise OSError(f"short read of {path}")
                    finally:
                        os.close(fd)
            finally:
                buffer.close()

        threads = [threading.Thread(target=reader) for _ in range(4)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
    else:
        buffer = bytearray(file_bytes)
        for path in paths:
            fd = os.open(path, os.O_RDONLY)
            try:
                if os.preadv(fd, [buffer], 0) != file_bytes:
                    raise OSError(f"short read of {path}")
                os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
            finally:
                os.close(fd)
    return len(paths) * file_bytes / (time.perf_counter() - start) / 1e9


def files_probe(args: argparse.Namespace) -> None:
    """Writes and reads the files each library would (see the module's doc), in rounds."""
    file_bytes = 64 * MiB
    count = int(args.gib * (1 << 30)) // file_bytes
    results: dict[str, list[float]] = {}
    for _ in range(args.rounds):
        for written, reads in (("uvm", ("uvm", "peer")), ("peer", ("peer", "uvm"))):
            paths, gbps = write_files(args.dir, count, file_bytes, written)
            results.setdefault(f"write {written}", []).append(gbps)
            try:
                for read in reads:
                    results.setdefault(f"written {written}, read {read}", []).append(read_files(paths, file_bytes, read))
            finally:
                start = time.perf_counter()
                for path in paths:
                    os.unlink(path)
                results.setdefault(f"unlink {written}'s files (s)", []).append(time.perf_counter() - start)
    print(f"{'files':34s} {'median GB/s':>11s}  rounds")
    for name, values in results.items():
        print(f"{name:34s} {statistics.median(values):11.3f}  {' '.join(f'{v:.3f}' for v in values)}")
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"gib": args.gib, "dir": args.dir, "files": results}, f, indent=1)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--dir", default="/var/tmp/uvm-disk-probe")
    parser.add_argument("--gib", type=float, default=4.0)
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--ram-disk", type=float, metavar="GIB", help="probe a RAM-backed loop disk of GIB GiB (root)")
    parser.add_argument("--files", action="store_true", help="the libraries' whole patterns on 64 MiB files")
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
    if args.files:
        files_probe(args)
        return
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
