"""The flags a Megatron-LM user brings, with Megatron-LM's meanings (core_v0.16): their checks and
resolution (called by `settings.settings_from_args` on its copy of the command line), the recipe's defaults.

NeoBERT's recipe sets other defaults than Megatron-LM for some of them: `--help` shows both, and
the trainer prints, at start-up, the recipe defaults that the command line (and --config) left in
place. Sample-based schedules (`--train-samples`, ...) and `--lr-warmup-fraction` resolve here into
the numbers the scheduler reads (`schedule_steps`).
"""

import argparse
import importlib.util
from typing import Iterable, List, NamedTuple, Optional, Set

from megatron_neobert.data.tokenizer import wordpiece_tokenizer_model
from megatron_neobert.model.config import PRESETS, get_arch
from megatron_neobert.training.errors import InputError

# dest: (the recipe's default, Megatron-LM's), as --help and the start-up report show them.
RECIPE_DEFAULTS = {
    "lr": ("6e-4", "none, required"),
    "min_lr": ("10% of --lr", "0.0"),
    "adam_beta2": ("0.95", "0.999"),
    "weight_decay": ("0.1", "0.01"),
    "lr_decay_style": ("cosine", "linear"),
    "lr_warmup_iters": ("2000", "0"),
    "lr_decay_iters": ("90% of --train-iters", "--train-iters"),
    "lr_warmup_samples": ("2000 x --global-batch-size", "0"),
    "lr_decay_samples": ("90% of --train-samples", "--train-samples"),
    "train_iters": ("1,000,000", "none, required unless --train-samples"),
    "micro_batch_size": ("32", "none, required"),
    "global_batch_size": ("2048", "micro-batch x data-parallel size"),
    "seq_length": ("1024", "none, required"),
    "split": ("949,50,1", "969,30,1"),
    "hidden_dropout": ("0.0", "0.1"),
    "attention_dropout": ("0.0", "0.1"),
    "init_method_std": ("none: NeoBERT's uniform(-0.02, 0.02)", "0.02, normal"),
    "mask_rate": ("0.2, every chosen token [MASK]", "--mask-prob 0.15, BERT's 80/10/10"),
}
# What NeoBERT's architecture and recipe fix where Megatron-LM's BERT has another default (printed at start-up).
RECIPE_DIFFERENCES = ("no binary (next-sentence) head", "untied MLM decoder", "SwiGLU, RMSNorm and RoPE (the preset's)",
                      "packed whole documents, no short sequences", "AdamW beta2 0.95")
STRICTNESS = ("assume_ok_unexpected", "log_unexpected", "log_all", "raise_unexpected", "raise_all",
              "return_unexpected", "return_all", "ignore_all")
RECIPE_WARMUP_ITERS = 2000
RECIPE_DECAY_FRACTION = 0.9
CKPT_FORMATS = ("torch_dist", "torch", "torch_dcp", "zarr", "fsdp_dtensor")


def note_recipe_defaults(p: argparse.ArgumentParser) -> None:
    """--help names both defaults where the recipe's differs from Megatron-LM's."""
    for action in p._actions:
        if action.dest in RECIPE_DEFAULTS:
            recipe, megatron = RECIPE_DEFAULTS[action.dest]
            note = f"recipe default {recipe}; Megatron-LM's: {megatron}".replace("%", "%%")
            action.help = f"{action.help}; {note}" if action.help else note


def explicit_dests(build_parser, argv: Optional[List[str]], config_keys: Iterable[str]) -> Set[str]:
    """The settings the user gave: on the command line or in the --config file."""
    probe = build_parser()
    for action in probe._actions:
        action.default = argparse.SUPPRESS
    given, _ = probe.parse_known_args(argv)
    return set(vars(given)) | {k.replace("-", "_") for k in config_keys}


def _refuse(condition: bool, message: str) -> None:
    if condition:
        raise InputError(message)


def apply_megatron_lm_args(args: argparse.Namespace, explicit: Set[str]) -> None:
    """Check and resolve the Megatron-LM flags, before the recipe's own defaults are filled in."""
    _refuse(args.ckpt_format != "torch_dist",
            f"--ckpt-format {args.ckpt_format}: only torch_dist is written and read (megatron-core's "
            f"distributed checkpoint, loadable at any TP/PP/DP); Megatron-LM's other formats "
            f"({', '.join(CKPT_FORMATS[1:])}) are not implemented here")
    _refuse(args.fp16 and args.bf16, "--fp16 and --bf16 exclude each other")
    _refuse(args.fp16 and args.fp8_format is not None, "--fp8-format runs with --bf16, not --fp16")
    if args.recompute_activations:
        _refuse(args.recompute_granularity == "full",
                "--recompute-activations means --recompute-granularity selective; not with full")
        args.recompute_granularity = "selective"
    _refuse(args.rampup_batch_size is not None, "--rampup-batch-size: batch-size ramp-up is not implemented "
            "here; train with a fixed --global-batch-size")
    _refuse(args.dataloader_type != "single", f"--dataloader-type {args.dataloader_type}: only single is "
            "implemented (one pass in the dataset's own shuffled order, resumable by consumed samples)")
    _refuse(args.short_seq_prob != 0, f"--short-seq-prob {args.short_seq_prob}: documents are packed whole up to "
            "--seq-length; Megatron-LM's short-sequence sampling is not implemented (drop the flag)")
    _refuse(args.timing_log_level != 0, f"--timing-log-level {args.timing_log_level}: Megatron-LM's per-phase "
            "timers are not implemented; --profile writes a trace of the steps instead")
    _refuse(args.tensorboard_log_interval < 1, "--tensorboard-log-interval must be at least 1")
    _refuse(args.use_checkpoint_opt_param_scheduler and args.override_opt_param_scheduler,
            "--use-checkpoint-opt_param-scheduler and --override-opt-param-scheduler exclude each other")
    import torch

    backend = "nccl" if torch.cuda.is_available() else "gloo"
    _refuse(args.distributed_backend not in (None, backend), f"--distributed-backend {args.distributed_backend}: "
            f"this machine runs {backend} ({'GPUs' if backend == 'nccl' else 'no GPU'})")
    if args.mask_prob is not None:
        _refuse("mask_rate" in explicit, "--mask-prob is Megatron-LM's name of --mask-rate: give one of them")
        args.mask_rate = args.mask_prob
    _check_architecture_flags(args)
    _resolve_schedule(args, explicit)
    _resolve_data(args, explicit)
    _resolve_tokenizer(args, explicit)
    if args.wandb_project:
        _refuse(not args.wandb_exp_name, "--wandb-project needs --wandb-exp-name (the run's name)")
        _refuse(importlib.util.find_spec("wandb") is None,
                "--wandb-project needs the wandb package: pip install wandb (or this package's wandb extra)")
        _refuse(not (args.wandb_save_dir or args.save), "--wandb-project writes into --wandb-save-dir, "
                "else --save/wandb: give one of them")
    _refuse(args.use_checkpoint_args and not args.load, "--use-checkpoint-args reads the --load checkpoint: give --load")


def _check_architecture_flags(args) -> None:
    """Megatron-LM's architecture flags choose no architecture here (the preset does): each one given must
    agree with the preset, or the error names the presets that have what it asks for."""
    arch = get_arch(args.model_preset)
    asked = {"position_embedding_type": args.position_embedding_type, "normalization": args.normalization,
             "activation": "swiglu" if args.swiglu else None}
    for field, value in asked.items():
        if value is None or getattr(arch, field) == value:
            continue
        flag = {"activation": "--swiglu"}.get(field, f"--{field.replace('_', '-')} {value}")
        having = [name for name, preset in PRESETS.items() if getattr(preset, field) == value]
        raise InputError(f"{flag}: the {args.model_preset} preset has {field} {getattr(arch, field)}; "
                         f"--model-preset {' or '.join(having)} has {value}")


def _resolve_schedule(args, explicit: Set[str]) -> None:
    fraction = args.lr_warmup_fraction
    _refuse(fraction is not None and not 0.0 <= fraction < 1.0,
            f"--lr-warmup-fraction {fraction} must be in [0, 1)")
    if args.train_samples is None:
        _refuse(args.lr_decay_samples is not None or args.lr_warmup_samples is not None,
                "--lr-decay-samples / --lr-warmup-samples go with --train-samples; with --train-iters use "
                "--lr-decay-iters / --lr-warmup-iters")
        _refuse(fraction is not None and "lr_warmup_iters" in explicit,
                "give --lr-warmup-fraction or --lr-warmup-iters, not both")
        if fraction is not None:
            args.lr_warmup_iters = 0
        return
    gbs = args.global_batch_size
    _refuse("train_iters" in explicit, "give --train-iters or --train-samples, not both")
    _refuse(bool({"lr_decay_iters", "lr_warmup_iters"} & explicit),
            "with --train-samples the schedule is in samples: use --lr-decay-samples / --lr-warmup-samples")
    _refuse(args.train_samples < gbs, f"--train-samples {args.train_samples} is less than one global batch ({gbs})")
    _refuse(fraction is not None and args.lr_warmup_samples is not None,
            "give --lr-warmup-fraction or --lr-warmup-samples, not both")
    args.train_iters = args.train_samples // gbs  # as Megatron-LM without batch-size ramp-up
    if args.lr_decay_samples is None:
        args.lr_decay_samples = int(RECIPE_DECAY_FRACTION * args.train_samples)
    if args.lr_warmup_samples is None:
        args.lr_warmup_samples = 0 if fraction is not None else RECIPE_WARMUP_ITERS * gbs
    _refuse(fraction is None and args.lr_warmup_samples >= args.lr_decay_samples,
            f"--lr-warmup-samples {args.lr_warmup_samples} must be below --lr-decay-samples {args.lr_decay_samples} "
            f"(recipe defaults: {RECIPE_DEFAULTS['lr_warmup_samples'][0]}, {RECIPE_DEFAULTS['lr_decay_samples'][0]}): "
            f"for a short run pass --lr-warmup-samples 0 (or a few batches)")
    # The iteration fields mirror the sample schedule (read by the log and the checks).
    args.lr_decay_iters = args.lr_decay_samples // gbs
    args.lr_warmup_iters = 0


def _resolve_data(args, explicit: Set[str]) -> None:
    per_split = [args.train_data_path, args.valid_data_path, args.test_data_path]
    _refuse("split" in explicit and (args.mock_data or any(per_split)),
            "--split divides --data-path; --mock-data and --train/valid/test-data-path do not read it")
    if args.mock_data:
        _refuse(args.data_path is not None or any(per_split), "--mock-data reads no files: drop --data-path "
                "and --train/valid/test-data-path")
    elif any(per_split):
        _refuse(args.data_path is not None, "--data-path and --train/valid/test-data-path exclude each other")
        _refuse(not args.train_data_path, "--valid/test-data-path need --train-data-path too")


def _resolve_tokenizer(args, explicit: Set[str]) -> None:
    if args.vocab_file is not None and "tokenizer_type" not in explicit:
        args.tokenizer_type = "BertWordPieceLowerCase"  # Megatron-LM's pretrain_bert.py default
    try:
        vocab_file = wordpiece_tokenizer_model(args.tokenizer_type, args.vocab_file, "tokenizer_model" in explicit)
    except ValueError as err:  # the data package's checks, in its own error type
        raise InputError(str(err)) from err
    if vocab_file is not None:
        # What build_tokenizer and the checkpoint's args name.
        args.vocab_file = args.tokenizer_model = vocab_file


def recipe_defaults_applied(settings) -> List[str]:
    """The recipe defaults the user left in place, with their final values, for the start-up report."""
    training, data = settings.training, settings.data
    skip = ({"lr_decay_iters", "lr_warmup_iters", "train_iters"} if training.train_samples is not None
            else {"lr_decay_samples", "lr_warmup_samples"})
    if training.lr_warmup_fraction is not None:
        skip |= {"lr_warmup_iters", "lr_warmup_samples"}
    if data.mock_data or data.train_data_path:
        skip.add("split")
    if settings.checkpoint.use_checkpoint_args:  # the checkpoint's length, unless given
        skip.add("seq_length")
    if data.mask_prob is not None:
        skip.add("mask_rate")
    flags = settings.flags()
    return [f"--{dest.replace('_', '-')} {flags[dest]} (Megatron-LM's default: {RECIPE_DEFAULTS[dest][1]})"
            for dest in RECIPE_DEFAULTS if dest not in settings.explicit and dest not in skip]


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
