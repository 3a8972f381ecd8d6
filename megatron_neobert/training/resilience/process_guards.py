"""Process guards: how a rank and the processes around it end together, and never mid-checkpoint.

A training job ends in one of these six ways, and each rank must take part in the same one:
- Pre-emption. The scheduler sends `--exit-signal` (SIGTERM by default, as Megatron-LM), or the
  `--exit-duration-in-mins` wall-clock limit runs out. `ExitSignalHandler`, a context manager around the
  run, only sets a flag; once per step `stop_requested` agrees on it with one all-reduce, so that every rank
  saves and stops at the same step even when the scheduler signalled one process (as Megatron-LM's
  DistributedSignalHandler does) or one rank's clock ran out first.
  The signal reaches whole process groups (torchrun forwards it to each rank's group, SLURM signals every
  process of a step), so the rank's helpers get it too. DataLoader workers would die of it and the rank's
  next batch would fail before it can save: `data_worker_init` makes them ignore the exit signals and die
  with their rank. megatron-core's write-results server would die of it in the middle of a save:
  `megatron_core_compat.keep_write_results_with_the_rank` starts none for a synchronous save, and one that
  ignores the exit signals and dies with its rank for an asynchronous one.
- A rank that dies. Its helpers must not outlive it: `forked_children_die_with_rank` has every child the
  rank's main thread forks (checkpoint writers, DataLoader workers) killed with it, kill -9 included; a
  checkpoint writer whose rank died would otherwise wait on it forever (in `count_queue.get()`).
- A launcher that dies. Under torchrun, `exit_with_launcher` ends a rank whose torchrun is gone (`kill -9`
  of torchrun, or of its node's agent) instead of training on unwatched; `exit_now` ends a failed rank
  and its helpers at once, so that torchrun learns of the failure; `kill_stopped_local_ranks` ends a
  frozen (SIGSTOPped) peer, which would not act on torchrun's SIGTERM.
- A data file that changes under the job. Reading a memory-mapped dataset file that was truncated raises a bus
  error inside the read; `bus_errors_named` turns it into one line naming the file, in the rank and its DataLoader
  workers, instead of a bare "Bus error" (or torch's guess, a lack of shared memory).
- A peer that hangs. The others wait in their next collective without a word until
  --distributed-timeout-minutes; `ProgressWatchdog` says in the log, at half that time, which iteration
  and phase the rank waits in.
- A host cut off from the network (or powered off, or frozen). After --host-check-after-s without progress
  `ProgressWatchdog` asks the other hosts to answer (`parallel.hosts`); a silent one ends the attempt with one line
  naming it, and on the host cut off from the rendezvous, its torchrun with it.
"""

import contextlib
import ctypes
import logging
import multiprocessing
import os
import signal
import sys
import threading
import time
from typing import Callable, Optional

from megatron_neobert.atomic_write import write_json_atomic
from megatron_neobert.training.config.settings import EXIT_SIGNAL_NAMES

logger = logging.getLogger(__name__)

EXIT_SIGNALS = {name: getattr(signal, name) for name in EXIT_SIGNAL_NAMES}
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
    """DataLoader `worker_init_fn`: the rank handles pre-emption; the worker only dies with it. A bus error is
    named as in the rank (torch's worker set-up replaced the handler with its own, which blames shared memory)."""
    ignore_exit_signals()
    die_with_parent()
    _install_bus_error_handler()


_SIGNAL_HANDLER = ctypes.CFUNCTYPE(None, ctypes.c_int)
_bus_error = {"describe": None, "handler": None}


@contextlib.contextmanager
def bus_errors_named(describe: Callable[[], str]):
    """Inside the block a bus error in this process, or in a DataLoader worker it forks, ends it with one line:
    `describe()` says what changed among the memory-mapped files it reads. The kernel raises it inside the read
    that touches a page of a file truncated under the job; a handler installed with Python's `signal` would run
    only after that read returns, which it never does, so this one is installed with the C library and runs inside
    the read."""
    _bus_error["describe"] = describe
    previous = _install_bus_error_handler()
    try:
        yield
    finally:
        _bus_error["describe"] = None
        _c_signal(signal.SIGBUS, previous)


def _c_signal(sig: int, handler) -> Optional[int]:
    """The C library's signal(): installs `handler` (a C function pointer, None for the default); returns the
    previous one."""
    libc = ctypes.CDLL(None, use_errno=True)
    libc.signal.argtypes, libc.signal.restype = (ctypes.c_int, ctypes.c_void_p), ctypes.c_void_p
    return libc.signal(sig, handler)


def _install_bus_error_handler() -> Optional[int]:
    if _bus_error["describe"] is None:
        return None

    def on_bus_error(signum):
        try:
            cause = _bus_error["describe"]()
        except BaseException as err:  # noqa: BLE001 - the line must be written whatever the description does
            cause = f"(which file is unknown: {type(err).__name__}: {err})"
        os.write(2, f"error: rank {os.environ.get('RANK', '0')}: bus error reading a memory-mapped data file: "
                    f"{cause}\n".encode())
        exit_now(1)

    _bus_error["handler"] = _SIGNAL_HANDLER(on_bus_error)  # kept: the C library holds only its address
    return _c_signal(signal.SIGBUS, ctypes.cast(_bus_error["handler"], ctypes.c_void_p))


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


_launcher_watch = {"launcher": None}  # torchrun's pid, once the watch started


def exit_with_launcher(poll_s: float = 1.0) -> None:
    """Under torchrun (TORCHELASTIC_RUN_ID set), exit when the parent torchrun is gone.

    A thread compares the parent pid with the one at start: the main thread may be blocked in a
    collective, or in the rendezvous, whose store torchrun hosted. Start it first thing, before the imports and the
    process group (a second call does nothing). Outside torchrun nothing is watched (a `nohup` run must survive its
    shell).
    """
    if "TORCHELASTIC_RUN_ID" not in os.environ or _launcher_watch["launcher"] is not None:
        return
    _launcher_watch["launcher"] = os.getppid()

    def watch():
        while True:
            time.sleep(poll_s)
            _exit_if_reparented()

    threading.Thread(target=watch, name="launcher-watch", daemon=True).start()


def watched_launcher() -> Optional[int]:
    """torchrun's pid, where `exit_with_launcher` watches it (under torchrun), else None."""
    return _launcher_watch["launcher"]


def exit_if_launcher_gone(wait_s: float = 2.0) -> None:
    """After a failure to reach torchrun's store: end the rank as the launcher watch would, when torchrun is gone
    (a rank that writes to the store every step meets the broken pipe before the watch's next look). The pipe breaks
    as torchrun's files close, a moment before the kernel hands its children to another parent: waits up to
    `wait_s` for that. Returns when torchrun is still there (the failure is another one)."""
    if _launcher_watch["launcher"] is None:
        return
    deadline = time.monotonic() + wait_s
    while time.monotonic() < deadline:
        _exit_if_reparented()
        time.sleep(0.05)


def _exit_if_reparented() -> None:
    launcher = _launcher_watch["launcher"]
    if os.getppid() != launcher:
        logger.warning(f"rank {os.environ.get('RANK', '?')}: torchrun (pid {launcher}) is gone; exiting "
                       f"without saving (the latest complete checkpoint stays the one to resume from)")
        exit_now(1)


def tell_the_launcher(line: str) -> None:
    """Under torchrun, the rank's reply file (TORCHELASTIC_ERROR_FILE) holds the error line: torchrun's failure
    summary, printed last after its own traceback, then shows it as the root cause's "traceback" instead of
    "To enable traceback see: ...". torchrun's traceback itself cannot be avoided: it raises ChildFailedError for
    any rank that exits with a non-zero status (docs/training.md says how to read it)."""
    path = os.environ.get("TORCHELASTIC_ERROR_FILE")
    if path:
        write_json_atomic(path, {"message": {"message": line, "extraInfo": {
            "py_callstack": line, "timestamp": str(int(time.time()))}}})


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
    # torch on first use: the rest of this module needs none.
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


class ProgressWatchdog:
    """Inside the block, a thread notices when the main thread has not moved on for half the collectives'
    timeout and prints where it waits (`at` tells it), long before the timeout ends the run.

    With `hosts` (`parallel.hosts.HostAnswers`), after `host_check_after_s` without progress, and as often again while
    the main thread waits, it asks ranks on the neighbouring hosts and the rendezvous store whether they answer. A
    slow peer's host answers and is waited for; a host that does not (cut off, powered off, frozen) ends the attempt
    at once with one line naming it, so that torchrun's restart or the elastic rendezvous takes over in about a
    minute instead of the collective's timeout. A rank that reaches neither is the one cut off, and one that cannot
    reach the store's host has lost it: either way its torchrun cannot restart anything (its store calls to that host
    wait on TCP's retries, about 15 minutes), so the rank ends it too."""

    def __init__(self, timeout_minutes: float, host_check_after_s: float = 0, hosts=None):
        self.timeout_minutes = timeout_minutes
        self.after_s = timeout_minutes * 60 / 2  # half the collectives' timeout
        self.hosts = hosts if host_check_after_s > 0 else None
        self.host_check_after_s = host_check_after_s
        self._where = (time.monotonic(), 0, "set-up")
        self._warned_for = None
        self._checked_at = None
        self._stop = threading.Event()
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

    def _watch(self) -> None:
        while not self._stop.wait(self._poll_s()):
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
                # no progress meanwhile: the wait is on the silent host
                if found.someone_silent and self._where is where:
                    self._end_attempt(found, iteration, phase, time.monotonic() - since)

    def _end_attempt(self, found, iteration: int, phase: str, idle: float) -> None:
        # Here, not at the top: the entry point imports this module before --help, and parallel.hosts imports torch.
        from megatron_neobert.parallel.hosts import ANSWER_S

        rank = os.environ.get("RANK", "0")
        why = f"at iteration {iteration} ({phase}; no answer within {ANSWER_S:g} s after {idle:.0f} s without progress)"
        launcher = watched_launcher()
        and_torchrun = (f" and torchrun (pid {launcher}), which cannot restart it without that host" if launcher
                        else "")
        store = self.hosts.rendezvous
        if found.cut_off:
            line = (f"error: rank {rank}: the rendezvous host {store.name} ({store.address}) is unreachable {why}: "
                    f"this host is cut off from the job; ending this attempt{and_torchrun}")
        elif found.store_silent:
            line = (f"error: rank {rank}: the rendezvous host {store.name} ({store.address}) stopped answering {why}; "
                    f"the job cannot go on without its store: ending this attempt{and_torchrun}")
        else:
            names = ", ".join(f"{host.name} ({host.address})" for host in found.silent)
            then = ("torchrun restarts it, or goes on without the host under --nnodes MIN:MAX" if launcher else
                    "srun --kill-on-bad-exit ends the job step; its requeue resumes from the latest checkpoint")
            line = (f"error: rank {rank}: host{'s' if len(found.silent) > 1 else ''} {names} stopped answering {why}; "
                    f"ending this attempt ({then})")
        print(line, file=sys.stderr, flush=True)
        tell_the_launcher(line)
        if launcher and found.store_silent:  # else torchrun restarts the workers, or goes on without the host
            os.kill(launcher, signal.SIGKILL)  # its SIGTERM handler would wait on the unreachable store
        exit_now(1)
