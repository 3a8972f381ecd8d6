"""A rank's helper processes end with it: `ChildrenTie` ties the children its main thread forks to its lifetime,
`exit_now` ends it and them at once, `kill_stopped_local_ranks` ends a frozen peer beside it."""

import ctypes
import logging
import multiprocessing
import os
import signal
import sys
import threading

from megatron_neobert.training.resilience.guards.signals import ignore_exit_signals

logger = logging.getLogger(__name__)

_PR_SET_PDEATHSIG = 1


def die_with_parent(sig: int = signal.SIGKILL) -> None:
    """Linux: the kernel sends `sig` to this process when its parent exits."""
    try:
        ctypes.CDLL(None, use_errno=True).prctl(_PR_SET_PDEATHSIG, int(sig), 0, 0, 0)
    except (OSError, AttributeError):  # not Linux: the DataLoader's own parent check remains
        pass


def data_worker_init(worker_id: int) -> None:
    """DataLoader `worker_init_fn`: the rank handles pre-emption; the worker only dies with it."""
    ignore_exit_signals()
    die_with_parent()


class ChildrenTie:
    """Inside the block, every process the main thread forks (checkpoint writers, DataLoader workers) gets SIGKILL
    when this process ends, however it ends (kill -9 included).

    Fork hooks cannot be unregistered: a tie's hooks stay with the process and do nothing once its block ended."""

    def __init__(self):
        self._armed = False
        self._parent = None  # the forking process, while its main thread forks

    def __enter__(self):
        self._armed = True
        os.register_at_fork(before=self._before_fork, after_in_child=self._after_fork_in_child)
        return self

    def __exit__(self, *exc):
        self._armed = False

    def _before_fork(self) -> None:
        # The kernel signals a child when the *thread* that forked it ends: only children of the main
        # thread (which lives as long as the rank) may be tied to it.
        main = threading.current_thread() is threading.main_thread()
        self._parent = os.getpid() if self._armed and main else None

    def _after_fork_in_child(self) -> None:
        if self._parent is not None:
            die_with_parent()
            if os.getppid() != self._parent:  # the rank died between the fork and the prctl
                os._exit(1)


def kill_children() -> None:
    """SIGKILL this process's multiprocessing children (DataLoader workers, checkpoint writers).

    From the main thread, torch's DataLoader handler of SIGCHLD goes first: it raises in the main thread, wherever
    that is, as each worker it watches dies, which would cut short the report of the error that ends the rank."""
    if threading.current_thread() is threading.main_thread():
        signal.signal(signal.SIGCHLD, signal.SIG_DFL)
    for child in multiprocessing.active_children():
        child.kill()


def exit_now(code: int) -> None:
    """End this process with `code` at once, its multiprocessing children first.

    Python's own exit would join the children: persistent DataLoader workers wait for work and
    ignore the SIGTERM it sends them, so it would wait forever; other clean-up (a process group
    whose peer is gone) can block too.
    """
    kill_children()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)


def kill_stopped_local_ranks() -> None:
    """Under torchrun, SIGKILL the ranks beside this one that are stopped (SIGSTOP: a frozen peer). torchrun
    ends a failed job with SIGTERM, which a stopped process does not act on, and SIGKILL only 30 s later;
    a stopped rank has nothing to save or say, so the job ends now instead."""
    if "TORCHELASTIC_RUN_ID" not in os.environ:
        return
    import psutil

    try:
        siblings = psutil.Process(os.getppid()).children()
    except psutil.Error:
        return
    for rank in siblings:
        try:
            if rank.pid != os.getpid() and rank.status() == psutil.STATUS_STOPPED:
                logger.warning(f"rank {os.environ.get('RANK', '?')}: killing the stopped rank process {rank.pid}")
                rank.kill()
        except psutil.Error:  # gone meanwhile
            continue
