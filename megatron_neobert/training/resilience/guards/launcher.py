"""The rank's launcher: a rank whose torchrun is gone ends (`LauncherWatch`), and a failed rank's line is written
where torchrun's failure summary shows it (`say_error`)."""

import logging
import os
import select
import signal
import sys
import threading
import time
from typing import Optional

from megatron_neobert.atomic_write import write_json_atomic
from megatron_neobert.training.resilience.guards.children import exit_now

logger = logging.getLogger(__name__)


class LauncherWatch:
    """Under torchrun (TORCHELASTIC_RUN_ID set), a thread that ends the rank when its parent torchrun is gone.

    The thread waits on a pidfd of the parent, so the rank ends as the parent does (a rank that kept stepping for
    a poll interval would carry its peers past a checkpoint they then resume from); without pidfds (Linux < 5.3)
    it compares the parent pid with the one at start every `poll_s`. The main thread may be blocked in a
    collective, or in the rendezvous, whose store torchrun hosted. Start it first thing, before the imports and the
    process group; a rank whose torchrun died before that (on a loaded host a rank may take seconds to get there)
    finds another parent, one that runs no Python (what adopted it), and ends as well. Outside torchrun nothing is
    watched (a `nohup` run must survive its shell) and `pid` is None; `thread=False` leaves the check to
    `exit_if_gone`."""

    def __init__(self, poll_s: float = 1.0, thread: bool = True, pid: Optional[int] = None):
        self.adopted = False  # torchrun died before this rank looked: its parent is what adopted it
        if pid is None and "TORCHELASTIC_RUN_ID" in os.environ:
            pid = os.getppid()
            self.adopted = not _runs_python(pid)
        self.pid = pid  # `pid`: another process to stand for torchrun (a test's)
        self._stop = threading.Event()
        if self.pid is not None and thread:
            threading.Thread(target=self._watch, args=(poll_s,), name="launcher-watch", daemon=True).start()

    def _watch(self, poll_s: float) -> None:
        try:
            parent = os.pidfd_open(self.pid)
        except (AttributeError, OSError):  # no pidfds, or the parent already gone (the check below ends the rank)
            parent = None
        self._exit_if_reparented()  # the pidfd is the parent's only while the parent is still this process's
        while not self._stop.is_set():
            if parent is None:
                self._stop.wait(poll_s)
            else:
                select.select([parent], [], [], poll_s)  # readable as the parent exits
            if not self._stop.is_set():
                self._exit_if_reparented(wait_s=2.0 if parent is not None else 0.0)

    def close(self) -> None:
        self._stop.set()

    def end_torchrun(self) -> None:
        """Under torchrun, end it (SIGKILL: its SIGTERM handler would close the rendezvous for every host) and stop
        watching it, this rank going on to say why it ends: a host's part of the job that must not rejoin it, which
        torchrun would restart into the next round."""
        if self.pid is not None and not self.adopted:  # never what adopted the rank
            self.close()
            try:
                os.kill(self.pid, signal.SIGKILL)
            except ProcessLookupError:  # ended already, by another rank of this host
                pass

    def exit_if_gone(self, wait_s: float = 2.0) -> None:
        """After a failure to reach torchrun's store: end the rank as the watch would, when torchrun is gone (a rank
        that writes to the store every step meets the broken pipe before the watch's next look). Returns when
        torchrun is still there (the failure is another one)."""
        if self.pid is not None:
            self._exit_if_reparented(wait_s)

    def _exit_if_reparented(self, wait_s: float = 0.0) -> None:
        """The pipe breaks, and the pidfd turns readable, as torchrun's files close, a moment before the kernel
        hands its children to another parent: waits up to `wait_s` for that."""
        deadline = time.monotonic() + wait_s
        while os.getppid() == self.pid and not self.adopted:
            if time.monotonic() >= deadline or self._stop.is_set():
                return
            time.sleep(0.05)
        if self._stop.is_set():  # closed: torchrun was ended by this rank (`end_torchrun`), or the run is over
            return
        gone = (f"torchrun was gone before this rank looked (its parent is now pid {self.pid}, which does not run "
                f"Python)" if self.adopted else f"torchrun (pid {self.pid}) is gone")
        logger.warning(f"rank {os.environ.get('RANK', '?')}: {gone}; exiting without saving (the latest complete "
                       f"checkpoint stays the one to resume from)")
        exit_now(1)


def _runs_python(pid: int) -> bool:
    """Whether process `pid` runs Python, as torchrun and any other launcher of torch's elastic agent do, and as what
    adopts an orphan (an init, a container's, a subreaper) does not: its executable where this process may read it,
    else its name (a process of another user, init's); True where neither can be read."""
    try:
        name = os.path.basename(os.readlink(f"/proc/{pid}/exe"))
    except OSError:
        try:
            with open(f"/proc/{pid}/comm") as f:
                name = f.read()
        except OSError:
            return True
    return "python" in name.lower()


def say_error(line: str) -> None:
    """A rank's error line: on stderr in one write (print's two let another process's output on the same pipe,
    torchrun's or a C++ warning, come between the line and its end), and under torchrun in the rank's reply file
    (TORCHELASTIC_ERROR_FILE): torchrun's failure summary, printed last after its own traceback, then shows it as the
    root cause's "traceback" instead of "To enable traceback see: ...". torchrun's traceback itself cannot be
    avoided: it raises ChildFailedError for any rank that exits with a non-zero status (docs/training.md says how to
    read it)."""
    sys.stderr.write(line + "\n")
    sys.stderr.flush()
    path = os.environ.get("TORCHELASTIC_ERROR_FILE")
    if path:
        write_json_atomic(path, {"message": {"message": line, "extraInfo": {
            "py_callstack": line, "timestamp": str(int(time.time()))}}})
