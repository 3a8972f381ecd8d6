"""The learning-rate and weight-decay schedule, with Megatron-LM's meanings: lengths in iterations or, with
--train-samples, in samples; resolved once from the settings (`resolve_schedule`), counted by megatron-core's
`OptimizerParamScheduler` in samples as Megatron-LM counts them."""

from typing import NamedTuple, Set

from megatron_neobert.training.errors import InputError

RECIPE_WARMUP_ITERS = 2000
RECIPE_DECAY_FRACTION = 0.9


def _refuse(condition: bool, message: str) -> None:
    if condition:
        raise InputError(message)


def resolve_schedule(values: dict, explicit: Set[str]) -> None:
    """Fill in the schedule's derived defaults in `values` (the settings by name): --min-lr (10% of --lr),
    --lr-decay-iters (90% of --train-iters), and with --train-samples the sample-based lengths and the iterations
    they mean; refuse lengths that contradict each other."""
    fraction = values["lr_warmup_fraction"]
    _refuse(fraction is not None and not 0.0 <= fraction < 1.0, f"--lr-warmup-fraction {fraction} must be in [0, 1)")
    if values["train_samples"] is None:
        _refuse(values["lr_decay_samples"] is not None or values["lr_warmup_samples"] is not None,
                "--lr-decay-samples / --lr-warmup-samples go with --train-samples; with --train-iters use "
                "--lr-decay-iters / --lr-warmup-iters")
        _refuse(fraction is not None and "lr_warmup_iters" in explicit,
                "give --lr-warmup-fraction or --lr-warmup-iters, not both")
        if fraction is not None:
            values["lr_warmup_iters"] = 0
    else:
        _resolve_sample_schedule(values, explicit)
    if values["min_lr"] is None:
        values["min_lr"] = 0.1 * values["lr"]
    if values["lr_decay_iters"] is None:
        values["lr_decay_iters"] = max(1, int(RECIPE_DECAY_FRACTION * values["train_iters"]))  # the scheduler needs a step
    if values["lr_decay_style"] == "constant":
        values["min_lr"] = values["lr"]
    decay, warmup = values["lr_decay_iters"], values["lr_warmup_iters"]
    _refuse(decay < 1, f"--lr-decay-iters {decay} must be at least 1")
    if warmup >= decay:
        # The recipe's 2000 warm-up steps stop every short run here: say how to get past them.
        why_warmup = "" if "lr_warmup_iters" in explicit else " (the recipe's default)"
        why_decay = ("" if "lr_decay_iters" in explicit
                     else f" (90% of --train-iters {values['train_iters']}, at least 1)")
        raise InputError(f"--lr-warmup-iters {warmup}{why_warmup} must be below --lr-decay-iters {decay}{why_decay}: "
                         f"for a short run pass --lr-warmup-iters 0 (or a few steps)")


def _resolve_sample_schedule(values: dict, explicit: Set[str]) -> None:
    gbs, fraction = values["global_batch_size"], values["lr_warmup_fraction"]
    _refuse("train_iters" in explicit, "give --train-iters or --train-samples, not both")
    _refuse(bool({"lr_decay_iters", "lr_warmup_iters"} & explicit),
            "with --train-samples the schedule is in samples: use --lr-decay-samples / --lr-warmup-samples")
    _refuse(values["train_samples"] < gbs,
            f"--train-samples {values['train_samples']} is less than one global batch ({gbs})")
    _refuse(fraction is not None and values["lr_warmup_samples"] is not None,
            "give --lr-warmup-fraction or --lr-warmup-samples, not both")
    values["train_iters"] = values["train_samples"] // gbs  # as Megatron-LM without batch-size ramp-up
    if values["lr_decay_samples"] is None:
        values["lr_decay_samples"] = int(RECIPE_DECAY_FRACTION * values["train_samples"])
    if values["lr_warmup_samples"] is None:
        values["lr_warmup_samples"] = 0 if fraction is not None else RECIPE_WARMUP_ITERS * gbs
    warmup, decay = values["lr_warmup_samples"], values["lr_decay_samples"]
    _refuse(fraction is None and warmup >= decay,
            f"--lr-warmup-samples {warmup} must be below --lr-decay-samples {decay} (recipe defaults: "
            f"{RECIPE_WARMUP_ITERS} x --global-batch-size, {RECIPE_DECAY_FRACTION:.0%} of --train-samples): for a "
            f"short run pass --lr-warmup-samples 0 (or a few batches)")
    # The iteration fields mirror the sample schedule (read by the log and the checks).
    values["lr_decay_iters"] = decay // gbs
    values["lr_warmup_iters"] = 0


class ScheduleSteps(NamedTuple):
    warmup: float
    decay: int
    weight_decay_span: int
    per_iteration: int  # the scheduler's increment per optimizer step


def schedule_steps(training) -> ScheduleSteps:
    """The scheduler's lengths for `training` (the TrainingSettings), in samples as Megatron-LM counts them
    (iterations x --global-batch-size with --train-iters); --lr-warmup-fraction is a fraction of the decay."""
    gbs = training.global_batch_size
    if training.train_samples is not None:
        decay, warmup, span = training.lr_decay_samples, training.lr_warmup_samples, training.train_samples
    else:
        decay, warmup, span = (training.lr_decay_iters * gbs, training.lr_warmup_iters * gbs,
                               training.train_iters * gbs)
    if training.lr_warmup_fraction is not None:
        warmup = training.lr_warmup_fraction * decay
    return ScheduleSteps(warmup, decay, span, gbs)


def build_scheduler(training, optimizer):
    """megatron-core's `OptimizerParamScheduler` for `training` (the TrainingSettings): linear warmup from
    --lr-warmup-init, decay to --min-lr, then constant; step it by `schedule_steps(training).per_iteration` per
    iteration."""
    from megatron.core.optimizer_param_scheduler import OptimizerParamScheduler

    warmup, decay, span, _ = schedule_steps(training)
    return OptimizerParamScheduler(
        optimizer, init_lr=training.lr_warmup_init, max_lr=training.lr, min_lr=training.min_lr,
        lr_warmup_steps=warmup, lr_decay_steps=decay,
        lr_decay_style=training.lr_decay_style, start_wd=training.weight_decay, end_wd=training.weight_decay,
        wd_incr_steps=span, wd_incr_style="constant",
        use_checkpoint_opt_param_scheduler=not training.override_opt_param_scheduler,
        override_opt_param_scheduler=training.override_opt_param_scheduler)
