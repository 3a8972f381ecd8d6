"""A line in the log when the run stops making progress, naming the iteration and what it was
doing, long before the collective's timeout (--distributed-timeout-minutes) ends the run.

A peer that froze (a stopped process, a hung node) leaves the others waiting in their next
collective without a word; this thread notices the main thread has not moved on for half the
timeout and says where it waits.
"""

import os
import sys
import threading
import time


class ProgressWatchdog:
    def __init__(self, timeout_minutes: float):
        self.timeout_minutes = timeout_minutes
        self.after_s = timeout_minutes * 60 / 2  # half the collectives' timeout
        self._where = (time.monotonic(), 0, "set-up")
        self._warned_for = None
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._watch, name="progress-watchdog", daemon=True)
        self._thread.start()

    def at(self, iteration: int, phase: str) -> None:
        """The main thread starts `phase` of `iteration`."""
        self._where = (time.monotonic(), iteration, phase)

    def close(self) -> None:
        self._stop.set()

    def _watch(self) -> None:
        while not self._stop.wait(min(5.0, self.after_s / 4)):
            since, iteration, phase = where = self._where
            idle = time.monotonic() - since
            if idle > self.after_s and self._warned_for is not where:
                self._warned_for = where
                rank = os.environ.get("RANK", "0")
                print(f"watchdog: rank {rank} has made no progress for {idle:.0f} s in iteration {iteration} "
                      f"({phase}); a peer may be stopped or hung. The collective it waits in fails after "
                      f"--distributed-timeout-minutes {self.timeout_minutes:g}", file=sys.stderr, flush=True)
