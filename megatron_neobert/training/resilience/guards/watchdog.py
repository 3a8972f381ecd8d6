"""A peer that hangs or a host that is lost: `ProgressWatchdog` notices the main thread making no progress, says where
it waits, and asks the other hosts (`hosts.py`) and the rules (`rules.py`) what to do."""

import logging
import os
import threading
import time
from typing import Optional

from megatron_neobert.training.resilience.guards.children import exit_now
from megatron_neobert.training.resilience.guards.launcher import LauncherWatch, say_error
from megatron_neobert.training.resilience.guards.rules import Verdict, lost_host, thawed

logger = logging.getLogger(__name__)


class ProgressWatchdog:
    """Inside the block, a thread notices when the main thread has not moved on for half the collectives'
    timeout and prints where it waits (`at` tells it), long before the timeout ends the run.

    With `hosts` (`hosts.HostAnswers`), after `host_check_after_s` without progress, and as often again while the main
    thread waits, it asks ranks on the neighbouring hosts and the rendezvous store whether they answer. A slow peer's
    host answers and is waited for; a host that does not (cut off, powered off, frozen) ends the attempt at once with
    one line naming it (`rules.lost_host`), so that torchrun's restart or the elastic rendezvous takes over in about a
    minute instead of the collective's timeout. A process that finds it was stopped past that bound, thawed, ends
    (`rules.thawed`): here, or in the main thread's error (`end_if_thawed`), whichever comes first. `launcher`:
    the guards' watch of torchrun, which ends it when the verdict says so."""

    def __init__(self, timeout_minutes: float, host_check_after_s: float = 0, hosts=None,
                 launcher: Optional[LauncherWatch] = None):
        self.timeout_minutes = timeout_minutes
        self.after_s = timeout_minutes * 60 / 2  # half the collectives' timeout
        self.hosts = hosts if host_check_after_s > 0 else None
        self.host_check_after_s = host_check_after_s
        self.launcher = launcher if launcher is not None else LauncherWatch(thread=False)
        self._where = (time.monotonic(), 0, "set-up")
        self._warned_for = None
        self._checked_at = None
        self._looked = (time.monotonic(), time.process_time())  # the thread's last look, and the CPU time then
        self._stop = threading.Event()
        self._ending = threading.Lock()  # held by the thread that ends the attempt, until the process is gone
        self._thread = threading.Thread(target=self._watch, name="progress-watchdog", daemon=True)

    def __enter__(self):
        self._thread.start()
        return self

    def __exit__(self, *exc):
        self._stop.set()

    def at(self, iteration: int, phase: str) -> None:
        """The main thread starts `phase` of `iteration`."""
        self._where = (time.monotonic(), iteration, phase)

    def _poll_s(self) -> float:
        return min(5.0, self.after_s / 4, *([self.host_check_after_s / 4] if self.hosts else []))

    def stopped_s(self) -> float:
        """How long this process was stopped before now: a gap between the thread's looks (every `_poll_s`) in which
        the process used (almost) no CPU time. A busy machine delays the look but the rank's threads run meanwhile, and
        a main thread holding Python's lock computes."""
        looked, cpu = self._looked
        gap = time.monotonic() - looked - self._poll_s()
        return gap if gap > 0 and time.process_time() - cpu < 0.1 * gap else 0.0

    def end_if_thawed(self) -> None:
        """Ends the process (`rules.thawed`) where it was stopped past the bound; returns otherwise."""
        verdict = thawed(self.stopped_s(), self.host_check_after_s, self.launcher.pid) if self.hosts else None
        if verdict:
            self._end_attempt(verdict)

    def _watch(self) -> None:
        while not self._stop.wait(self._poll_s()):
            self.end_if_thawed()
            self._looked = (time.monotonic(), time.process_time())
            since, iteration, phase = where = self._where
            now = time.monotonic()
            idle = now - since
            if idle > self.after_s and self._warned_for is not where:
                self._warned_for = where
                rank = os.environ.get("RANK", "0")
                logger.warning(f"watchdog: rank {rank} has made no progress for {idle:.0f} s in iteration "
                               f"{iteration} ({phase}); a peer may be stopped or hung. The collective it waits in "
                               f"fails after --distributed-timeout-minutes {self.timeout_minutes:g}")
            if self.hosts and idle > self.host_check_after_s and \
                    (self._checked_at is None or self._checked_at < since
                     or now - self._checked_at >= self.host_check_after_s):
                self._checked_at = now
                found = self.hosts.ask()
                verdict = lost_host(found, self.hosts.rendezvous, iteration, phase, time.monotonic() - since,
                                    self.launcher.pid)
                if verdict and self._where is where:  # no progress meanwhile: the wait is on the silent host
                    self._end_attempt(verdict)

    def _end_attempt(self, verdict: Verdict) -> None:
        self._ending.acquire()  # one line: the main thread and this one may both find the process thawed
        say_error(verdict.line)
        if verdict.end_torchrun:  # by SIGKILL: its SIGTERM handler would wait on the unreachable store
            self.launcher.end_torchrun()
        exit_now(1)
