"""Fetches what uvm's PyTorch block hook (python_shim/uvm/_torch_blocks.cpp) is prebuilt against, for
each torch release the wheel supports: c10's headers (torch/include/c10, torch/include/torch/headeronly)
and libc10.so / libc10_cuda.so, which the hook links against so that a symbol that release lacks fails
the build, not a user's import. They come out of that release's manylinux x86_64 wheel on PyPI by HTTP
range requests: its zip directory and those entries, about 3 MB of a 500-900 MB file.

    python scripts/torch_headers.py [DEST]      fetches every release of SUPPORTED into DEST
                                                (default: $UVM_TORCH_HEADERS_DIR, else .deps/torch)

Each release lands in DEST/<major.minor>/ with include/, lib/ and release.json ({"release": "2.11.0",
"cxx11_abi": true}: the ABI read off libc10's symbols). Releases already there are kept.
"""
from __future__ import annotations

import io
import json
import os
import shutil
import sys
import tempfile
import urllib.parse
import urllib.request
import zipfile
from pathlib import Path

# The torch releases uvm's wheel carries a block hook for: torch.cuda.MemPool over a pluggable
# allocator is there from 2.6 on; each minor's last patch release stands for its minor (the probe in
# uvm/_state.py checks the hook against the torch a process really runs).
SUPPORTED = {"2.6": "2.6.0", "2.7": "2.7.1", "2.8": "2.8.0", "2.9": "2.9.1", "2.10": "2.10.0",
             "2.11": "2.11.0", "2.12": "2.12.1", "2.13": "2.13.0", "2.14": "2.14.1", "2.15": "2.15.0"}
INDEX = os.environ.get("UVM_PYPI_URL", "https://pypi.org").rstrip("/")
WANTED_PREFIXES = ("torch/include/c10/", "torch/include/torch/headeronly/")
WANTED_LIBRARIES = ("torch/lib/libc10.so", "torch/lib/libc10_cuda.so")
TIMEOUT_S = 60


class FetchError(RuntimeError):
    """A release's files could not be fetched; the message names the release, the URL, why, and the
    way out."""


# Where a build with no access to the package index gets the headers instead.
WAY_OUT = ("fetch them where the package index can be reached: `python scripts/torch_headers.py DIR` (in the "
           "checkout and the sdist), then build with UVM_TORCH_HEADERS_DIR=DIR")


class RangeReader(io.RawIOBase):
    """A file on an HTTP server read by range requests, seekable, as zipfile needs."""

    def __init__(self, url: str):
        super().__init__()
        self.url, self.position = url, 0
        with urllib.request.urlopen(urllib.request.Request(url, method="HEAD"), timeout=TIMEOUT_S) as reply:
            self.size = int(reply.headers["Content-Length"])

    def readable(self) -> bool:
        return True

    def seekable(self) -> bool:
        return True

    def tell(self) -> int:
        return self.position

    def seek(self, offset: int, whence: int = io.SEEK_SET) -> int:
        base = {io.SEEK_SET: 0, io.SEEK_CUR: self.position, io.SEEK_END: self.size}[whence]
        self.position = base + offset
        return self.position

    def readinto(self, buffer) -> int:
        count = min(len(buffer), self.size - self.position)
        if count <= 0:
            return 0
        request = urllib.request.Request(self.url, headers={"Range": f"bytes={self.position}-{self.position + count - 1}"})
        with urllib.request.urlopen(request, timeout=TIMEOUT_S) as reply:
            if reply.status != 206:
                raise FetchError(f"{self.url}: the server ignored a range request (HTTP {reply.status})")
            data = reply.read()
        buffer[:len(data)] = data
        self.position += len(data)
        return len(data)


def wheel_url(release: str) -> str:
    """The URL of torch `release`'s manylinux x86_64 wheel for CPython 3.12 (its headers and c10
    libraries are those of every Python's wheel)."""
    index_url = f"{INDEX}/pypi/torch/json"
    with urllib.request.urlopen(index_url, timeout=TIMEOUT_S) as reply:
        files = json.load(reply)["releases"].get(release, [])
    for entry in files:
        name = entry["filename"]
        if "-cp312-cp312-" in name and "linux" in name and name.endswith("_x86_64.whl"):
            return urllib.parse.urljoin(index_url, entry["url"])
    raise FetchError(f"torch {release}: no manylinux x86_64 cp312 wheel listed at {index_url}")


def cxx11_abi(libc10: Path) -> bool:
    """Whether libc10.so was built with _GLIBCXX_USE_CXX11_ABI=1: its torchCheckFail takes a
    std::__cxx11::basic_string, mangled 'NSt7__cxx11' (the old ABI's std::string is 'Ss')."""
    data = libc10.read_bytes()
    if b"_ZN3c106detail14torchCheckFailEPKcS2_jRKNSt7__cxx11" in data:
        return True
    if b"_ZN3c106detail14torchCheckFailEPKcS2_jRKSs" in data:
        return False
    raise FetchError(f"{libc10}: cannot tell its C++ ABI (no c10::detail::torchCheckFail symbol)")


def fetch(minor: str, dest: Path) -> Path:
    """DEST/<minor>, with the headers and libraries of torch SUPPORTED[minor], fetched unless there."""
    release = SUPPORTED[minor]
    folder = dest / minor
    if (folder / "release.json").is_file() and json.loads((folder / "release.json").read_text())["release"] == release:
        return folder
    try:
        url = wheel_url(release)
    except (OSError, KeyError, ValueError) as error:  # no network, an index that answers otherwise
        raise FetchError(f"torch {release}: its headers are not in {dest}, and asking {INDEX}/pypi/torch/json for its "
                         f"wheel failed ({error}); {WAY_OUT}") from None
    dest.mkdir(parents=True, exist_ok=True)
    scratch = Path(tempfile.mkdtemp(prefix=f".{minor}-", dir=dest))
    try:
        with zipfile.ZipFile(io.BufferedReader(RangeReader(url), buffer_size=1 << 20)) as wheel:
            entries = [info for info in wheel.infolist()
                       if (info.filename.startswith(WANTED_PREFIXES) and not info.is_dir())
                       or info.filename in WANTED_LIBRARIES]
            # In archive order: the buffered reader then fetches each stretch of entries once.
            for info in sorted(entries, key=lambda info: info.header_offset):
                relative = info.filename.split("/", 2)[2] if info.filename.startswith("torch/include/") else \
                    "lib/" + info.filename.rsplit("/", 1)[1]
                target = scratch / ("include/" + relative if not relative.startswith("lib/") else relative)
                target.parent.mkdir(parents=True, exist_ok=True)
                with wheel.open(info) as source, open(target, "wb") as out:
                    shutil.copyfileobj(source, out)
        missing = [name for name in WANTED_LIBRARIES if not (scratch / "lib" / name.rsplit("/", 1)[1]).is_file()]
        if missing or not (scratch / "include" / "c10" / "cuda" / "CUDACachingAllocator.h").is_file():
            raise FetchError(f"torch {release} ({url}): its wheel lacks {missing or 'c10/cuda/CUDACachingAllocator.h'}")
        (scratch / "release.json").write_text(json.dumps(
            {"release": release, "cxx11_abi": cxx11_abi(scratch / "lib" / "libc10.so"), "url": url}, indent=1) + "\n")
        shutil.rmtree(folder, ignore_errors=True)
        os.replace(scratch, folder)
    except (OSError, zipfile.BadZipFile, KeyError, ValueError) as error:
        raise FetchError(f"torch {release}: fetching its headers from {url} failed: {error}; {WAY_OUT}") from None
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
    return folder


def default_dest() -> Path:
    return Path(os.environ.get("UVM_TORCH_HEADERS_DIR") or Path(__file__).resolve().parents[1] / ".deps" / "torch")


def main(argv: list[str]) -> int:
    dest = Path(argv[0]) if argv else default_dest()
    failed = 0
    for minor in SUPPORTED:
        try:
            folder = fetch(minor, dest)
            abi = json.loads((folder / "release.json").read_text())["cxx11_abi"]
            print(f"torch {SUPPORTED[minor]}: {folder} (C++ ABI {'cxx11' if abi else 'pre-cxx11'})")
        except FetchError as error:
            print(f"uvm: {error}", file=sys.stderr)
            failed += 1
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
