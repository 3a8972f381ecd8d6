"""Pre-emption on one rank in this process: the handler only records the signal, and the stop decision is
the signal's before the wall-clock limit's (the multi-rank runs are in test_pretrain.py and test_faults.py)."""

import os
import signal
import subprocess
import sys
import time

import pytest

from megatron_neobert.training.resilience.guards.signals import ExitSignalHandler, stop_requested


def test_the_handler_records_the_exit_signal_and_gives_the_previous_handler_back():
    before = signal.getsignal(signal.SIGUSR1)
    with ExitSignalHandler("SIGUSR1") as handler:
        assert handler.received is None
        os.kill(os.getpid(), signal.SIGUSR1)  # handled: the test process lives on
        assert handler.received == "SIGUSR1"
    assert signal.getsignal(signal.SIGUSR1) is before


def test_other_signals_keep_their_handlers():
    others = {sig: signal.getsignal(sig) for sig in (signal.SIGTERM, signal.SIGUSR2)}
    with ExitSignalHandler("SIGUSR1"):
        assert {sig: signal.getsignal(sig) for sig in others} == others


def test_no_handler_and_no_duration_never_stop_and_need_no_process_group():
    assert stop_requested(None, started=0.0, exit_duration_in_mins=None) is None


@pytest.mark.parametrize("signalled, minutes_ago, limit, expected", [
    (False, 0.0, None, None),
    (True, 0.0, None, "signal"),
    (False, 0.0, 5.0, None),  # within the limit
    (False, 6.0, 5.0, "exit-duration"),
    (True, 6.0, 5.0, "signal"),  # both: the signal is named
])
def test_stop_requested(single_rank, signalled, minutes_ago, limit, expected):
    with ExitSignalHandler("SIGUSR2") as handler:
        if signalled:
            os.kill(os.getpid(), signal.SIGUSR2)
        assert stop_requested(handler, time.time() - 60 * minutes_ago, limit) == expected


def test_the_wall_clock_limit_applies_without_a_handler(single_rank):
    assert stop_requested(None, time.time() - 60, 0.5) == "exit-duration"
    assert stop_requested(None, time.time(), 0.5) is None


KILL_CHILDREN_WITH_A_LIVE_DATALOADER = """
import time, torch
from megatron_neobert.training.resilience.guards.children import kill_children
batches = iter(torch.utils.data.DataLoader(range(8), num_workers=1, persistent_workers=True))
next(batches)  # a worker runs, watched by torch's SIGCHLD handler in this process
kill_children()
time.sleep(1.0)  # a watched worker's death raises here in the main thread, if its handler is still in place
print("the rank went on to say what failed")
"""


def test_killing_the_workers_of_a_failed_rank_raises_nothing_more_in_it():
    """The rank that reports an error kills its DataLoader workers: torch's SIGCHLD handler would raise again, in the
    middle of that report, and the rank would leave by Python's exit, which waits for the workers it did not kill."""
    done = subprocess.run([sys.executable, "-c", KILL_CHILDREN_WITH_A_LIVE_DATALOADER], capture_output=True,
                          text=True, timeout=120)
    assert done.returncode == 0 and "went on" in done.stdout, done.stderr[-2000:]
