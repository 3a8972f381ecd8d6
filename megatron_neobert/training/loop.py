"""The pre-training loop: set-up, steps, evaluations, checkpoints and pre-emption.

Data flow of a step: the loader yields this data-parallel rank's micro-batches of the global batch;
megatron-core's schedule (no pipelining, 1F1B or interleaved 1F1B) runs forward/backward over them
on every model chunk; DDP reduces the gradients (calculate_per_token_loss: divided once by the
global number of masked tokens); the optimizer steps unless the loss or a gradient is not finite.

`train(settings)` runs on every rank of an initialised (or torchrun) process group and returns the
history of the run.
"""

import collections
import contextlib
import dataclasses
import datetime
import logging
import math
import os
import time
from typing import List, Optional

import torch
from megatron.core import parallel_state
from megatron.core.optimizer_param_scheduler import get_canonical_lr_for_logging

from megatron_neobert.data.tokenizer import NULL_TOKENIZER, build_tokenizer
from megatron_neobert.kernels import format_report, kernel_report
from megatron_neobert.megatron_core_compat import (drop_the_sync_save_deprecation, keep_write_results_with_the_rank,
                                                     micro_batch_calculator)
from megatron_neobert.parallel.launch import DistributedState, init_distributed
from megatron_neobert.training.checkpoint.layout import iteration_dir
from megatron_neobert.training.checkpoint.lock import claim_save_dir
from megatron_neobert.training.checkpoint.state import (AsyncSaves, holds_training_state, load_checkpoint,
                                                        megatron_lm_args, read_checkpoint, save_checkpoint)
from megatron_neobert.training.data_files import DataFiles
from megatron_neobert.training.data_setup import build_data
from megatron_neobert.training.errors import TrainingError
from megatron_neobert.training.evaluate import evaluate
from megatron_neobert.training.resolve import recipe_defaults_applied
from megatron_neobert.training.batch_size import check_batch_sizes
from megatron_neobert.training.schedule import checkpoint_schedule_note, describe_rampup, describe_schedule
from megatron_neobert.training.metrics import step_flops
from megatron_neobert.model import ModelShape
from megatron_neobert.training.model_setup import (finish_param_sync, resume_param_sync, run_model_shape,
                                                   setup_model_and_optimizer)
from megatron_neobert.training.profiling import StepProfiler
from megatron_neobert.training.process_guards import (ExitSignalHandler, ProgressWatchdog, bus_errors_named,
                                                      exit_with_launcher, forked_children_die_with_rank,
                                                      ignore_exit_signals, stop_requested)
from megatron_neobert.training.restarts import RestartReport, world_size_change
from megatron_neobert.training.run_checks import (check_inputs, check_model_shape, check_optimizer_setup,
                                                  check_positions, check_tensor_parallel_shapes,
                                                  check_tokenizer_matches_checkpoint, check_vocabulary,
                                                  check_vocabulary_rows, data_prefixes)
from megatron_neobert.training.settings import RECIPE_DIFFERENCES, Settings
from megatron_neobert.training.step import (ForwardStep, StepStats, grads_are_finite, mlm_forward_step,
                                            params_are_finite, params_norm, run_micro_batches)
from megatron_neobert.training.train_log import TrainingLog

# Settings that define the order of the samples; a checkpoint's data position applies only to the
# same order (a longer --train-iters or another masking keeps it: the epochs' order is the same).
DATA_STREAM_KEYS = ("data_path", "data_args_path", "per_split_data_args_path", "train_data_path", "mock_data",
                    "split", "seq_length", "packed", "seed", "tokenizer_type", "tokenizer_model")

# The steps whose records `train` returns: the last ones, so that a long run's memory stays flat (a record takes
# about 750 bytes: the 1M steps of the recipe would take 0.7 GiB on every rank).
HISTORY_STEPS = 1000

logger = logging.getLogger(__name__)


class NonFiniteLossError(TrainingError):
    pass


@dataclasses.dataclass
class TrainState:
    """Where the run is; what a checkpoint's "train_state" restores."""

    iteration: int = 0
    consumed_samples: int = 0  # training samples read, over all data-parallel ranks
    skipped_iters: int = 0  # steps skipped for a non-finite loss or gradient, in total
    skipped_in_a_row: int = 0
    last_checkpoint: Optional[str] = None  # the iteration folder last saved or loaded
    floating_point_operations: float = 0.0  # training FLOPs so far, all ranks (Megatron-LM's count)


def data_stream(settings: Settings) -> dict:
    values = settings.as_dict()
    return {k: values[k] for k in DATA_STREAM_KEYS}


def num_micro_batches(settings: Settings) -> int:
    """Micro-batches per data-parallel rank of a whole --global-batch-size (a validation's; a training step's are
    fewer while --rampup-batch-size grows the batch), once every global batch size of the run is checked."""
    dp = parallel_state.get_data_parallel_world_size()
    check_batch_sizes(settings.training, dp)
    return settings.training.global_batch_size // (settings.training.micro_batch_size * dp)


def describe_layout(settings: Settings, shape: ModelShape, num_chunks: int, num_micro: int) -> str:
    parallel = settings.parallel
    tp, pp = parallel.tensor_model_parallel_size, parallel.pipeline_model_parallel_size
    dp = parallel_state.get_data_parallel_world_size()
    arch = shape.arch
    on_off = lambda flag: "on" if flag else "off"
    return (f"layout: {torch.distributed.get_world_size()} ranks = TP {tp} x PP {pp} x DP {dp}"
            f" (virtual stages per rank {num_chunks}, sequence parallel {on_off(parallel.sequence_parallel)}, "
            f"distributed optimizer {on_off(parallel.use_distributed_optimizer)}); global batch "
            f"{settings.training.global_batch_size} = micro-batch {settings.training.micro_batch_size} x "
            f"{num_micro} accumulation x DP {dp}; model {shape.preset or 'of the checkpoint'} {arch.num_layers} x "
            f"{arch.hidden_size}, vocab {arch.vocab_size} (padded {shape.padded_vocab_size})")


def resume(settings: Settings, checkpoint: str, common: dict, chunks, optimizer, scheduler,
           finetune: bool, data_files: DataFiles) -> TrainState:
    """Load the checkpoint; the state the run goes on from (iteration 0 for a fine-tune start)."""
    options = settings.checkpoint
    if not (finetune or options.no_load_optim):
        check_optimizer_setup(settings, checkpoint, common)
    flags_schedule = scheduler.state_dict()
    keeps_position = not finetune and common["train_state"]["data_stream"] == data_stream(settings)
    if not finetune:  # before the load: data that changed is refused at once
        data_files.check_resume(common["train_state"].get("data_files"), checkpoint, keeps_position,
                                options.allow_data_change)
    load_checkpoint(checkpoint, common, chunks, optimizer, scheduler, load_optimizer=not options.no_load_optim,
                    load_rng=not options.no_load_rng, finetune=finetune, strict=options.dist_ckpt_strictness)
    note = None if finetune else checkpoint_schedule_note(flags_schedule, scheduler.state_dict())
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
    logger.info(f"loaded {checkpoint} at iteration {state.iteration}")
    return state


def describe_folder(folder: Optional[str]) -> str:
    """What a --load folder holds, in words, for the line that says the run starts from scratch."""
    if not folder or not os.path.isdir(folder):
        return "the folder does not exist"
    return "empty" if not os.listdir(folder) else "no checkpoint marker in it"


def stop_reason(settings: Settings, state: TrainState, handler: Optional[ExitSignalHandler],
                started: float) -> Optional[str]:
    faults = settings.faults
    requested = stop_requested(handler, started, faults.exit_duration_in_mins)
    if requested:
        return requested
    if faults.exit_interval and state.iteration % faults.exit_interval == 0:
        return "exit-interval"
    return None


def should_save(settings: Settings, state: TrainState, stop: Optional[str]) -> bool:
    """Save at the interval, at the end and when stopping early. At the interval a skipped step is
    not saved (its weights are those of the last good step, already saved or about to be); at the
    end it is: a skipped step changes no weight, optimizer or schedule state, so its checkpoint holds
    the last finite state at the position the uninterrupted run would be at."""
    save, save_interval = settings.checkpoint.save, settings.checkpoint.save_interval
    if not save:
        return False
    if stop or state.iteration == settings.training.train_iters:
        return True
    return bool(save_interval and state.iteration % save_interval == 0 and not state.skipped_in_a_row)


def startup_notes(settings: Settings, shape: ModelShape) -> List[str]:
    """What the run took from the recipe rather than from the user, and how the model differs from
    its preset: printed at start-up, so that neither happens silently."""
    notes = [f"NeoBERT where Megatron-LM's BERT differs: {'; '.join(RECIPE_DIFFERENCES)}"]
    applied = recipe_defaults_applied(settings)
    if applied:
        notes.append("NeoBERT recipe defaults applied (not set on the command line or in --config): "
                     + "; ".join(applied))
    notes.append(describe_schedule(settings.training))
    if settings.training.rampup_batch_size is not None:
        notes.append(describe_rampup(settings.training))
    if settings.data.tokenizer_type == NULL_TOKENIZER:
        notes.append(build_tokenizer(NULL_TOKENIZER, settings.data.tokenizer_model).describe())
    if settings.data.mock_data and "split" in settings.explicit:
        notes.append(f"--split {settings.data.split} does not apply to --mock-data: megatron-core splits mock data "
                     f"1,1,1")
    if settings.from_checkpoint:
        values = settings.as_dict()
        notes.append("from the args of the checkpoint the run starts from: " + ", ".join(
            f"--{name.replace('_', '-')} {values[name]}" for name in sorted(settings.from_checkpoint)
            if values[name] is not None))
    if settings.checkpoint.use_checkpoint_args:
        notes.append(f"model shape from the checkpoint's args (--use-checkpoint-args): {shape.arch}")
    if shape.changes:
        notes.append(f"{shape.base} overridden: {', '.join(shape.changes)} (the model is not the "
                     f"{'checkpoint' if settings.checkpoint.use_checkpoint_args else 'preset'}'s)")
    if "sequence_parallel" in settings.explicit and settings.parallel.tensor_model_parallel_size == 1:
        notes.append("warning: disabling sequence parallelism because tensor model parallelism is disabled "
                     "(--tensor-model-parallel-size 1)")
    notes.append(precision_note(settings, torch.cuda.is_available()))
    return notes


def precision_note(settings: Settings, on_gpu: bool) -> str:
    """What precision the step runs in, on this device. On a CPU, --bf16 is not ignored: megatron-core's
    Float16Module holds bf16 weights and the linear layers, attention and norms compute in bf16 there too."""
    precision = settings.precision
    if not (precision.bf16 or precision.fp16):
        why = "--no-bf16" if "bf16" in settings.explicit else "the default without a GPU; --bf16 runs bf16 here too"
        return f"precision: fp32 weights, activations, gradients and optimizer state ({why})"
    half = "bf16" if precision.bf16 else "fp16"
    where = "" if on_gpu else ", on the CPU as on a GPU"
    scaling = ("" if precision.bf16 else f"; loss scale {precision.loss_scale:g}" if precision.loss_scale
               else f"; dynamic loss scale from {precision.initial_loss_scale:g}")
    fp8 = (f"FP8 ({precision.fp8_format}, {precision.fp8_recipe} recipe) matrix multiplications in Transformer "
           f"Engine's layers, else " if precision.fp8_format else "")
    return (f"precision: {fp8}{half} weights and activations (linear layers, attention and norms compute in {half}"
            f"{where}); fp32 main weights, gradient reduction and optimizer state (--{half}{scaling})")


def fp16_step(optimizer, state: TrainState) -> tuple:
    """(stepped, grad norm, zeros in the gradient) with --fp16: megatron-core's loss scaler finds overflows,
    skips the step and lowers the scale; such skips are routine (the scale starts high) and do not stop the run."""
    ok, grad_norm, num_zeros = optimizer.step()
    if not ok:
        state.skipped_iters += 1
    return ok, grad_norm, num_zeros


def train_step(settings: Settings, chunks, optimizer, scheduler, batches: List[dict], state: TrainState,
               forward_step: ForwardStep, pad_id: int) -> dict:
    """One optimizer step over a global batch; updates `state` and returns the step's record:
    iteration, loss, accuracy, lr (used by that step), logged_lr (the next step's, as Megatron-LM logs
    it), grad_norm, skipped, predicted, tokens, global_batch_size, loss_scale (None without --fp16), num_zeros
    (with --log-num-zeros-in-grad), params_norm (with --log-params-norm)."""
    for c in chunks:
        c.zero_grad_buffer()
    optimizer.zero_grad()
    lr = optimizer.param_groups[0]["lr"]
    stats = run_micro_batches(chunks, batches, forward_only=False, forward_step=forward_step, pad_id=pad_id)
    state.iteration += 1
    fp16 = settings.precision.fp16
    # As Megatron-LM: the step's samples are its micro-batches x micro-batch size x DP (fewer during a batch ramp).
    global_batch = len(batches) * settings.training.micro_batch_size * parallel_state.get_data_parallel_world_size()
    state.consumed_samples += global_batch
    loss_scale = float(optimizer.get_loss_scale()) if fp16 else None
    stepped, num_zeros = False, None
    if math.isfinite(stats.loss) and fp16:
        stepped, grad_norm, num_zeros = fp16_step(optimizer, state)
        state.skipped_in_a_row = 0
    elif math.isfinite(stats.loss) and grads_are_finite(chunks):
        stepped, grad_norm, num_zeros = optimizer.step()
        if not stepped:
            raise TrainingError(f"iteration {state.iteration}: megatron-core's optimizer skipped the step for a "
                                f"non-finite gradient that the finite check before it did not see")
        state.skipped_in_a_row = 0
    else:
        grad_norm = float("nan")
        state.skipped_in_a_row += 1
        state.skipped_iters += 1
        logger.info(f"iteration {state.iteration}: non-finite loss or gradient, step skipped "
                    f"({state.skipped_in_a_row} in a row, {state.skipped_iters} in total)")
        if state.skipped_in_a_row > settings.faults.max_skipped_iters:
            raise NonFiniteLossError(
                f"{state.skipped_in_a_row} consecutive steps with a non-finite loss or gradient (more than "
                f"--max-skipped-iters {settings.faults.max_skipped_iters}); stopping at iteration "
                f"{state.iteration} without saving. Last good checkpoint: {state.last_checkpoint or 'none'}")
    if stepped:  # the scheduler counts samples, as Megatron-LM's
        scheduler.step(increment=global_batch)
    # Megatron-LM logs the lr after the scheduler's step (the next step's), that of the default param group.
    logged_lr = get_canonical_lr_for_logging(optimizer.param_groups)
    return dict(iteration=state.iteration, loss=stats.loss, accuracy=stats.accuracy, lr=lr,
                logged_lr=optimizer.param_groups[0]["lr"] if logged_lr is None else logged_lr,
                grad_norm=float(grad_norm) if grad_norm is not None else None,
                skipped=not stepped, predicted=stats.predicted, tokens=stats.real_tokens,
                attended=stats.attended_pairs, consumed_samples=state.consumed_samples, global_batch_size=global_batch,
                loss_scale=loss_scale,
                num_zeros=num_zeros, params_norm=params_norm(chunks) if settings.logging.log_params_norm else None)


def train(settings: Settings, forward_step: ForwardStep = mlm_forward_step) -> dict:
    """Train on every rank of the process group (on CPU inside `parallel.cpu.cpu_execution()`); returns {"train":
    [records of the last HISTORY_STEPS steps], "eval": [records], "iteration", "exit": "finished" | "signal" |
    "exit-duration" | "exit-interval" | "skip-train",
    "skipped"}.

    `forward_step`: megatron-core's `forward_step_func` (batch iterator, model) -> (output, loss
    function), for training and validation.
    """
    started = time.time()
    found = DistributedState()
    try:
        history = _guarded_train(settings, forward_step, started)
    except TrainingError:  # raised alike on every rank, whose groups are whole: they can be destroyed
        found.release()
        raise
    found.release()  # what the run created goes with it (each gloo group holds threads and sockets)
    return history


def _guarded_train(settings: Settings, forward_step: ForwardStep, started: float) -> dict:
    faults = settings.faults
    with contextlib.ExitStack() as guards:
        exit_with_launcher()  # before the rendezvous, which would wait for a dead torchrun's store
        # The handler first: a pre-emption signal during the set-up must not kill the rank either.
        handler = guards.enter_context(ExitSignalHandler(faults.exit_signal)) if faults.exit_signal_handler else None
        tokenizer = check_inputs(settings.data)  # before the process group: bad input ends the run at once
        init_distributed(faults.distributed_timeout_minutes)
        data_files = DataFiles(data_prefixes(settings.data))
        guards.enter_context(bus_errors_named(data_files.describe_changes))
        forked_children_die_with_rank()
        keep_write_results_with_the_rank(settings.checkpoint.async_save, ignore_exit_signals)
        drop_the_sync_save_deprecation()
        watchdog = guards.enter_context(ProgressWatchdog(faults.distributed_timeout_minutes))
        load_folder = describe_folder(settings.checkpoint.load)  # before the lock: it may make the folder
        lock = claim_save_dir(settings.checkpoint)
        if lock:
            guards.callback(lock.release)
        return _train(settings, tokenizer, data_files, forward_step, handler, watchdog, started, load_folder)


def _train(settings: Settings, tokenizer, data_files: DataFiles, forward_step: ForwardStep,
           handler: Optional[ExitSignalHandler], watchdog: ProgressWatchdog, started: float, load_folder: str) -> dict:
    options = settings.checkpoint
    verify = not options.no_verify_checkpoint
    checkpoint, common = (read_checkpoint(options.load, options.ckpt_step, verify)
                          if options.load else (None, None))
    pretrained = checkpoint is None and options.pretrained_checkpoint is not None
    if pretrained:  # as Megatron-LM: a run that has not saved yet starts from these weights
        checkpoint, common = read_checkpoint(options.pretrained_checkpoint, None, verify)
        if checkpoint is None:
            raise TrainingError(f"--pretrained-checkpoint {options.pretrained_checkpoint} holds no checkpoint")
        logger.info(f"no checkpoint in --load {options.load}: starting from --pretrained-checkpoint {checkpoint}")
    shape = run_model_shape(settings, tokenizer.vocab_size, common)  # the one place the shape is decided
    arch, padded_vocab = shape.arch, shape.padded_vocab_size
    check_vocabulary(tokenizer, arch)
    check_positions(settings, arch)
    check_tensor_parallel_shapes(settings, arch)
    check_vocabulary_rows(settings, shape, checkpoint)
    if checkpoint:
        check_tokenizer_matches_checkpoint(tokenizer, checkpoint, common)
        check_model_shape(settings, arch, checkpoint, common)
    finetune = options.finetune or pretrained
    if checkpoint and not finetune and not holds_training_state(common):
        logger.info(f"{checkpoint} holds model weights only: starting from iteration 0 as with --finetune")
        finetune = True
    _, chunks, optimizer, scheduler = setup_model_and_optimizer(settings, arch, padded_vocab)
    num_micro = num_micro_batches(settings)
    logger.info(format_report(kernel_report(settings.model.transformer_impl, settings.data.data_loader)))
    logger.info(describe_layout(settings, shape, len(chunks), num_micro))
    for note in startup_notes(settings, shape):
        logger.info(note)

    training, evaluation = settings.training, settings.evaluation
    state = TrainState()
    if checkpoint:
        state = resume(settings, checkpoint, common, chunks, optimizer, scheduler, finetune, data_files)
        change = None if finetune else world_size_change(common, num_micro)
        if change:
            logger.info(change)
    elif options.load:
        logger.info(f"no checkpoint in {options.load} ({load_folder}): starting from scratch")
    restarts = RestartReport(state.iteration, datetime.timedelta(minutes=settings.faults.distributed_timeout_minutes))
    evals_done = state.iteration // evaluation.eval_interval if evaluation.eval_interval else 0
    _, train_iter, valid_iter = build_data(
        settings, state.consumed_samples, evals_done * evaluation.eval_iters * training.global_batch_size, tokenizer)
    batch_sizes = micro_batch_calculator(training.global_batch_size, training.rampup_batch_size,
                                     training.micro_batch_size, parallel_state.get_data_parallel_world_size())
    batch_sizes.update(state.consumed_samples, consistency_check=True)
    if evaluation.skip_train and valid_iter is None:
        raise TrainingError("--skip-train runs one validation of --eval-iters batches, and there is none to run: "
                            "give a validation split (--split or --valid-data-path) and --eval-iters and "
                            "--eval-interval above 0")

    async_saves = AsyncSaves() if options.async_save else None

    def saved(iteration: int):
        state.last_checkpoint = iteration_dir(options.save, iteration)
        logger.info(f"saved checkpoint at iteration {iteration} to {options.save}")

    def finish_async_save(blocking: bool):
        done = async_saves.finish(blocking) if async_saves else None
        if done is not None:
            saved(done)

    def save():
        watchdog.at(state.iteration, "checkpoint save")
        finish_async_save(blocking=True)  # one save in flight at a time
        finish_param_sync(chunks)
        if not params_are_finite(chunks):
            raise TrainingError(f"iteration {state.iteration}: the model's parameters are not finite: not saving "
                                f"them; the checkpoint to resume from stays {state.last_checkpoint or 'none'}")
        data_files.check_unchanged(state.iteration)
        saved_args = megatron_lm_args(
            arch, padded_vocab, **{**settings.as_dict(), "model_preset": shape.preset},
            hf_intermediate_size=shape.hf_intermediate_size, data_parallel_size=parallel_state.get_data_parallel_world_size(),
            world_size=torch.distributed.get_world_size(),
            virtual_pipeline_model_parallel_size=len(chunks) if len(chunks) > 1 else None,
            consumed_train_samples=state.consumed_samples, skipped_train_samples=0,
            consumed_valid_samples=(evals_done + len(history["eval"])) * evaluation.eval_iters
            * training.global_batch_size)
        save_checkpoint(
            options.save, state.iteration, chunks, optimizer, scheduler,
            dict(consumed_samples=state.consumed_samples, data_stream=data_stream(settings),
                 data_files=data_files.files, skipped_iters=state.skipped_iters,
                 skipped_in_a_row=state.skipped_in_a_row),
            saved_args, options.keep_last_n_checkpoints, save_optimizer=not options.no_save_optim,
            save_rng=not options.no_save_rng, floating_point_operations=state.floating_point_operations,
            async_saves=async_saves)
        resume_param_sync(chunks)
        if async_saves:
            logger.info(f"writing the checkpoint of iteration {state.iteration} to {options.save} in the background "
                        f"(--async-save)")
        else:
            saved(state.iteration)
        if state.skipped_in_a_row:
            logger.info(f"the last {state.skipped_in_a_row} step(s) were skipped (non-finite): the checkpoint "
                        f"holds the weights of iteration {state.iteration - state.skipped_in_a_row}, the last "
                        f"finite step")

    history = {"train": collections.deque(maxlen=HISTORY_STEPS), "eval": [],
               "exit": "skip-train" if evaluation.skip_train else "finished"}
    log = TrainingLog(settings, arch, padded_vocab)
    profiler = StepProfiler(settings)

    def validate():
        watchdog.at(state.iteration, "evaluation")
        stats: StepStats = evaluate(chunks, valid_iter, num_micro, evaluation.eval_iters, forward_step)
        result = dict(loss=stats.loss, accuracy=stats.accuracy, iteration=state.iteration,
                      consumed_samples=state.consumed_samples)
        history["eval"].append(result)
        log.evaluation(result)

    window_start = time.perf_counter()
    try:
        if evaluation.skip_train:
            validate()
        while not evaluation.skip_train and state.iteration < training.train_iters:
            watchdog.at(state.iteration + 1, "training step")
            profiler.step_begins(state.iteration)
            batches = [next(train_iter) for _ in range(batch_sizes.get())]
            record = train_step(settings, chunks, optimizer, scheduler, batches, state, forward_step, tokenizer.pad_id)
            batch_sizes.update(state.consumed_samples, consistency_check=True)
            if batch_sizes.get_current_global_batch_size() != record["global_batch_size"]:  # megatron-core's line
                logger.info(f"ramping up batch size from {record['global_batch_size']} to "
                            f"{batch_sizes.get_current_global_batch_size()}")
            state.floating_point_operations += step_flops(arch, record["tokens"], record["predicted"],
                                                          record["attended"], padded_vocab)
            profiler.step_ends(state.iteration)  # the window holds the steps alone, not evaluations or saves
            restarts.step_done(state.iteration)
            history["train"].append(record)
            report = state.iteration % settings.logging.log_interval == 0 or state.iteration == training.train_iters
            log.step(record, time.perf_counter() - window_start if report else None, state.skipped_iters)
            if report:
                window_start = time.perf_counter()
            if valid_iter is not None and evaluation.eval_interval and state.iteration % evaluation.eval_interval == 0:
                validate()
            watchdog.at(state.iteration, "agreeing whether to stop")
            stop = stop_reason(settings, state, handler, started)
            finish_async_save(blocking=False)
            if should_save(settings, state, stop):
                save()
            if stop:
                logger.info(f"stopping at iteration {state.iteration} ({stop})")
                history["exit"] = stop
                break
        profiler.stop()  # a run stopped inside the window still writes it
        finish_async_save(blocking=True)
    finally:
        log.close()
    history.update(train=list(history["train"]), iteration=state.iteration, skipped=state.skipped_iters)
    return history
