"""Pinning ahead for a region's first pause (uvm_prepare_pause, uvm.h): when a uvm.memory_saver region
with a pinned CPU backup ends, a thread of uvm's pins the staging memory that the tag's next pause
will copy into, while the model goes on loading. The first pause then copies at once instead of
pinning fresh host memory first (1-2 s for 8 GiB, measured: docs/performance.md).

One bound for the node, shared by its processes (a node's ranks each prepare their own pause): all of
them together pin at most half of the memory the host had available before any of them pinned. Each
process records what it holds, and what it is about to pin, in a ledger of the user's
(/dev/shm/uvm-prepare-<uid>.json, under flock; a process that is gone counts no longer); a
preparation may add what the others leave of that half. It holds what the pause would hold anyway;
without retained backups each resume gives it back. env UVM_PREPARE_PAUSE=0 turns it off;
uvm.release_staging() stops a preparation in progress after its batch (256 MiB) and gives back what
that batch pinned."""
from __future__ import annotations

import contextlib
import ctypes
import fcntl
import json
import os
import tempfile
import threading
import weakref

from . import _lib


def enabled() -> bool:
    return os.environ.get("UVM_PREPARE_PAUSE", "1").strip() != "0"


def _available(meminfo_path: str = "/proc/meminfo") -> int | None:
    """MemAvailable in bytes; None where /proc/meminfo has none."""
    try:
        with open(meminfo_path) as meminfo:
            for line in meminfo:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    return None


def _ledger_path() -> str:
    folder = "/dev/shm" if os.path.isdir("/dev/shm") else tempfile.gettempdir()
    return os.path.join(folder, f"uvm-prepare-{os.getuid()}.json")


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


@contextlib.contextmanager
def _ledger():
    """The node's ledger, locked: {pid: bytes of pinned staging held or claimed} of the processes still
    alive, written back when the block ends. An unreadable ledger counts as empty."""
    fd = os.open(_ledger_path(), os.O_RDWR | os.O_CREAT, 0o600)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        with os.fdopen(os.dup(fd), "r+") as ledger:
            try:
                entries = {int(pid): int(held) for pid, held in json.loads(ledger.read() or "{}").items()}
            except (ValueError, AttributeError):
                entries = {}
            entries = {pid: held for pid, held in entries.items() if _alive(pid)}
            yield entries
            ledger.seek(0)
            ledger.truncate()
            ledger.write(json.dumps({str(pid): held for pid, held in entries.items()}))
    finally:
        os.close(fd)  # and the lock with it


def _claim(held: int) -> int | None:
    """How many bytes this process may pin for one preparation, holding `held` already, claimed in the
    ledger until _settle: half of what the host had available before the node's processes pinned
    (MemAvailable now, plus what they hold or claim), less what they hold or claim. None where the
    host does not say (no bound, as before)."""
    available = _available()
    if available is None:
        return None
    with _ledger() as entries:
        entries.pop(os.getpid(), None)
        others = sum(entries.values())
        share = max(0, (available + others + held) // 2 - others - held)
        entries[os.getpid()] = held + share
    return share


def _settle(held: int) -> None:
    """Records what this process holds once its preparation is done (its claim no longer counts)."""
    with _ledger() as entries:
        entries[os.getpid()] = held


def _held(lib) -> int:
    capacity = ctypes.c_size_t()
    if lib.uvm_get_staging(ctypes.byref(capacity), None) != _lib.UVM_OK:
        lib.uvm_clear_last_error()
        return 0
    return capacity.value


class Preparer:
    """One daemon thread that prepares the pauses of the tags asked, one at a time, in the order asked.
    A preparation that raises is kept in last_error like one that fails, and the thread goes on; a
    child made by fork starts with nothing asked and its own thread when it asks."""

    def __init__(self):
        self._reset()
        me = weakref.ref(self)
        os.register_at_fork(after_in_child=lambda: (lambda preparer: preparer and preparer._reset())(me()))

    def _reset(self) -> None:
        # A fresh lock too: the parent's thread may have held the old one at the fork, and is not here.
        self._ready = threading.Condition()
        self._pending: list[str] = []
        self._busy = False
        self._thread: threading.Thread | None = None
        self.last_error = ""  # the last preparation's failure (the pause then pins for itself)

    def ask(self, tag: str) -> None:
        with self._ready:
            if tag not in self._pending:
                self._pending.append(tag)
            if self._thread is None or not self._thread.is_alive():
                self._thread = threading.Thread(target=self._run, name="uvm-prepare-pause", daemon=True)
                self._thread.start()
            self._ready.notify()

    def wait(self) -> None:
        """Returns once every tag asked so far is prepared (for tests and benchmarks)."""
        with self._ready:
            self._ready.wait_for(lambda: not self._pending and not self._busy)

    def _run(self) -> None:
        while True:
            with self._ready:
                self._ready.wait_for(lambda: self._pending)
                tag = self._pending[0]
                self._busy = True
            try:
                lib = _lib.library()
                share = _claim(_held(lib))
                try:
                    if share == 0:  # the node's half is taken: the pause pins for itself
                        self.last_error = (f"not prepared: the node's processes hold half of its available memory "
                                           f"({_ledger_path()})")
                    elif lib.uvm_prepare_pause(_lib.UVM_ANY_DEVICE, tag.encode(), share or 0, None) != _lib.UVM_OK:
                        self.last_error = lib.uvm_last_error().decode(errors="replace")
                        lib.uvm_clear_last_error()
                finally:
                    if share is not None:
                        _settle(_held(lib))
            except Exception as error:  # noqa: BLE001 - a daemon thread has no caller: kept for the user to read
                self.last_error = f"{type(error).__name__}: {error}"
            finally:
                with self._ready:
                    self._pending.remove(tag)
                    self._busy = False
                    self._ready.notify_all()


preparer = Preparer()
