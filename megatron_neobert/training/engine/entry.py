"""The pre-training run's entry point: the process guards (pre-emption signals, the launcher's death, bus errors of
changed data files, the progress watchdog and its check of the other hosts) and the --save lock around the `Trainer`'s
phases, after the inputs are checked and the process group is made.

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
from megatron_neobert.parallel.hosts import HostAnswers
from megatron_neobert.parallel.launch import DistributedState, init_distributed
from megatron_neobert.checkpoint.lock import claim_save_dir
from megatron_neobert.training.engine.data_files import DataFiles
from megatron_neobert.training.reporting.goodput import GoodputAccount, LaunchersExitCloser, write_final_account
from megatron_neobert.errors import TrainingError
from megatron_neobert.training.resilience.process_guards import (ExitSignalHandler, ProgressWatchdog, bus_errors_named,
                                                                 exit_with_launcher, forked_children_die_with_rank,
                                                                 ignore_exit_signals, watched_launcher)
from megatron_neobert.training.config.run_checks import check_inputs, data_prefixes
from megatron_neobert.training.config.settings import Settings
from megatron_neobert.training.reporting.startup_report import describe_folder
from megatron_neobert.training.engine.forward_step import ForwardStep, mlm_forward_step
from megatron_neobert.training.engine.trainer import Trainer

logger = logging.getLogger(__name__)


def train(settings: Settings, forward_step: ForwardStep = mlm_forward_step,
          account: Optional[GoodputAccount] = None) -> dict:
    """Train on every rank of the process group (on CPU inside `parallel.cpu.cpu_execution()`); returns the
    history of `Trainer.run`.

    `forward_step`: megatron-core's `forward_step_func` (batch iterator, model) -> (output, loss
    function), for training and validation; `account`: the start-up's account so far (the entry point's: its
    imports), by default a new one from this call (a run called in a process that did other work before).
    """
    started = time.time()
    found = DistributedState()
    account = account or GoodputAccount(time.time())
    exit_with_launcher()  # before the rendezvous, which would wait for a dead torchrun's store
    closer = None
    if settings.checkpoint.save and watched_launcher() and os.environ.get("RANK") == "0":  # the final account's
        closer = LaunchersExitCloser.start(settings.checkpoint.save, watched_launcher())
    try:
        history = _guarded_train(settings, forward_step, started, account)
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


def _guarded_train(settings: Settings, forward_step: ForwardStep, started: float, account: GoodputAccount) -> dict:
    faults = settings.faults
    with contextlib.ExitStack() as guards:
        # The handler first: a pre-emption signal during the set-up must not kill the rank either.
        handler = guards.enter_context(ExitSignalHandler(faults.exit_signal)) if faults.exit_signal_handler else None
        tokenizer = check_inputs(settings.data)  # before the process group: bad input ends the run at once
        account.lap("input checks")
        init_distributed(faults.distributed_timeout_minutes)
        account.lap("rendezvous")
        data_files = DataFiles(data_prefixes(settings.data))
        guards.enter_context(bus_errors_named(data_files.describe_changes))
        forked_children_die_with_rank()
        keep_write_results_with_the_rank(settings.checkpoint.async_save, ignore_exit_signals)
        drop_the_sync_save_deprecation()
        hosts = None
        if faults.host_check_after_s > 0 and torch.distributed.get_world_size() > 1:
            hosts = HostAnswers()  # a collective: every rank's settings agree
            guards.callback(hosts.close)
        watchdog = guards.enter_context(ProgressWatchdog(faults.distributed_timeout_minutes,
                                                         faults.host_check_after_s, hosts))
        load_folder = describe_folder(settings.checkpoint.load)  # before the lock: it may make the folder
        lock = claim_save_dir(settings.checkpoint)
        if lock:
            guards.callback(lock.release)
        account.lap("guards and --save lock")
        return Trainer(settings, tokenizer, data_files, forward_step, handler, watchdog, started, load_folder,
                       account).run()
