"""Pre-emption: `--exit-signal` recorded by `ExitSignalHandler`, and the stop agreed by all ranks (`stop_requested`)."""

import signal
import time
from typing import Optional

from megatron_neobert.training.config.settings import EXIT_SIGNAL_NAMES

EXIT_SIGNALS = {name: getattr(signal, name) for name in EXIT_SIGNAL_NAMES}


def ignore_exit_signals() -> None:
    for sig in EXIT_SIGNALS.values():
        signal.signal(sig, signal.SIG_IGN)


class ExitSignalHandler:
    """Inside the block, `--exit-signal` sets `received` (its name) instead of ending the process."""

    def __init__(self, signal_name: str = "SIGTERM"):
        self.signals = (EXIT_SIGNALS[signal_name],)
        self.received = None
        self._previous = {}

    def __enter__(self):
        for sig in self.signals:
            self._previous[sig] = signal.signal(sig, self._handle)
        return self

    def __exit__(self, *exc):
        for sig, handler in self._previous.items():
            signal.signal(sig, handler)

    def _handle(self, signum, frame):
        self.received = signal.Signals(signum).name


def stop_requested(handler: Optional[ExitSignalHandler], started: float,
                   exit_duration_in_mins: Optional[float]) -> Optional[str]:
    """"signal", "exit-duration" or None, agreed by all ranks (a collective: call it on all; none
    without a handler or a duration, which all ranks' flags agree on)."""
    # torch on first use: the entry point imports the guards before --help, which must not wait for torch.
    import torch

    if handler is None and not exit_duration_in_mins:
        return None
    over_time = bool(exit_duration_in_mins) and (time.time() - started) / 60.0 > exit_duration_in_mins
    flags = torch.tensor([1.0 if handler and handler.received else 0.0, 1.0 if over_time else 0.0],
                         device="cuda" if torch.cuda.is_available() else "cpu")
    torch.distributed.all_reduce(flags, op=torch.distributed.ReduceOp.MAX)
    signalled, over_time = flags.tolist()  # one device-to-host copy
    if signalled:
        return "signal"
    return "exit-duration" if over_time else None
