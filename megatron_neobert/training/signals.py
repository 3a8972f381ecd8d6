"""Pre-emption: SIGTERM / SIGUSR1 ask the run to save a checkpoint and exit.

A handler only sets a flag; the training loop asks `any_rank_signalled()` once per step, an
all-reduce, so that all ranks stop at the same step even when the scheduler signalled one
process (as Megatron-LM's DistributedSignalHandler does).
"""

import signal

import torch

SIGNALS = (signal.SIGTERM, signal.SIGUSR1)


class ExitSignalHandler:
    def __init__(self, signals=SIGNALS):
        self.signals = signals
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

    def any_rank_signalled(self) -> bool:
        flag = torch.tensor([1.0 if self.received else 0.0],
                            device="cuda" if torch.cuda.is_available() else "cpu")
        torch.distributed.all_reduce(flag, op=torch.distributed.ReduceOp.MAX)
        return bool(flag.item())
