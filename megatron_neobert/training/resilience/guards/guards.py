"""`Guards`: the run's guards in one object, which the training loop creates first, arms once its process group
exists and closes at its end (the parts are this room's other files)."""

import contextlib
from typing import Callable, Optional

import torch

from megatron_neobert.training.config.settings import FaultSettings
from megatron_neobert.training.resilience.guards.bus_errors import BusErrors
from megatron_neobert.training.resilience.guards.children import ChildrenTie, data_worker_init
from megatron_neobert.training.resilience.guards.hosts import HostAnswers
from megatron_neobert.training.resilience.guards.launcher import LauncherWatch
from megatron_neobert.training.resilience.guards.signals import ExitSignalHandler, stop_requested
from megatron_neobert.training.resilience.guards.watchdog import ProgressWatchdog


class Guards:
    """Created, the launcher watch runs (`launcher`, the entry point's, started before its imports; else one of its
    own, before the rendezvous, which would wait for a dead torchrun's store) and the exit signal is handled (a
    pre-emption signal during the set-up must not kill the rank either). `arm`, once the process group exists, adds
    the rest; `close` undoes what they changed in the process."""

    def __init__(self, faults: FaultSettings, launcher: Optional[LauncherWatch] = None):
        self.faults = faults
        self._stack = contextlib.ExitStack()
        self.launcher = launcher
        if launcher is None:
            self.launcher = LauncherWatch()
            self._stack.callback(self.launcher.close)
        self.signals = (self._stack.enter_context(ExitSignalHandler(faults.exit_signal))
                        if faults.exit_signal_handler else None)
        self.bus_errors: Optional[BusErrors] = None
        self.watchdog: Optional[ProgressWatchdog] = None

    def arm(self, describe_data_changes: Callable[[], str]) -> None:
        """On every rank of the process group (the host check's set-up is a collective): bus errors named with
        `describe_data_changes`, the forked children tied to the rank, the watchdog and the host check."""
        self.bus_errors = self._stack.enter_context(BusErrors(describe_data_changes))
        self._stack.enter_context(ChildrenTie())
        hosts = None
        if self.faults.host_check_after_s > 0 and torch.distributed.get_world_size() > 1:
            hosts = HostAnswers()  # a collective: every rank's settings agree
            self._stack.callback(hosts.close)
        self.watchdog = self._stack.enter_context(ProgressWatchdog(
            self.faults.distributed_timeout_minutes, self.faults.host_check_after_s, hosts, self.launcher))

    def at(self, iteration: int, phase: str) -> None:
        """The main thread starts `phase` of `iteration` (the watchdog's mark of progress); a process thawed after a
        stop past the bound ends first (`end_if_thawed`)."""
        self.end_if_thawed()
        self.watchdog.at(iteration, phase)

    def stop_requested(self, started: float) -> Optional[str]:
        """`signals.stop_requested` with this run's handler and --exit-duration-in-mins (a collective)."""
        return stop_requested(self.signals, started, self.faults.exit_duration_in_mins)

    def end_if_thawed(self) -> None:
        """A process stopped past the bound ends at once (`rules.thawed`), its torchrun with it. Called by the main
        thread before it writes (a phase's start, a step's end, its error's clean-up such as the --save lock's
        release): thawed, the main thread may run a step's end before the watchdog's thread looks, and a frozen
        host's part of the job must write nothing once the others went on without it."""
        if self.watchdog is not None:
            self.watchdog.end_if_thawed()

    @property
    def data_worker_init(self) -> Callable[[int], None]:
        """DataLoader `worker_init_fn`: ignores the exit signals, dies with the rank, names a bus error once armed.
        Not a method of this object, which holds what cannot be pickled: a loader whose workers the forkserver
        starts pickles it."""
        return data_worker_init if self.bus_errors is None else self.bus_errors.data_worker_init

    def close(self) -> None:
        self._stack.close()
