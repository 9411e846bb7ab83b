"""Pinning ahead for a region's first pause (uvm_prepare_pause, uvm.h): when a uvm.memory_saver region
with a pinned CPU backup ends, a thread of uvm's pins the staging memory that the tag's next pause
will copy into, while the model goes on loading. The first pause then copies at once instead of
pinning fresh host memory first (1-2 s for 8 GiB, measured: docs/performance.md).

It pins at most half the host's available memory (MemAvailable) per preparation. It holds what the
pause would hold anyway; without retained backups each resume gives it back. env UVM_PREPARE_PAUSE=0
turns it off; uvm.release_staging() stops a preparation in progress after its batch (256 MiB)."""
from __future__ import annotations

import os
import threading
import weakref

from . import _lib


def enabled() -> bool:
    return os.environ.get("UVM_PREPARE_PAUSE", "1").strip() != "0"


def _host_bound() -> int:
    """Half of MemAvailable, in bytes; 0 (no bound) where /proc/meminfo has none."""
    try:
        with open("/proc/meminfo") as meminfo:
            for line in meminfo:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024 // 2
    except OSError:
        pass
    return 0


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
                if lib.uvm_prepare_pause(_lib.UVM_ANY_DEVICE, tag.encode(), _host_bound(), None) != _lib.UVM_OK:
                    self.last_error = lib.uvm_last_error().decode(errors="replace")
                    lib.uvm_clear_last_error()
            except Exception as error:  # noqa: BLE001 - a daemon thread has no caller: kept for the user to read
                self.last_error = f"{type(error).__name__}: {error}"
            finally:
                with self._ready:
                    self._pending.remove(tag)
                    self._busy = False
                    self._ready.notify_all()


preparer = Preparer()
