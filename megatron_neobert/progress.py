"""Progress of long loops: a tqdm bar on a terminal; plain lines when stderr is a file or a pipe (a bar's carriage
returns and cursor codes make a log unreadable); nothing when progress is off."""

import sys
import time


def progress_bar(iterable=None, desc: str = "", total=None, enabled: bool = True, every: float = 30.0, **tqdm_kwargs):
    """A tqdm bar over `iterable` (or one advanced with `update`) when `enabled` and stderr is a terminal, else a
    `PlainProgress`: "desc: n/total" lines on stderr at most every `every` seconds and at the end."""
    if enabled and sys.stderr.isatty():
        from tqdm.auto import tqdm

        return tqdm(iterable, desc=desc, total=total, **tqdm_kwargs)
    return PlainProgress(iterable, desc, total, enabled, every)


def library_bars(enabled: bool) -> None:
    """Turns off the bars transformers and huggingface_hub draw themselves (e.g. "Loading weights") unless ours
    show: progress on and stderr a terminal."""
    if not (enabled and sys.stderr.isatty()):
        from transformers.utils import logging

        logging.disable_progress_bar()  # huggingface_hub's as well


class PlainProgress:
    """What this package uses of tqdm's interface (iterate, update, set_postfix, close), as plain lines."""

    def __init__(self, iterable=None, desc: str = "", total=None, enabled: bool = True, every: float = 30.0):
        if total is None and hasattr(iterable, "__len__"):
            total = len(iterable)
        self.iterable, self.desc, self.total, self.enabled, self.every = iterable, desc, total, enabled, every
        self.n, self.shown_n, self.postfix, self.closed = 0, None, "", False
        self.start = self.shown = time.monotonic()

    def __iter__(self):
        for item in self.iterable:
            yield item
            self.update()
        self.close()

    def update(self, n: int = 1) -> None:
        self.n += n
        if self.enabled and time.monotonic() - self.shown >= self.every:
            self._write()

    def set_postfix(self, **values) -> None:
        self.postfix = ", ".join(f"{k}={v}" for k, v in values.items())

    def close(self) -> None:
        if self.enabled and not self.closed and self.shown_n != self.n:
            self._write()
        self.closed = True

    def _write(self) -> None:
        self.shown, self.shown_n = time.monotonic(), self.n
        done = f"{self.n}/{self.total}" if self.total is not None else str(self.n)
        postfix = f", {self.postfix}" if self.postfix else ""
        print(f"{self.desc}: {done} ({self.shown - self.start:.0f} s{postfix})", file=sys.stderr, flush=True)
