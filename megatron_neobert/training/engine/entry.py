"""The pre-training run's entry point: the run's guards (`resilience/guards/`: pre-emption signals, the launcher's
death, bus errors of changed data files, the progress watchdog and its check of the other hosts), created here and
closed at the run's end, and the --save lock around the `Trainer`'s phases, after the inputs are checked and the
process group is made.

`train(settings)` runs on every rank of an initialised (or torchrun) process group and returns the
history of the run.
"""

import contextlib
import logging
import os
import time
from typing import Optional

import torch

from megatron_neobert.megatron_core_compat import drop_the_sync_save_deprecation, keep_write_results_with_the_rank
from megatron_neobert.parallel.launch import DistributedState, init_distributed
from megatron_neobert.checkpoint.lock import claim_save_dir
from megatron_neobert.training.engine.data_files import DataFiles
from megatron_neobert.training.reporting.goodput import GoodputAccount, LaunchersExitCloser, write_final_account
from megatron_neobert.errors import TrainingError
from megatron_neobert.training.resilience.guards.guards import Guards
from megatron_neobert.training.resilience.guards.launcher import LauncherWatch
from megatron_neobert.training.resilience.guards.signals import ignore_exit_signals
from megatron_neobert.training.config.run_checks import check_inputs, data_prefixes
from megatron_neobert.training.config.settings import Settings
from megatron_neobert.training.reporting.startup_report import describe_folder
from megatron_neobert.training.engine.forward_step import ForwardStep, mlm_forward_step
from megatron_neobert.training.engine.trainer import Trainer

logger = logging.getLogger(__name__)


def train(settings: Settings, forward_step: ForwardStep = mlm_forward_step,
          account: Optional[GoodputAccount] = None, launcher: Optional[LauncherWatch] = None) -> dict:
    """Train on every rank of the process group (on CPU inside `parallel.cpu.cpu_execution()`); returns the
    history of `Trainer.run`.

    `forward_step`: megatron-core's `forward_step_func` (batch iterator, model) -> (output, loss
    function), for training and validation; `account`: the start-up's account so far (the entry point's: its
    imports), by default a new one from this call (a run called in a process that did other work before);
    `launcher`: the entry point's watch of torchrun, by default one of the run's own.
    """
    started = time.time()
    found = DistributedState()
    account = account or GoodputAccount(time.time())
    guards = Guards(settings.faults, launcher)  # first: the launcher watch and the exit signal's handler
    closer = None
    if settings.checkpoint.save and guards.launcher.pid and os.environ.get("RANK") == "0":  # the final account's
        closer = LaunchersExitCloser.start(settings.checkpoint.save, guards.launcher.pid)
    try:
        history = _guarded_train(settings, guards, forward_step, started, account)
    except TrainingError:  # raised alike on every rank, whose groups are whole: they can be destroyed
        found.release()
        raise  # the rank's exit closes the closer's pipe: it ends without touching the account
    rank = torch.distributed.get_rank()
    found.release()  # what the run created goes with it (each gloo group holds threads and sockets)
    now = time.time()  # the last moment before the exit: the final account ends here
    history["goodput"] = account.close(now)
    if rank == 0:
        logger.info(account.table(now))
        write_final_account(account, now, history["iteration"], settings.checkpoint.save,
                            settings.logging.tensorboard_dir)
        if closer:
            closer.close_at(now)
    return history


def _guarded_train(settings: Settings, guards: Guards, forward_step: ForwardStep, started: float,
                   account: GoodputAccount) -> dict:
    with contextlib.ExitStack() as held:
        held.callback(guards.close)
        tokenizer = check_inputs(settings.data)  # before the process group: bad input ends the run at once
        account.lap("input checks")
        init_distributed(settings.faults.distributed_timeout_minutes)
        account.lap("rendezvous")
        data_files = DataFiles(data_prefixes(settings.data))
        guards.arm(data_files.describe_changes)
        keep_write_results_with_the_rank(settings.checkpoint.async_save, ignore_exit_signals)  # after arm's fork tie
        drop_the_sync_save_deprecation()
        load_folder = describe_folder(settings.checkpoint.load)  # before the lock: it may make the folder
        lock = claim_save_dir(settings.checkpoint)
        if lock:
            held.callback(lock.release)
        account.lap("guards and --save lock")
        try:
            return Trainer(settings, tokenizer, data_files, forward_step, guards, started, load_folder, account).run()
        except BaseException:  # a thawed host's collective fails: it ends before the lock's release writes
            guards.end_if_thawed()
            raise
