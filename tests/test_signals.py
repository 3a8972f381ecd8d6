"""Pre-emption on one rank in this process: the handler only records the signal, and the stop decision is
the signal's before the wall-clock limit's (the multi-rank runs are in test_pretrain.py and test_faults.py)."""

import os
import signal
import time

import pytest

from megatron_neobert.training.process_guards import ExitSignalHandler, stop_requested


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
