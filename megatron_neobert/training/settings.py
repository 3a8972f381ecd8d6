"""The trainer's settings: the command line turned once into frozen dataclasses, one per concern.

The argparse Namespace stays the command-line layer (Megatron-LM's flag names, meanings and defaults;
`training/arguments.py` parses it). `settings_from_args` checks it, resolves the derived defaults
(--min-lr, --lr-decay-iters, sample-based schedules, --bf16 on a GPU, ...) on a copy, and splits it into
the sections below; the library functions take a section or the whole `Settings`. Each section's fields
are the flags of the `--help` group of the same title, under their Megatron-LM names, so `Settings.flags()`
gives back every flag by name (a checkpoint saves them as Megatron-LM's args).
"""

import argparse
import dataclasses
import os
from typing import ClassVar, FrozenSet, List, Optional, Tuple, Union

from megatron_neobert.training.errors import InputError
from megatron_neobert.training.megatron_args import apply_megatron_lm_args

# TE's FP8 GEMMs need every dimension but the last a multiple of 8 and the last of 16; the token
# dimension of an activation is tokens per micro-batch, split over TP with sequence parallelism.
FP8_TOKEN_MULTIPLE = 16
FP8_MIN_CAPABILITY = (8, 9)  # Ada / Hopper: FP8 tensor cores
MXFP8_MIN_CAPABILITY = (10, 0)  # Blackwell: MXFP8 block scaling is done by the tensor cores


@dataclasses.dataclass(frozen=True)
class ModelSettings:
    TITLE: ClassVar[str] = "model"
    model_preset: str
    num_layers: Optional[int]
    hidden_size: Optional[int]
    num_attention_heads: Optional[int]
    ffn_hidden_size: Optional[int]
    max_position_embeddings: Optional[int]
    vocab_size: Optional[int]
    make_vocab_size_divisible_by: int
    position_embedding_type: Optional[str]
    normalization: Optional[str]
    swiglu: bool
    untie_embeddings_and_output_weights: bool
    bert_no_binary_head: bool
    hidden_dropout: float
    attention_dropout: float
    init_method_std: Optional[float]
    transformer_impl: str
    attention_backend: str
    recompute_activations: bool
    recompute_granularity: Optional[str]
    recompute_method: str
    recompute_num_layers: int


@dataclasses.dataclass(frozen=True)
class PrecisionSettings:
    TITLE: ClassVar[str] = "precision"
    bf16: bool
    fp16: bool
    initial_loss_scale: float
    loss_scale: Optional[float]
    fp8_format: Optional[str]
    fp8_recipe: str


@dataclasses.dataclass(frozen=True)
class ParallelSettings:
    TITLE: ClassVar[str] = "parallelism"
    tensor_model_parallel_size: int
    pipeline_model_parallel_size: int
    num_layers_per_virtual_pipeline_stage: Optional[int]
    sequence_parallel: bool
    use_distributed_optimizer: bool
    overlap_grad_reduce: bool
    overlap_param_gather: bool
    ddp_bucket_size: Optional[int]
    distributed_backend: Optional[str]


@dataclasses.dataclass(frozen=True)
class TrainingSettings:
    TITLE: ClassVar[str] = "batch, optimizer and schedule"
    micro_batch_size: int
    global_batch_size: int
    rampup_batch_size: Optional[List[int]]
    train_iters: int
    train_samples: Optional[int]
    seed: int
    optimizer: str
    lr: float
    min_lr: float
    lr_warmup_init: float
    lr_warmup_iters: int
    lr_warmup_samples: Optional[int]
    lr_warmup_fraction: Optional[float]
    lr_decay_iters: int
    lr_decay_samples: Optional[int]
    lr_decay_style: str
    override_opt_param_scheduler: bool
    use_checkpoint_opt_param_scheduler: bool
    weight_decay: float
    adam_beta1: float
    adam_beta2: float
    adam_eps: float
    clip_grad: float


@dataclasses.dataclass(frozen=True)
class DataSettings:
    TITLE: ClassVar[str] = "data"
    data_path: Optional[List[str]]
    data_args_path: Optional[str]
    per_split_data_args_path: Optional[str]
    train_data_path: Optional[List[str]]
    valid_data_path: Optional[List[str]]
    test_data_path: Optional[List[str]]
    mock_data: bool
    split: str
    data_cache_path: Optional[str]
    seq_length: int
    tokenizer_type: str
    tokenizer_model: str
    vocab_file: Optional[str]
    legacy_tokenizer: bool
    mask_rate: float
    mask_prob: Optional[float]
    mask_scheme: str
    short_seq_prob: float
    packed: bool
    data_loader: str
    dataloader_type: str
    num_workers: int


@dataclasses.dataclass(frozen=True)
class CheckpointSettings:
    TITLE: ClassVar[str] = "checkpoints"
    save: Optional[str]
    load: Optional[str]
    save_interval: Optional[int]
    keep_last_n_checkpoints: Optional[int]
    ckpt_step: Optional[int]
    use_checkpoint_args: bool
    finetune: bool
    pretrained_checkpoint: Optional[str]
    no_load_optim: bool
    no_load_rng: bool
    no_save_optim: bool
    no_save_rng: bool
    async_save: bool
    ckpt_format: str
    auto_detect_ckpt_format: bool
    ckpt_fully_parallel_save: bool
    dist_ckpt_strictness: str
    no_verify_checkpoint: bool
    allow_data_change: bool
    break_save_lock: bool
    overwrite_save: bool


@dataclasses.dataclass(frozen=True)
class FaultSettings:
    TITLE: ClassVar[str] = "fault tolerance"
    exit_signal_handler: bool
    exit_signal: str
    exit_interval: Optional[int]
    exit_duration_in_mins: Optional[float]
    distributed_timeout_minutes: float
    max_skipped_iters: int


@dataclasses.dataclass(frozen=True)
class EvaluationSettings:
    TITLE: ClassVar[str] = "evaluation"
    eval_interval: int
    eval_iters: int
    skip_train: bool


@dataclasses.dataclass(frozen=True)
class LoggingSettings:
    TITLE: ClassVar[str] = "logging"
    log_interval: int
    log_throughput: bool
    log_params_norm: bool
    log_num_zeros_in_grad: bool
    timing_log_level: int
    tensorboard_dir: Optional[str]
    tensorboard_log_interval: int
    log_timers_to_tensorboard: bool
    log_validation_ppl_to_tensorboard: bool
    log_memory_to_tensorboard: bool
    log_world_size_to_tensorboard: bool
    log_loss_scale_to_tensorboard: bool
    wandb_project: str
    wandb_exp_name: str
    wandb_save_dir: str


@dataclasses.dataclass(frozen=True)
class ProfilingSettings:
    TITLE: ClassVar[str] = "profiling"
    profile: bool
    profile_step_start: int
    profile_step_end: int
    profile_ranks: List[int]
    pytorch_profiler_collect_callstack: bool


@dataclasses.dataclass(frozen=True)
class Settings:
    """The run's settings by concern; `explicit`: the flags the user gave (on the command line or in
    --config), the others took their defaults (the recipe's are reported at start-up)."""

    model: ModelSettings
    precision: PrecisionSettings
    parallel: ParallelSettings
    training: TrainingSettings
    data: DataSettings
    checkpoint: CheckpointSettings
    faults: FaultSettings
    evaluation: EvaluationSettings
    logging: LoggingSettings
    profiling: ProfilingSettings
    explicit: FrozenSet[str] = frozenset()

    def sections(self) -> list:
        return [getattr(self, f.name) for f in dataclasses.fields(self) if f.name != "explicit"]

    def flags(self) -> dict:
        """Every flag by its Megatron-LM name (argparse's dest), as a checkpoint's args hold them."""
        return {f.name: getattr(section, f.name) for section in self.sections() for f in dataclasses.fields(section)}


SECTIONS = {f.name: f.type for f in dataclasses.fields(Settings) if f.name != "explicit"}


def settings_from_args(args: argparse.Namespace, explicit=frozenset(),
                       gpu_capability: Optional[Union[Tuple[int, int], bool]] = None,
                       te_available: Optional[bool] = None) -> Settings:
    """Check the command line and fill in the derived defaults; `explicit`: the flags the user gave.
    `gpu_capability` ((major, minor) of this rank's GPU, False without one) and `te_available` describe
    the machine for the precision checks; None: look them up here."""
    resolved = argparse.Namespace(**vars(args))  # the command line stays as given
    apply_megatron_lm_args(resolved, explicit)
    _resolve_recipe_defaults(resolved, explicit)
    _check_precision(resolved, gpu_capability, te_available)
    return Settings(**{name: section(**{f.name: getattr(resolved, f.name) for f in dataclasses.fields(section)})
                       for name, section in SECTIONS.items()}, explicit=frozenset(explicit))


def _resolve_recipe_defaults(args: argparse.Namespace, explicit) -> None:
    if args.min_lr is None:
        args.min_lr = 0.1 * args.lr
    if args.lr_decay_iters is None:
        args.lr_decay_iters = max(1, int(0.9 * args.train_iters))  # megatron-core's scheduler needs a step
    if args.lr_decay_style == "constant":
        args.min_lr = args.lr
    if args.lr_decay_iters < 1:
        raise InputError(f"--lr-decay-iters {args.lr_decay_iters} must be at least 1")
    if args.lr_warmup_iters >= args.lr_decay_iters:
        # The recipe's 2000 warm-up steps stop every short run here: say how to get past them.
        warmup = "" if "lr_warmup_iters" in explicit else " (the recipe's default)"
        decay = "" if "lr_decay_iters" in explicit else f" (90% of --train-iters {args.train_iters}, at least 1)"
        raise InputError(f"--lr-warmup-iters {args.lr_warmup_iters}{warmup} must be below --lr-decay-iters "
                         f"{args.lr_decay_iters}{decay}: for a short run pass --lr-warmup-iters 0 (or a few "
                         f"steps)")
    if args.overlap_param_gather and not args.use_distributed_optimizer:
        raise InputError("--overlap-param-gather needs --use-distributed-optimizer")
    if args.sequence_parallel and args.tensor_model_parallel_size == 1:
        args.sequence_parallel = False  # as Megatron-LM: nothing to split
    if args.profile:
        if not 0 <= args.profile_step_start < args.profile_step_end <= args.train_iters:
            raise InputError(f"--profile-step-start {args.profile_step_start} and --profile-step-end "
                             f"{args.profile_step_end} must satisfy 0 <= start < end <= --train-iters "
                             f"{args.train_iters}")
        if not (args.tensorboard_dir or args.save):
            raise InputError("--profile writes its trace to --tensorboard-dir, else to --save/profile: "
                             "give one of them")
    sources = {"--data-path": args.data_path, "--data-args-path": args.data_args_path,
               "--per-split-data-args-path": args.per_split_data_args_path,
               "--train-data-path": args.train_data_path, "--mock-data": args.mock_data or None}
    given = [flag for flag, value in sources.items() if value is not None]
    if len(given) != 1:
        raise InputError(f"give exactly one of {', '.join(sources)} (got {', '.join(given) or 'none'}; "
                         "see tools/preprocess_data.py)")
    if os.path.exists(args.tokenizer_model):
        # A local tokenizer is recorded by its absolute path in the checkpoint's args, so that the
        # export and a resume find it from any working directory.
        args.tokenizer_model = os.path.abspath(args.tokenizer_model)


def _detect_capability() -> Union[Tuple[int, int], bool]:
    import torch  # here: the trainer's --help must not wait for it

    return torch.cuda.get_device_capability() if torch.cuda.is_available() else False


def _detect_te() -> bool:
    from megatron_neobert.model.layer_specs import transformer_engine_available

    return transformer_engine_available()


def _check_precision(args: argparse.Namespace, gpu_capability, te_available) -> None:
    """Sets `--bf16` when not given (on for a GPU, off on a CPU) and rejects precision combinations
    that cannot run on this machine, before any model is built."""
    capability = _detect_capability() if gpu_capability is None else gpu_capability
    te = _detect_te() if te_available is None else te_available
    on_gpu = bool(capability)
    if args.bf16 is None:
        args.bf16 = on_gpu and not args.fp16  # the recipe trains in bf16; fp32 (--no-bf16) is for debugging
    if args.attention_backend == "local":  # Megatron-LM's: megatron-core's own layers, no TE kernel
        if args.transformer_impl == "transformer_engine":
            raise InputError("--attention-backend local runs megatron-core's local layers: not with "
                             "--transformer-impl transformer_engine")
        args.transformer_impl = "local"
    uses_te = args.transformer_impl == "transformer_engine" or (
        args.transformer_impl == "auto" and te and on_gpu)
    if args.attention_backend in ("flash", "fused", "unfused") and not uses_te:
        raise InputError(f"--attention-backend {args.attention_backend} picks a Transformer Engine attention kernel, "
                         f"and the layers here are megatron-core's local ones (--transformer-impl "
                         f"{args.transformer_impl}, Transformer Engine {'on a CPU' if te else 'absent'}): use "
                         f"--attention-backend auto or local")
    if args.transformer_impl == "transformer_engine" and not te:
        raise InputError("--transformer-impl transformer_engine: Transformer Engine does not import here")
    if uses_te and args.packed and not (args.bf16 or args.fp16):
        raise InputError("Transformer Engine attention has no fp32 kernel for packed (THD) input: "
                         "pass --bf16 (or --fp16), or --no-packed, or --transformer-impl local")
    if args.fp8_format is None:
        return
    if not te:
        raise InputError(f"--fp8-format {args.fp8_format} needs Transformer Engine, which does not import "
                         f"here; drop --fp8-format")
    if not uses_te:
        raise InputError(f"--fp8-format {args.fp8_format} runs in Transformer Engine layers: use "
                         f"--transformer-impl transformer_engine (or auto on a GPU), not "
                         f"{args.transformer_impl}")
    if not args.bf16:
        raise InputError(f"--fp8-format {args.fp8_format} needs --bf16 (FP8 GEMMs in bf16 layers)")
    if on_gpu and tuple(capability) < FP8_MIN_CAPABILITY:
        raise InputError(f"--fp8-format {args.fp8_format}: this GPU (compute capability "
                         f"{capability[0]}.{capability[1]}) has no FP8 tensor cores (needs >= 8.9)")
    if args.fp8_recipe == "mxfp8" and on_gpu and tuple(capability) < MXFP8_MIN_CAPABILITY:
        raise InputError(f"--fp8-recipe mxfp8 needs a Blackwell GPU (compute capability >= 10.0), this one "
                         f"is {capability[0]}.{capability[1]}: use --fp8-recipe delayed or tensorwise")
    tokens = args.micro_batch_size * args.seq_length
    tp = args.tensor_model_parallel_size
    per_rank = tokens // tp if args.sequence_parallel else tokens
    if (args.sequence_parallel and tokens % tp) or per_rank % FP8_TOKEN_MULTIPLE:
        split = f" / --tensor-model-parallel-size {tp} (sequence parallel)" if args.sequence_parallel else ""
        raise InputError(f"--fp8-format: tokens per micro-batch (--micro-batch-size {args.micro_batch_size} x "
                         f"--seq-length {args.seq_length}{split} = {tokens / (tp if args.sequence_parallel else 1):g})"
                         f" must be a multiple of {FP8_TOKEN_MULTIPLE}")
