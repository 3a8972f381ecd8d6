"""The learning-rate and weight-decay schedule, with Megatron-LM's meanings: lengths in iterations or, with
--train-samples, in samples; resolved once from the settings (`resolve_schedule`), counted by megatron-core's
`OptimizerParamScheduler` (built by `engine.model_setup.build_scheduler`) in samples as Megatron-LM counts them. Its
decay styles are megatron-core's: cosine, linear, constant, inverse-square-root and WSD (warmup-stable-decay, with
its own final decay); the iterations of a growing batch (--rampup-batch-size) are counted in `batch_size.py`."""

import dataclasses
from typing import NamedTuple, Optional, Set

from megatron_neobert.training.config.batch_size import rampup_train_iters
from megatron_neobert.errors import InputError, refuse
from megatron_neobert.training.config.settings import (RECIPE_DECAY_FRACTION, RECIPE_MIN_LR_FRACTION,
                                                       RECIPE_WARMUP_ITERS, TrainingSettings)

# Styles whose decay ends where Megatron-LM's does, with the run: the recipe's 90% belongs to its cosine. After the
# decay steps megatron-core gives --min-lr: an inverse square root would drop to it, and a WSD run would idle there.
DECAY_TO_THE_END = ("WSD", "inverse-square-root")


def resolve_schedule(training: TrainingSettings, explicit: Set[str]) -> TrainingSettings:
    """`training` with the schedule's derived defaults filled in: --min-lr (the recipe's fraction of --lr),
    --lr-decay-iters (its fraction of --train-iters), and with --train-samples the sample-based lengths and the
    iterations they mean; lengths that contradict each other refused. `explicit`: the settings the user gave."""
    fraction = training.lr_warmup_fraction
    refuse(fraction is not None and not 0.0 <= fraction < 1.0, f"--lr-warmup-fraction {fraction} must be in [0, 1)")
    refuse(training.rampup_batch_size is not None and training.train_samples is None,
            "--rampup-batch-size needs --train-samples (as Megatron-LM: the iterations and the schedule of a "
            "growing batch are counted in samples)")
    if training.train_samples is None:
        refuse(training.lr_decay_samples is not None or training.lr_warmup_samples is not None,
                "--lr-decay-samples / --lr-warmup-samples go with --train-samples; with --train-iters use "
                "--lr-decay-iters / --lr-warmup-iters")
        refuse(fraction is not None and "lr_warmup_iters" in explicit,
                "give --lr-warmup-fraction or --lr-warmup-iters, not both")
        if fraction is not None:
            training = dataclasses.replace(training, lr_warmup_iters=0)
    else:
        training = _resolve_sample_schedule(training, explicit)
    decay_fraction = 1.0 if training.lr_decay_style in DECAY_TO_THE_END else RECIPE_DECAY_FRACTION
    min_lr = RECIPE_MIN_LR_FRACTION * training.lr if training.min_lr is None else training.min_lr
    decay = (max(1, int(decay_fraction * training.train_iters)) if training.lr_decay_iters is None  # a step at least
             else training.lr_decay_iters)
    training = dataclasses.replace(training, lr_decay_iters=decay,
                                   min_lr=training.lr if training.lr_decay_style == "constant" else min_lr)
    warmup = training.lr_warmup_iters
    refuse(decay < 1, f"--lr-decay-iters {decay} must be at least 1")
    if warmup >= decay:
        # The recipe's warm-up steps stop every short run here: say how to get past them.
        why_warmup = "" if "lr_warmup_iters" in explicit else " (the recipe's default)"
        why_decay = ("" if "lr_decay_iters" in explicit
                     else f" ({decay_fraction:.0%} of --train-iters {training.train_iters}, at least 1)")
        raise InputError(f"--lr-warmup-iters {warmup}{why_warmup} must be below --lr-decay-iters {decay}{why_decay}: "
                         f"for a short run pass --lr-warmup-iters 0 (or a few steps)")
    _check_wsd(training)
    return training


def _check_wsd(training: TrainingSettings) -> None:
    """WSD's final decay: its length in the schedule's unit, within the decay steps after the warmup (a longer one
    would start inside the warmup, and the learning rate would jump down where the warmup ends)."""
    by_samples = training.train_samples is not None
    flag, other = (("--lr-wsd-decay-samples", "--lr-wsd-decay-iters") if by_samples
                   else ("--lr-wsd-decay-iters", "--lr-wsd-decay-samples"))
    length, misplaced = (training.lr_wsd_decay_samples, training.lr_wsd_decay_iters) if by_samples else (
        training.lr_wsd_decay_iters, training.lr_wsd_decay_samples)
    if training.lr_decay_style != "WSD":
        given = [f for f, v in ((flag, length), (other, misplaced)) if v is not None]
        refuse(bool(given), f"{', '.join(given)}: only with --lr-decay-style WSD")
        return
    refuse(misplaced is not None, f"{other} goes with {'--train-iters' if by_samples else '--train-samples'}; "
            f"with {'--train-samples' if by_samples else '--train-iters'} use {flag}")
    refuse(length is None, f"--lr-decay-style WSD needs {flag}: the length of its final decay to --min-lr")
    warmup, decay, unit = ((training.lr_warmup_samples, training.lr_decay_samples, "samples") if by_samples
                           else (training.lr_warmup_iters, training.lr_decay_iters, "iters"))
    if training.lr_warmup_fraction is not None:
        warmup = training.lr_warmup_fraction * decay
    refuse(not 1 <= length <= decay - warmup, f"{flag} {length} must be at least 1 and at most the decay steps "
            f"after the warmup: --lr-decay-{unit} {decay} - warmup {warmup:g} = {decay - warmup:g}")


def _resolve_sample_schedule(training: TrainingSettings, explicit: Set[str]) -> TrainingSettings:
    gbs, samples, fraction = training.global_batch_size, training.train_samples, training.lr_warmup_fraction
    refuse("train_iters" in explicit, "give --train-iters or --train-samples, not both")
    refuse(bool({"lr_decay_iters", "lr_warmup_iters"} & explicit),
            "with --train-samples the schedule is in samples: use --lr-decay-samples / --lr-warmup-samples")
    refuse(samples < gbs, f"--train-samples {samples} is less than one global batch ({gbs})")
    refuse(fraction is not None and training.lr_warmup_samples is not None,
            "give --lr-warmup-fraction or --lr-warmup-samples, not both")
    iterations = samples // gbs if training.rampup_batch_size is None else rampup_train_iters(training)
    decay_fraction = 1.0 if training.lr_decay_style in DECAY_TO_THE_END else RECIPE_DECAY_FRACTION
    decay = int(decay_fraction * samples) if training.lr_decay_samples is None else training.lr_decay_samples
    warmup = training.lr_warmup_samples
    if warmup is None:
        warmup = 0 if fraction is not None else RECIPE_WARMUP_ITERS * gbs
    refuse(fraction is None and warmup >= decay,
            f"--lr-warmup-samples {warmup} must be below --lr-decay-samples {decay} (recipe defaults: "
            f"{RECIPE_WARMUP_ITERS} x --global-batch-size, {decay_fraction:.0%} of --train-samples): for a "
            f"short run pass --lr-warmup-samples 0 (or a few batches)")
    # The iteration fields mirror the sample schedule (read by the log and the checks).
    return dataclasses.replace(training, train_iters=iterations, lr_decay_samples=decay, lr_warmup_samples=warmup,
                               lr_decay_iters=decay // gbs, lr_warmup_iters=0)


def _number(x: float) -> str:
    """A count as the flags give it: whole numbers in full (48828125, not 4.88281e+07)."""
    return str(int(x)) if x == int(x) else f"{x:.6g}"


def describe_rampup(training) -> str:
    """The batch-size ramp in words, for the start-up log."""
    start, increment, ramp = training.rampup_batch_size
    every = ramp / ((training.global_batch_size - start) // increment)  # megatron-core's samples per increment
    return (f"global batch size: {start}, growing by {increment} every {_number(every)} samples, "
            f"{training.global_batch_size} after sample {ramp} (--rampup-batch-size); {training.train_iters} "
            f"iterations in --train-samples {training.train_samples}")


class ScheduleSteps(NamedTuple):
    warmup: float
    decay: int
    wsd_decay: Optional[int]  # WSD's final decay (None for the other styles)
    weight_decay_span: int


def schedule_steps(training) -> ScheduleSteps:
    """The scheduler's lengths for `training` (the TrainingSettings), in samples as Megatron-LM counts them
    (iterations x --global-batch-size with --train-iters); --lr-warmup-fraction is a fraction of the decay."""
    gbs = training.global_batch_size
    if training.train_samples is not None:
        decay, warmup, wsd, span = (training.lr_decay_samples, training.lr_warmup_samples,
                                    training.lr_wsd_decay_samples, training.train_samples)
    else:
        decay, warmup, span = (training.lr_decay_iters * gbs, training.lr_warmup_iters * gbs,
                               training.train_iters * gbs)
        wsd = None if training.lr_wsd_decay_iters is None else training.lr_wsd_decay_iters * gbs
    if training.lr_warmup_fraction is not None:
        warmup = training.lr_warmup_fraction * decay
    return ScheduleSteps(warmup, decay, wsd, span)


def describe_schedule(training) -> str:
    """The learning-rate schedule in words, in the unit of its flags (iterations, or samples with --train-samples),
    for the start-up log."""
    warmup, decay, wsd, _ = schedule_steps(training)
    gbs = training.global_batch_size
    by_samples = training.train_samples is not None

    def count(steps) -> str:
        return _number(steps if by_samples else steps / gbs)

    def at(steps) -> str:
        return f"{'sample' if by_samples else 'iteration'} {count(steps)}"

    lr, floor = f"{training.lr:g}", f"{training.min_lr:g}"
    words = [f"linear warmup from {training.lr_warmup_init:g} to {lr} until {at(warmup)}"] if warmup else []
    style = training.lr_decay_style
    if style == "constant":
        return "learning rate: " + ", then ".join(words + [f"{lr} (constant)"])
    if style == "inverse-square-root":
        unit = "sample" if by_samples else "iteration"  # megatron-core counts a warmup of 0 as 1 sample
        words.append(f"{lr} x sqrt({count(max(warmup, 1))} / {unit}), not below {floor}, until {at(decay)}")
    elif style == "WSD":
        words.append(f"{lr} until {at(decay - wsd)}, {training.lr_wsd_decay_style} decay to {floor} by {at(decay)}")
    else:
        words.append(f"{style} decay to {floor} by {at(decay)}")
    return "learning rate: " + ", then ".join(words + [floor])


# megatron-core's scheduler state that the checkpoint's wins over the flags' on a resume, by what sets it.
CHECKPOINT_SCHEDULE = {"max_lr": "--lr", "min_lr": "--min-lr", "lr_warmup_steps": "warmup (samples)",
                       "lr_decay_steps": "decay (samples)", "lr_decay_style": "--lr-decay-style"}


def checkpoint_schedule_note(flags: dict, loaded: dict) -> Optional[str]:
    """The line a resumed run prints where the checkpoint's schedule (`loaded`, the scheduler's state after the
    load) is not the flags' (`flags`, its state before): which applies, and how to take the flags' (a longer
    --train-iters moves no decay without it)."""
    differ = [f"{what} {loaded[key]:g} there, {flags[key]:g} here" if key != "lr_decay_style"
              else f"{what} {loaded[key]} there, {flags[key]} here"
              for key, what in CHECKPOINT_SCHEDULE.items() if loaded[key] != flags[key]]
    if not differ:
        return None
    return (f"the checkpoint's learning-rate schedule applies, not the flags' ({'; '.join(differ)}): "
            f"--override-opt-param-scheduler takes the flags', from the checkpoint's position")
