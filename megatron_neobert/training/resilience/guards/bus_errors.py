"""A data file that changes under the job: a bus error in a rank or its DataLoader workers named in one line."""

import ctypes
import os
import signal
from typing import Callable, Optional

from megatron_neobert.training.resilience.guards.children import data_worker_init, exit_now

_SIGNAL_HANDLER = ctypes.CFUNCTYPE(None, ctypes.c_int)


def _c_signal(sig: int, handler) -> Optional[int]:
    """The C library's signal(): installs `handler` (a C function pointer, None for the default); returns the
    previous one."""
    libc = ctypes.CDLL(None, use_errno=True)
    libc.signal.argtypes, libc.signal.restype = (ctypes.c_int, ctypes.c_void_p), ctypes.c_void_p
    return libc.signal(sig, handler)


class BusErrors:
    """Inside the block a bus error in this process, or in a DataLoader worker it forks, ends it with one line:
    `describe()` says what changed among the memory-mapped files it reads. The kernel raises it inside the read
    that touches a page of a file truncated under the job; a handler installed with Python's `signal` would run
    only after that read returns, which it never does, so this one is installed with the C library and runs inside
    the read."""

    def __init__(self, describe: Callable[[], str]):
        self.describe = describe
        self._active = False
        self._handler = None  # kept: the C library holds only its address
        self._previous = None

    def __enter__(self):
        self._active = True
        self._previous = self._install()
        return self

    def __exit__(self, *exc):
        self._active = False
        _c_signal(signal.SIGBUS, self._previous)

    def __getstate__(self) -> dict:
        """A worker started from a pickle (by the forkserver, or spawned) is no fork of this process: the data files
        it would describe are the rank's, so it only ignores the exit signals and dies with the rank."""
        return {"describe": None, "_active": False, "_handler": None, "_previous": None}

    def data_worker_init(self, worker_id: int) -> None:
        """DataLoader `worker_init_fn`: as `children.data_worker_init`, and a bus error is named as in the rank
        (torch's worker set-up replaced the handler with its own, which blames shared memory)."""
        data_worker_init(worker_id)
        if self._active:
            self._install()

    def _install(self) -> Optional[int]:
        def on_bus_error(signum):
            try:
                cause = self.describe()
            except BaseException as err:  # noqa: BLE001 - the line must be written whatever the description does
                cause = f"(which file is unknown: {type(err).__name__}: {err})"
            os.write(2, f"error: rank {os.environ.get('RANK', '0')}: bus error reading a memory-mapped data file: "
                        f"{cause}\n".encode())
            exit_now(1)

        self._handler = _SIGNAL_HANDLER(on_bus_error)
        return _c_signal(signal.SIGBUS, ctypes.cast(self._handler, ctypes.c_void_p))
