"""A run on one rank, as named phases: `set_up` (the checkpoint to start from, the model's shape and the checks on it,
model, optimizer and schedule), `resume` (the checkpoint loaded, the data positioned), then `step`, `validate` and
`save` as the run asks, and `finish`. `run()` holds their order and keeps what the first two return; the process
guards (`resilience/guards/`: signals, watchdog, the host check) and the --save lock are around it, in `entry.py`;
the trainer marks its progress for the watchdog and asks the guards whether to stop.
"""

import collections
import contextlib
import dataclasses
import datetime
import logging
import time
from typing import Any, Iterator, List, Optional

import torch
from megatron.core import parallel_state
from megatron.core.utils import get_model_config

from megatron_neobert.model import ModelShape
from megatron_neobert.model.kernel_report import format_report, kernel_report
from megatron_neobert.megatron_core_compat import micro_batch_calculator
from megatron_neobert.training.config.batch_size import check_batch_sizes
from megatron_neobert.checkpoint.integrity import sealed_at
from megatron_neobert.checkpoint.layout import find_pretrained_checkpoint, iteration_dir
from megatron_neobert.checkpoint.state import (AsyncSaves, holds_training_state, load_checkpoint,
                                                        megatron_lm_args, read_checkpoint, save_checkpoint)
from megatron_neobert.training.engine.data_files import DataFiles
from megatron_neobert.training.engine.data_setup import build_data
from megatron_neobert.errors import HostError, TrainingError
from megatron_neobert.training.engine.evaluate import evaluate
from megatron_neobert.training.reporting.goodput import GoodputAccount
from megatron_neobert.training.reporting.metrics import step_flops
from megatron_neobert.training.engine.model_setup import (finish_param_sync, resume_param_sync, run_model_shape,
                                                          setup_model_and_optimizer)
from megatron_neobert.training.engine.train_step import TrainState, train_step
from megatron_neobert.training.resilience.guards.guards import Guards
from megatron_neobert.training.reporting.profiling import StepProfiler
from megatron_neobert.training.resilience.restarts import RestartReport, world_size_change
from megatron_neobert.training.resilience.save_interval import SaveInterval
from megatron_neobert.training.resilience.guards.straggler import StragglerDetector
from megatron_neobert.training.config.run_checks import (check_model_shape, check_optimizer_setup, check_parallel_shape,
                                                         check_positions, check_tokenizer_matches_checkpoint,
                                                         check_vocabulary, check_vocabulary_rows)
from megatron_neobert.training.config.schedule import checkpoint_schedule_note
from megatron_neobert.training.config.settings import Settings
from megatron_neobert.training.reporting.startup_report import describe_layout, startup_notes
from megatron_neobert.training.engine.forward_step import ForwardStep, params_are_finite
from megatron_neobert.training.reporting.train_log import TrainingLog

# Settings that define the order of the samples; a checkpoint's data position applies only to the
# same order (a longer --train-iters or another masking keeps it: the epochs' order is the same).
DATA_STREAM_KEYS = ("data_path", "data_args_path", "per_split_data_args_path", "train_data_path", "mock_data",
                    "split", "seq_length", "packed", "seed", "tokenizer_type", "tokenizer_model")

# The steps whose records `run` returns: the last ones, so that a long run's memory stays flat (a record takes
# about 750 bytes: the 1M steps of the recipe would take 0.7 GiB on every rank).
HISTORY_STEPS = 1000

logger = logging.getLogger(__name__)


def data_stream(settings: Settings) -> dict:
    values = settings.as_dict()
    return {k: values[k] for k in DATA_STREAM_KEYS}


def num_micro_batches(settings: Settings) -> int:
    """Micro-batches per data-parallel rank of a whole --global-batch-size (a validation's; a training step's are
    fewer while --rampup-batch-size grows the batch), once every global batch size of the run is checked."""
    dp = parallel_state.get_data_parallel_world_size()
    check_batch_sizes(settings.training, dp)
    return settings.training.global_batch_size // (settings.training.micro_batch_size * dp)


def stop_reason(settings: Settings, state: TrainState, guards: Guards, started: float) -> Optional[str]:
    faults = settings.faults
    requested = guards.stop_requested(started)
    if requested:
        return requested
    if faults.exit_interval and state.iteration % faults.exit_interval == 0:
        return "exit-interval"
    return None


def should_save(settings: Settings, state: TrainState, stop: Optional[str], interval_due: bool) -> bool:
    """Save at the interval (`interval_due`: --save-interval's say), at the end and when stopping early. At the
    interval a skipped step is not saved (its weights are those of the last good step, already saved or about to
    be); at the end it is: a skipped step changes no weight, optimizer or schedule state, so its checkpoint holds the
    last finite state at the position the uninterrupted run would be at."""
    if not settings.checkpoint.save:
        return False
    if stop or state.iteration == settings.training.train_iters:
        return True
    return interval_due and not state.skipped_in_a_row


@dataclasses.dataclass(frozen=True)
class Built:
    """What `Trainer.set_up` decided and built: where the run starts, the model and its optimizer."""

    checkpoint: Optional[str]  # the iteration folder the run starts from (None: from scratch)
    common: Optional[dict]  # its common state
    pretrained: bool  # it is --pretrained-checkpoint's: its weights alone load, as with --finetune
    shape: ModelShape
    chunks: List[Any]  # this rank's model chunks, one per virtual pipeline stage
    optimizer: Any
    scheduler: Any
    num_micro: int  # micro-batches per data-parallel rank of a whole global batch (a validation step's)


@dataclasses.dataclass(frozen=True)
class LoopParts:
    """What `Trainer.resume` made for the step loop, from the position the run resumes at."""

    restarts: RestartReport
    evals_done: int  # validations before that position
    train_iter: Iterator
    valid_iter: Optional[Iterator]  # None without a validation split
    batch_sizes: Any  # megatron-core's micro-batch calculator (--rampup-batch-size)
    async_saves: Optional[AsyncSaves]  # with --async-save
    log: TrainingLog
    profiler: StepProfiler
    save_interval: SaveInterval
    straggler: Optional[StragglerDetector]  # None on one rank, or with --no-straggler-detection and no report


class Trainer:
    """The run's phases on this rank (on CPU inside `parallel.cpu.cpu_execution()`), over an initialised process
    group. `tokenizer`: the checked one (`run_checks.check_inputs`); `load_folder`: what --load held before the
    run's start, in words (`startup_report.describe_folder`); `account`: the wall time of this attempt so far, by
    category (continued from the checkpoint the run resumes from).

    Its whole state is declared here: what `set_up` returns (`built`), what `resume` returns (`loop_parts`), and
    what the steps and saves change. A phase that needs one of the two before it exists raises a RuntimeError naming
    the phase to run first."""

    def __init__(self, settings: Settings, tokenizer, data_files: DataFiles, forward_step: ForwardStep,
                 guards: Guards, started: float, load_folder: str, account: GoodputAccount):
        self.settings, self.tokenizer, self.data_files = settings, tokenizer, data_files
        self.forward_step, self.guards = forward_step, guards
        self.started, self.load_folder, self.account = started, load_folder, account
        self._built: Optional[Built] = None
        self._loop_parts: Optional[LoopParts] = None
        self.state = TrainState()
        self.saved_account: Optional[dict] = None  # the account of the checkpoint the run resumes from
        self.first_step_reported = False
        self.last_saved_iteration = 0  # of the last save, or the iteration the run resumed at
        self.window_start = 0.0  # when the train log's window of steps began (perf_counter)
        self.window_began_at = (0, 0.0)  # the iteration and FLOPs so far at the window's start
        self.drained: Optional[str] = None  # the straggler's host whose part of the job ends (--straggler-exit-...)
        self.async_save_began = 0.0  # when the save in flight began (time.time)
        self.history = {"train": collections.deque(maxlen=HISTORY_STEPS), "eval": [],
                        "exit": "skip-train" if settings.evaluation.skip_train else "finished"}

    @property
    def built(self) -> Built:
        if self._built is None:
            raise RuntimeError("Trainer.set_up has not run: it comes first (Trainer.run holds the phases' order)")
        return self._built

    @property
    def loop_parts(self) -> LoopParts:
        if self._loop_parts is None:
            raise RuntimeError("Trainer.resume has not run: it comes after set_up and before the steps, validations "
                               "and saves (Trainer.run holds the phases' order)")
        return self._loop_parts

    def run(self) -> dict:
        """{"train": [records of the last HISTORY_STEPS steps], "eval": [records], "iteration", "exit": "finished" |
        "signal" | "exit-duration" | "exit-interval" | "skip-train", "skipped", "goodput": the job's account (a
        snapshot), "save_interval": the last interval in iterations (auto's choice), "startup": [(part, seconds)] of
        this attempt's start-up}."""
        self._built = self.set_up()
        self._loop_parts = self.resume()
        training, evaluation = self.settings.training, self.settings.evaluation
        try:
            if evaluation.skip_train:
                self.validate()
            while not evaluation.skip_train and self.state.iteration < training.train_iters:
                self.step()
                if self.loop_parts.valid_iter is not None and evaluation.eval_interval \
                        and self.state.iteration % evaluation.eval_interval == 0:
                    self.validate()
                self.guards.at(self.state.iteration, "agreeing whether to stop")
                stop = stop_reason(self.settings, self.state, self.guards, self.started) or (
                    "straggler" if self.drained else None)
                self.finish_async_save(blocking=False)
                due = self.loop_parts.save_interval.due(self.state.iteration, self.last_saved_iteration)
                if should_save(self.settings, self.state, stop, due):
                    self.save()
                if stop:
                    logger.info(f"stopping at iteration {self.state.iteration} ({stop})")
                    self.history["exit"] = stop
                    break
            self.loop_parts.profiler.stop()  # a run stopped inside the window still writes it
            with self.timed("save", count=0):
                self.finish_async_save(blocking=True)
            if self.drained:
                self.end_for_straggler()
            self.account.run_ended = time.time()  # the rest is shutdown, up to the account's close (entry.train)
        finally:
            self.loop_parts.log.close()
        return self.finish()

    @contextlib.contextmanager
    def timed(self, category: str, count: int = 1):
        began = time.perf_counter()  # a duration: immune to the wall clock's steps
        yield
        self.account.add(category, time.perf_counter() - began, count)

    def set_up(self) -> Built:
        """The checkpoint to start from (--load's, else --pretrained-checkpoint's), the model's shape, decided once
        and then checked, and this rank's model chunks, optimizer and schedule."""
        settings, options = self.settings, self.settings.checkpoint
        verify = not options.no_verify_checkpoint
        checkpoint, common = read_checkpoint(options.load, options.ckpt_step, verify) if options.load else (None, None)
        pretrained = checkpoint is None and options.pretrained_checkpoint is not None
        if pretrained:  # as Megatron-LM: a run that has not saved yet starts from these weights
            find_pretrained_checkpoint(options.pretrained_checkpoint)  # one that holds none is refused
            checkpoint, common = read_checkpoint(options.pretrained_checkpoint, None, verify)
            logger.info(f"no checkpoint in --load {options.load}: starting from --pretrained-checkpoint {checkpoint}")
        shape = run_model_shape(settings, self.tokenizer.vocab_size, common)
        check_vocabulary(self.tokenizer, shape.arch)
        check_positions(settings, shape.arch)
        check_parallel_shape(settings, shape)
        check_vocabulary_rows(settings, shape, checkpoint)
        if checkpoint:
            check_tokenizer_matches_checkpoint(self.tokenizer, checkpoint, common)
            check_model_shape(shape, checkpoint, common)
        self.account.lap("checkpoint metadata, model shape and checks")
        _, chunks, optimizer, scheduler = setup_model_and_optimizer(settings, shape, self.account.lap)
        num_micro = num_micro_batches(settings)
        logger.info(format_report(kernel_report(settings.model.transformer_impl, settings.data.data_loader)))
        logger.info(describe_layout(settings, shape, len(chunks), num_micro))
        for note in startup_notes(settings, shape):
            logger.info(note)
        self.account.lap("kernels and layout lines")
        return Built(checkpoint, common, pretrained, shape, chunks, optimizer, scheduler, num_micro)

    def resume(self) -> LoopParts:
        """The checkpoint loaded (a fine-tune start: the weights alone, at iteration 0) and the data read from the
        run's position; then the step loop's companions (batch ramp, logs, profiler, asynchronous saves)."""
        settings, options, built = self.settings, self.settings.checkpoint, self.built
        training, evaluation = settings.training, settings.evaluation
        if built.checkpoint:
            finetune = options.finetune or built.pretrained
            if not finetune and not holds_training_state(built.common):
                logger.info(f"{built.checkpoint} holds model weights only: starting from iteration 0 as with "
                            f"--finetune")
                finetune = True
            self.state = self.load(finetune)
            self.account.lap("checkpoint load", category="load")
            change = None if finetune else world_size_change(built.common, built.num_micro)
            if change:
                logger.info(change)
        elif options.load:
            logger.info(f"no checkpoint in {options.load} ({self.load_folder}): starting from scratch")
        restarts = RestartReport(self.state.iteration,
                                 datetime.timedelta(minutes=settings.faults.distributed_timeout_minutes),
                                 self.guards.launcher)
        if built.checkpoint and self.saved_account:  # the job's account goes on
            self.account.continue_from(self.saved_account, sealed_at(built.checkpoint), self.state.iteration,
                                       restarts.failed_at)
        evals_done = self.state.iteration // evaluation.eval_interval if evaluation.eval_interval else 0
        _, train_iter, valid_iter = build_data(settings, self.state.consumed_samples,
                                               evals_done * evaluation.eval_iters * training.global_batch_size,
                                               self.tokenizer, self.guards.data_worker_init)
        self.account.lap("data sets and loaders")
        batch_sizes = micro_batch_calculator(training.global_batch_size, training.rampup_batch_size,
                                             training.micro_batch_size, parallel_state.get_data_parallel_world_size())
        batch_sizes.update(self.state.consumed_samples, consistency_check=True)
        if evaluation.skip_train and valid_iter is None:
            raise TrainingError("--skip-train runs one validation of --eval-iters batches, and there is none to "
                                "run: give a validation split (--split or --valid-data-path) and --eval-iters and "
                                "--eval-interval above 0")
        log = TrainingLog(settings, built.shape.arch, built.shape.padded_vocab_size)
        watched = settings.faults.straggler_detection or settings.logging.log_straggler
        parts = LoopParts(
            restarts, evals_done, train_iter, valid_iter, batch_sizes,
            async_saves=AsyncSaves() if options.async_save else None, log=log, profiler=StepProfiler(settings),
            save_interval=SaveInterval(options.save_interval, settings.logging.log_interval,
                                       torch.distributed.get_world_size(), options.failure_rate_per_gpu_day),
            straggler=StragglerDetector(settings, get_model_config(built.chunks[0]), log, self.account,
                                        self.guards.launcher) if watched and torch.distributed.get_world_size() > 1 else None)
        self.last_saved_iteration = self.state.iteration
        self.window_began_at = (self.state.iteration, self.state.floating_point_operations)
        self.account.lap("logs, profiler")
        self.window_start = time.perf_counter()
        return parts

    def load(self, finetune: bool) -> TrainState:
        """The checkpoint's weights (and unless `finetune` its optimizer, schedule, RNG and data position)."""
        settings, options, built = self.settings, self.settings.checkpoint, self.built
        checkpoint, common = built.checkpoint, built.common
        if not (finetune or options.no_load_optim):
            check_optimizer_setup(settings, checkpoint, common)
        flags_schedule = built.scheduler.state_dict()
        keeps_position = not finetune and common["train_state"]["data_stream"] == data_stream(settings)
        if not finetune:  # before the load: data that changed is refused at once
            self.data_files.check_resume(common["train_state"].get("data_files"), checkpoint, keeps_position,
                                         options.allow_data_change)
        load_checkpoint(checkpoint, common, built.chunks, built.optimizer, built.scheduler,
                        load_optimizer=not options.no_load_optim, load_rng=not options.no_load_rng,
                        finetune=finetune, strict=options.dist_ckpt_strictness)
        note = None if finetune else checkpoint_schedule_note(flags_schedule, built.scheduler.state_dict())
        if note:
            logger.info(note)
        state = TrainState()
        if not finetune:
            saved = common["train_state"]
            state = TrainState(iteration=common["iteration"], skipped_iters=saved["skipped_iters"],
                               skipped_in_a_row=saved.get("skipped_in_a_row", 0), last_checkpoint=checkpoint,
                               floating_point_operations=common.get("num_floating_point_operations_so_far", 0.0))
            if keeps_position:
                state.consumed_samples = saved["consumed_samples"]
            else:  # stage 2: new data or length; the old position means nothing there
                logger.info(f"data settings differ from the checkpoint's: reading the new data "
                            f"from its start (checkpoint: {saved['data_stream']})")
        self.saved_account = None if finetune else common["train_state"].get("goodput")
        logger.info(f"loaded {checkpoint} at iteration {state.iteration}")
        return state

    def step(self) -> None:
        """One optimizer step over the next global batch, counted, reported and kept in the history."""
        settings, state, built, parts = self.settings, self.state, self.built, self.loop_parts
        self.guards.at(state.iteration + 1, "training step")
        began = time.perf_counter()
        parts.profiler.step_begins(state.iteration)
        batches = [next(parts.train_iter) for _ in range(parts.batch_sizes.get())]
        record = train_step(settings, built.chunks, built.optimizer, built.scheduler, batches, state,
                            self.forward_step, self.tokenizer.pad_id)
        self.guards.end_if_thawed()  # frozen in the step, its peers' data may still complete it: nothing written
        parts.batch_sizes.update(state.consumed_samples, consistency_check=True)
        if parts.batch_sizes.get_current_global_batch_size() != record["global_batch_size"]:  # megatron-core's line
            logger.info(f"ramping up batch size from {record['global_batch_size']} to "
                        f"{parts.batch_sizes.get_current_global_batch_size()}")
        state.floating_point_operations += step_flops(built.shape.arch, record["tokens"], record["predicted"],
                                                      record["attended"], built.shape.padded_vocab_size)
        parts.profiler.step_ends(state.iteration)  # the window holds the steps alone, not evaluations or saves
        took = time.perf_counter() - began
        self.account.add("skipped" if record["skipped"] else "redone" if parts.restarts.redoes(state.iteration)
                         else "productive", took)
        if not self.first_step_reported:
            self.first_step_reported = True
            logger.info(self.account.startup_line(took))
        parts.restarts.step_done(state.iteration)
        self.history["train"].append(record)
        report = (state.iteration % settings.logging.log_interval == 0
                  or state.iteration == settings.training.train_iters)
        elapsed = time.perf_counter() - self.window_start if report else None
        parts.log.step(record, elapsed, state.skipped_iters, self.account)
        if report and parts.straggler:
            began, flops = self.window_began_at
            self.drained = parts.straggler.interval_end(began + 1, state.iteration, elapsed,
                                                        state.floating_point_operations - flops)
            if self.drained:  # the run stops at this iteration: its checkpoint's account names the host
                self.account.drained_hosts.append(self.drained)
        if report:
            self.window_start = time.perf_counter()
            self.window_began_at = (state.iteration, state.floating_point_operations)

    def end_for_straggler(self) -> None:
        """The straggler's host's part of the job ends (its checkpoint saved): its ranks with an error naming it. Under
        torchrun they end their torchrun first, which would restart them into the next round, and once it is gone (a
        barrier after it) the other ranks end the attempt too: their torchrun goes on without the host under
        --nnodes MIN:MAX (a fixed --nnodes ends the job, its next round waiting join_timeout for the host). Without
        torchrun the other ranks stop, naming it."""
        exit_after = self.settings.faults.straggler_exit_intervals
        here = self.drained == self.loop_parts.straggler.host
        launcher = self.guards.launcher
        if launcher.pid is not None:
            if here:  # before any rank of the host ends their torchrun, none takes that for torchrun's death
                launcher.close()
            torch.distributed.barrier()
            if here:
                launcher.end_torchrun()
            torch.distributed.barrier()  # no torchrun of the drained host is left to rejoin when the others end
        if here:
            raise HostError(f"this host ({self.drained}) is the straggler, slow for {exit_after} judged windows in a "
                            f"row (--straggler-exit-intervals): its part of the job ends at iteration "
                            f"{self.state.iteration}; drain host {self.drained}")
        line = f"host {self.drained} ended its part of the job as the straggler at iteration {self.state.iteration}"
        if launcher.pid is not None:
            raise TrainingError(f"{line}: drain it; ending this attempt, from whose checkpoint torchrun goes on "
                                f"without the host under --nnodes MIN:MAX (a fixed --nnodes ends the job)")
        logger.info(f"{line}: drain it; an elastic job (--nnodes MIN:MAX) goes on without it from the checkpoint, a "
                    f"fixed-size one ends here")

    def validate(self) -> None:
        built, parts = self.built, self.loop_parts
        self.guards.at(self.state.iteration, "evaluation")
        if parts.straggler:
            parts.straggler.pause()
        with self.timed("evaluation"):
            stats = evaluate(built.chunks, parts.valid_iter, built.num_micro, self.settings.evaluation.eval_iters,
                             self.forward_step)
        result = dict(loss=stats.loss, accuracy=stats.accuracy, iteration=self.state.iteration,
                      consumed_samples=self.state.consumed_samples)
        self.history["eval"].append(result)
        parts.log.evaluation(result)

    def save(self) -> None:
        """A checkpoint of this iteration (in the background with --async-save), once the parameters are finite
        and the data files unchanged; its blocking time in the account, then the save interval chosen again."""
        with self.timed("save"):
            self.write_checkpoint()
        if self.loop_parts.straggler:  # the interval under way holds the save (and, --async-save, its writing)
            self.loop_parts.straggler.pause()
        self.last_saved_iteration = self.state.iteration
        self.loop_parts.save_interval.measured(self.account_snapshot(saving=False))

    def account_snapshot(self, saving: bool) -> dict:
        """Rank 0's account (megatron-core checks that the checkpoint's common state is the same on every rank)."""
        snapshot = [self.account.snapshot(time.time(), saving)]
        torch.distributed.broadcast_object_list(snapshot, src=0)
        return snapshot[0]

    def write_checkpoint(self) -> None:
        settings, options, state = self.settings, self.settings.checkpoint, self.state
        built, parts = self.built, self.loop_parts
        training, evaluation, shape, chunks = settings.training, settings.evaluation, built.shape, built.chunks
        self.guards.at(state.iteration, "checkpoint save")
        self.finish_async_save(blocking=True)  # one save in flight at a time
        finish_param_sync(chunks)
        if not params_are_finite(chunks):
            raise TrainingError(f"iteration {state.iteration}: the model's parameters are not finite: not saving "
                                f"them; the checkpoint to resume from stays {state.last_checkpoint or 'none'}")
        self.data_files.check_unchanged(state.iteration)
        saved_args = megatron_lm_args(
            shape.arch, shape.padded_vocab_size, **{**settings.as_dict(), "model_preset": shape.preset},
            hf_intermediate_size=shape.hf_intermediate_size, tokenizer_vocab_size=self.tokenizer.vocab_size,
            data_parallel_size=parallel_state.get_data_parallel_world_size(),
            world_size=torch.distributed.get_world_size(),
            virtual_pipeline_model_parallel_size=len(chunks) if len(chunks) > 1 else None,
            consumed_train_samples=state.consumed_samples, skipped_train_samples=0,
            consumed_valid_samples=(parts.evals_done + len(self.history["eval"])) * evaluation.eval_iters
            * training.global_batch_size)
        save_checkpoint(
            options.save, state.iteration, chunks, built.optimizer, built.scheduler,
            dict(consumed_samples=state.consumed_samples, data_stream=data_stream(settings),
                 data_files=self.data_files.files, skipped_iters=state.skipped_iters,
                 skipped_in_a_row=state.skipped_in_a_row, goodput=self.account_snapshot(saving=not parts.async_saves)),
            saved_args, options.keep_last_n_checkpoints, save_optimizer=not options.no_save_optim,
            save_rng=not options.no_save_rng, floating_point_operations=state.floating_point_operations,
            async_saves=parts.async_saves)
        resume_param_sync(chunks)
        if parts.async_saves:
            self.async_save_began = time.time()
            logger.info(f"writing the checkpoint of iteration {state.iteration} to {options.save} in the background "
                        f"(--async-save)")
        else:
            self.saved(state.iteration)
        if state.skipped_in_a_row:
            logger.info(f"the last {state.skipped_in_a_row} step(s) were skipped (non-finite): the checkpoint "
                        f"holds the weights of iteration {state.iteration - state.skipped_in_a_row}, the last "
                        f"finite step")

    def saved(self, iteration: int) -> None:
        self.state.last_checkpoint = iteration_dir(self.settings.checkpoint.save, iteration)
        logger.info(f"saved checkpoint at iteration {iteration} to {self.settings.checkpoint.save}")

    def finish_async_save(self, blocking: bool) -> None:
        async_saves = self.loop_parts.async_saves
        done = async_saves.finish(blocking) if async_saves else None
        if done is not None:
            self.account.async_save_background += time.time() - self.async_save_began
            self.saved(done)

    def finish(self) -> dict:
        history, parts = self.history, self.loop_parts
        history.update(train=list(history["train"]), iteration=self.state.iteration, skipped=self.state.skipped_iters,
                       goodput=self.account.snapshot(time.time(), saving=False),
                       save_interval=parts.save_interval.every, startup=list(self.account.startup_parts))
        return history
