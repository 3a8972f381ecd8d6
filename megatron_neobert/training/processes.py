"""Helper processes that neither steal the pre-emption signal nor outlive the job.

A scheduler's pre-emption signal reaches whole process groups (torchrun forwards it to each
rank's group, SLURM signals every process of a step), so the rank's helpers get it too:
- DataLoader workers would die of it, and the rank's next batch fails before it can save.
  `data_worker_init` makes them ignore the exit signals and die with their rank.
- megatron-core 0.16 collects a synchronous save's write results through a queue of a spawned
  `multiprocessing.Manager` server (filesystem_async._get_write_results_queue): that server dies
  of the signal in the middle of a save (BrokenPipeError), and survives a rank killed with -9
  (~370 MB each). The save is synchronous here, so the results never leave the rank's process:
  `keep_write_results_in_process` gives megatron-core an in-process queue instead, and no server
  is started. Its per-file writers are forked children that inherit the rank's handlers and exit
  when their file is written; a writer whose rank dies mid-save waits on the rank forever (in
  `count_queue.get()`), so `forked_children_die_with_rank` has every child the rank's main thread
  forks die with it.
- The ranks themselves: under torchrun, `exit_with_launcher` ends a rank whose torchrun is gone
  (`kill -9` of torchrun, or of its node's agent) instead of training on unwatched; `exit_now`
  ends a failed rank and its helpers at once, so that torchrun learns of the failure.
"""

import ctypes
import multiprocessing
import os
import queue
import signal
import sys
import threading
import time

EXIT_SIGNALS = {name: getattr(signal, name) for name in ("SIGTERM", "SIGINT", "SIGUSR1", "SIGUSR2")}
_PR_SET_PDEATHSIG = 1


def die_with_parent(sig: int = signal.SIGKILL) -> None:
    """Linux: the kernel sends `sig` to this process when its parent exits."""
    try:
        ctypes.CDLL(None, use_errno=True).prctl(_PR_SET_PDEATHSIG, int(sig), 0, 0, 0)
    except (OSError, AttributeError):  # not Linux: the DataLoader's own parent check remains
        pass


_fork = {"registered": False, "parent": None}


def _before_fork() -> None:
    # The kernel signals a child when the *thread* that forked it ends: only children of the main
    # thread (which lives as long as the rank) may be tied to it.
    main = threading.current_thread() is threading.main_thread()
    _fork["parent"] = os.getpid() if main else None


def _after_fork_in_child() -> None:
    parent = _fork["parent"]
    if parent is not None:
        die_with_parent()
        if os.getppid() != parent:  # the rank died between the fork and the prctl
            os._exit(1)


def forked_children_die_with_rank() -> None:
    """Every process the main thread forks from now on (checkpoint writers, DataLoader workers)
    gets SIGKILL when this process ends, however it ends (kill -9 included)."""
    if not _fork["registered"]:
        os.register_at_fork(before=_before_fork, after_in_child=_after_fork_in_child)
        _fork["registered"] = True


def ignore_exit_signals() -> None:
    for sig in EXIT_SIGNALS.values():
        signal.signal(sig, signal.SIG_IGN)


def data_worker_init(worker_id: int) -> None:
    """DataLoader `worker_init_fn`: the rank handles pre-emption; the worker only dies with it."""
    ignore_exit_signals()
    die_with_parent()


def kill_children() -> None:
    """SIGKILL this process's multiprocessing children (DataLoader workers, checkpoint writers)."""
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
                print(f"rank {os.environ.get('RANK', '?')}: killing the stopped rank process {rank.pid}",
                      file=sys.stderr, flush=True)
                rank.kill()
        except psutil.Error:  # gone meanwhile
            continue


def keep_write_results_in_process() -> None:
    """A synchronous save writes from the rank itself: its write results need no queue across processes,
    whose Manager server megatron-core would otherwise spawn, a process outside the rank's reach."""
    from megatron.core.dist_checkpointing.strategies import filesystem_async

    if not isinstance(filesystem_async._results_queue, queue.Queue):
        filesystem_async._results_queue = queue.Queue()


def exit_with_launcher(poll_s: float = 1.0) -> None:
    """Under torchrun (TORCHELASTIC_RUN_ID set), exit when the parent torchrun is gone.

    A thread compares the parent pid with the one at start: the main thread may be blocked in a
    collective. Outside torchrun nothing is watched (a `nohup` run must survive its shell).
    """
    if "TORCHELASTIC_RUN_ID" not in os.environ:
        return
    launcher = os.getppid()

    def watch():
        while True:
            time.sleep(poll_s)
            if os.getppid() != launcher:
                print(f"rank {os.environ.get('RANK', '?')}: torchrun (pid {launcher}) is gone; exiting "
                      f"without saving (the latest complete checkpoint stays the one to resume from)",
                      file=sys.stderr, flush=True)
                exit_now(1)

    threading.Thread(target=watch, name="launcher-watch", daemon=True).start()
