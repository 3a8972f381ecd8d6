"""The trainer's settings, each declared once: one frozen dataclass per concern, a field per setting carrying its
flag, help text, default and, where NeoBERT's recipe departs from it, Megatron-LM's default
(`megatron_neobert.flags.setting`).

`training/config/arguments.py` generates the command line from these declarations (one `--help` group per section,
under its TITLE), and `training/config/resolve.py` turns what the command line gave into the run's `Settings`, derived
defaults filled in and checked. Flags are Megatron-LM's names and meanings; the Megatron-LM flags that choose nothing here
(aliases, flags accepted for what is always so, refusals) live in the command-line adapter and are not settings.
Kept free of torch, so that `--help` answers at once.
"""

import dataclasses
from typing import ClassVar, Dict, FrozenSet, Iterator, List, Optional, Union

from megatron_neobert.data.tokenizer import TokenizerSettings
from megatron_neobert.flags import setting
from megatron_neobert.defaults import LLAMA3_FAILURES_PER_GPU_DAY
from megatron_neobert.model.config import PRESETS
from megatron_neobert.model.shape import VOCAB_PADDING_MULTIPLE

# What NeoBERT's architecture and recipe fix where Megatron-LM's BERT has another default (printed at start-up).
RECIPE_DIFFERENCES = ("no binary (next-sentence) head", "untied MLM decoder", "SwiGLU, RMSNorm and RoPE (the preset's)",
                      "packed whole documents, no short sequences", "AdamW beta2 0.95")
# NeoBERT's schedule, stated once: 2,000 warm-up steps, a decay over 90% of the run down to 10% of the peak.
RECIPE_WARMUP_ITERS = 2000
RECIPE_DECAY_FRACTION = 0.9
RECIPE_MIN_LR_FRACTION = 0.1
# The signals --exit-signal may name (the process guards handle them by these names).
EXIT_SIGNAL_NAMES = ("SIGTERM", "SIGINT", "SIGUSR1", "SIGUSR2")
STRICTNESS = ("assume_ok_unexpected", "log_unexpected", "log_all", "raise_unexpected", "raise_all",
              "return_unexpected", "return_all", "ignore_all")


def int_or_auto(text: str) -> Union[int, str]:
    """--save-interval's value: a number of iterations, or "auto"."""
    return text if text == "auto" else int(text)


def _override(arch_field: str):
    """A size flag of Megatron-LM that overrides the preset's `arch_field` (a NeoBERTArch field)."""
    return setting(None, "override the preset's value", arch_field=arch_field)


@dataclasses.dataclass(frozen=True)
class ModelSettings:
    TITLE: ClassVar[str] = "model"
    model_preset: str = setting("neobert-250m", "architecture preset (neobert-250m is the published model)",
                                choices=sorted(PRESETS))
    num_layers: Optional[int] = _override("num_layers")
    hidden_size: Optional[int] = _override("hidden_size")
    num_attention_heads: Optional[int] = _override("num_attention_heads")
    ffn_hidden_size: Optional[int] = _override("ffn_hidden_size")
    max_position_embeddings: Optional[int] = _override("max_sequence_length")
    vocab_size: Optional[int] = _override("vocab_size")
    make_vocab_size_divisible_by: int = setting(
        VOCAB_PADDING_MULTIPLE, "pad the vocabulary to a multiple of this x TP (a loaded checkpoint's padding wins)")
    hidden_dropout: float = setting(0.0, "dropout after attention and MLP", megatron_default="0.1")
    attention_dropout: float = setting(0.0, "dropout of the attention probabilities", megatron_default="0.1")
    init_method_std: Optional[float] = setting(
        None, "initialise weights ~ normal(0, std), the output projections scaled by 1/sqrt(2 x layers), as "
              "megatron-core", megatron_default="0.02, normal", recipe_default="none: NeoBERT's uniform(-0.02, 0.02)")
    transformer_impl: str = setting(
        "auto", "layer implementation: Transformer Engine, megatron-core's local layers, or auto (TE when it imports "
                "on a GPU)", choices=["auto", "transformer_engine", "local"])
    attention_backend: str = setting(
        "auto", "Transformer Engine's attention kernel (flash/fused/unfused need TE layers); local: megatron-core "
                "layers with this package's attention", choices=["auto", "flash", "fused", "unfused", "local"])
    recompute_granularity: Optional[str] = setting(
        None, "activation recomputation: full layers or selective (attention core)", choices=["full", "selective"])
    recompute_method: str = setting(
        "uniform", "with full recomputation: uniform chunks or the first N layers of a stage (block)",
        choices=["uniform", "block"])
    recompute_num_layers: int = setting(
        1, "layers per recomputed chunk (uniform) or recomputed layers per stage (block)")

    def arch_overrides(self) -> Dict[str, int]:
        """{NeoBERTArch field: value} of the size flags that were given."""
        return {f.metadata["arch_field"]: getattr(self, f.name) for f in dataclasses.fields(self)
                if "arch_field" in f.metadata and getattr(self, f.name) is not None}


@dataclasses.dataclass(frozen=True)
class PrecisionSettings:
    TITLE: ClassVar[str] = "precision"
    bf16: Optional[bool] = setting(
        None, "bf16 weights and activations, fp32 main weights (default: on with a GPU, off on CPU)")
    fp16: bool = setting(False, "fp16 weights and activations, fp32 main weights, dynamic loss scaling")
    initial_loss_scale: float = setting(2.0**32, "with --fp16")
    loss_scale: Optional[float] = setting(None, "with --fp16: a static scale instead")
    fp8_format: Optional[str] = setting(None, "needs Transformer Engine", choices=["e4m3", "hybrid"])
    fp8_recipe: str = setting("delayed", "Transformer Engine FP8 scaling recipe (mxfp8 needs Blackwell)",
                              choices=["tensorwise", "delayed", "mxfp8", "blockwise"])


@dataclasses.dataclass(frozen=True)
class ParallelSettings:
    TITLE: ClassVar[str] = "parallelism"
    tensor_model_parallel_size: int = setting(1, "tensor-parallel ranks per layer")
    pipeline_model_parallel_size: int = setting(1, "pipeline stages")
    num_layers_per_virtual_pipeline_stage: Optional[int] = setting(
        None, "layers per virtual stage: interleaved 1F1B")
    sequence_parallel: bool = setting(
        False, "split norms and dropout activations along the sequence across TP ranks")
    use_distributed_optimizer: bool = setting(
        False, "shard the optimizer state and fp32 main weights across data-parallel ranks")
    overlap_grad_reduce: bool = setting(False, "reduce gradients bucket by bucket during the backward pass")
    overlap_param_gather: bool = setting(
        False, "all-gather updated parameters during the next forward (needs --use-distributed-optimizer)")
    ddp_bucket_size: Optional[int] = setting(
        None, "parameters per gradient-reduction bucket with --overlap-grad-reduce (default: megatron-core's, "
              "max(40M, 1M x DP))")


@dataclasses.dataclass(frozen=True)
class TrainingSettings:
    TITLE: ClassVar[str] = "batch, optimizer and schedule"
    micro_batch_size: int = setting(32, megatron_default="none, required")
    global_batch_size: int = setting(2048, "sequences per optimizer step (2048 x 1024 = 2M tokens)",
                                     megatron_default="micro-batch x data-parallel size")
    train_iters: int = setting(1_000_000, recipe_default="1,000,000",
                               megatron_default="none, required unless --train-samples")
    train_samples: Optional[int] = setting(
        None, "train for this many samples (instead of --train-iters): iterations = samples / global batch; the "
              "schedule then counts samples")
    rampup_batch_size: Optional[List[int]] = setting(
        None, "with --train-samples: the global batch starts at START and grows by INCREMENT in equal steps over "
              "SAMPLES samples up to --global-batch-size (megatron-core's micro-batch calculator: more "
              "micro-batches per step)", nargs=3, metavar=("START", "INCREMENT", "SAMPLES"))
    seed: int = setting(1234, "random seed of weights, data order and masks")
    optimizer: str = setting(
        "adam", "adam: Adam with decoupled weight decay (AdamW), as Megatron-LM's adam; adamw: the same; adam-l2: "
                "weight decay as an L2 penalty in the gradient (torch.optim.Adam, the BERT-like ablation M0)",
        choices=["adam", "adamw", "adam-l2"])
    lr: float = setting(6e-4, megatron_default="none, required")
    min_lr: Optional[float] = setting(None, recipe_default=f"{RECIPE_MIN_LR_FRACTION:.0%} of --lr",
                                      megatron_default="0.0")
    lr_warmup_init: float = setting(0.0, "the learning rate the warmup starts from")
    lr_warmup_iters: int = setting(RECIPE_WARMUP_ITERS, megatron_default="0")
    lr_warmup_samples: Optional[int] = setting(None, "with --train-samples",
                                               recipe_default=f"{RECIPE_WARMUP_ITERS} x --global-batch-size",
                                               megatron_default="0")
    lr_warmup_fraction: Optional[float] = setting(
        None, "warmup over this fraction of the decay steps (instead of --lr-warmup-iters/-samples)")
    lr_decay_iters: Optional[int] = setting(
        None, "the decay ends here; --min-lr after it",
        recipe_default=f"{RECIPE_DECAY_FRACTION:.0%} of --train-iters (--train-iters with WSD and "
                       f"inverse-square-root)",
        megatron_default="--train-iters")
    lr_decay_samples: Optional[int] = setting(
        None, "with --train-samples",
        recipe_default=f"{RECIPE_DECAY_FRACTION:.0%} of --train-samples (--train-samples with WSD and "
                       f"inverse-square-root)",
        megatron_default="--train-samples")
    lr_decay_style: str = setting(
        "cosine", "after the warmup: cosine or linear from --lr to --min-lr over the decay steps; constant: --lr; "
                  "inverse-square-root: --lr x sqrt(warmup / step), not below --min-lr; WSD (warmup-stable-decay): "
                  "--lr until the last --lr-wsd-decay-iters (-samples) of the decay steps, then --lr-wsd-decay-style "
                  "down to --min-lr. Every style gives --min-lr after the decay steps (megatron-core's "
                  "OptimizerParamScheduler)", choices=["cosine", "linear", "constant", "inverse-square-root", "WSD"],
        megatron_default="linear")
    lr_wsd_decay_style: str = setting(
        "exponential", "WSD's final decay, at a fraction r of it: exponential 2 x 0.5^r - 1, linear 1 - r, cosine "
                       "(1 + cos(pi r)) / 2, minus_sqrt 1 - sqrt(r) (ModernBERT's 1-sqrt) of the way from --min-lr "
                       "to --lr", choices=["exponential", "linear", "cosine", "minus_sqrt"])
    lr_wsd_decay_iters: Optional[int] = setting(
        None, "with --lr-decay-style WSD: iterations of the final decay, the last of the decay steps")
    lr_wsd_decay_samples: Optional[int] = setting(
        None, "with --lr-decay-style WSD and --train-samples: samples of the final decay, the last of the decay steps")
    override_opt_param_scheduler: bool = setting(
        False, "take the schedule from the flags, not from the loaded checkpoint")
    weight_decay: float = setting(0.1, megatron_default="0.01")
    adam_beta1: float = setting(0.9, "Adam's first-moment decay")
    adam_beta2: float = setting(0.95, megatron_default="0.999")
    adam_eps: float = setting(1e-8, "Adam's epsilon")
    clip_grad: float = setting(1.0, "clip the global gradient norm to this (0: no clipping)")


@dataclasses.dataclass(frozen=True)
class DataSettings(TokenizerSettings):
    TITLE: ClassVar[str] = "data"
    data_path: Optional[List[str]] = setting(
        None, "prefixes of .bin/.idx datasets, or weight-prefix pairs (0.2 A 0.4 B 0.4 C)")
    data_args_path: Optional[str] = setting(None, "a file holding what --data-path would (many prefixes and weights)")
    per_split_data_args_path: Optional[str] = setting(
        None, 'JSON {"train": ..., "valid": ..., "test": ...}, each like --data-path (--split is then unused)')
    train_data_path: Optional[List[str]] = setting(
        None, "prefixes (or weight-prefix pairs) of the train split only; replaces --data-path and --split",
        nargs="*")
    valid_data_path: Optional[List[str]] = setting(
        None, "prefixes (or weight-prefix pairs) of the valid split only; replaces --data-path and --split",
        nargs="*")
    test_data_path: Optional[List[str]] = setting(
        None, "prefixes (or weight-prefix pairs) of the test split only; replaces --data-path and --split",
        nargs="*")
    null_tokenizer_pad_id: Optional[int] = setting(
        None, "with --tokenizer-type NullTokenizer: the data's [PAD] id (default: one of its own, --vocab-size + 1)")
    null_tokenizer_cls_id: Optional[int] = setting(
        None, "with --tokenizer-type NullTokenizer: the data's [CLS] id (default: --vocab-size + 2)")
    null_tokenizer_sep_id: Optional[int] = setting(
        None, "with --tokenizer-type NullTokenizer: the data's [SEP] id (default: --vocab-size + 3)")
    null_tokenizer_mask_id: Optional[int] = setting(
        None, "with --tokenizer-type NullTokenizer: the data's [MASK] id (default: --vocab-size + 4)")
    mock_data: bool = setting(
        False, "synthetic deterministic documents, packed and masked as real ones: no files")
    split: str = setting("949,50,1", megatron_default="969,30,1")
    data_cache_path: Optional[str] = setting(
        None, "folder of the datasets' layout caches (default: cache/ beside each dataset)")
    seq_length: int = setting(1024, megatron_default="none, required")
    mask_rate: float = setting(0.2, "fraction of tokens masked for the MLM loss",
                               recipe_default="0.2, every chosen token [MASK]",
                               megatron_default="--mask-prob 0.15, BERT's 80/10/10")
    mask_scheme: str = setting(
        "mask", "mask: every chosen token becomes [MASK]; 80/10/10: BERT's mask/random/keep",
        choices=["mask", "80/10/10"])
    packed: bool = setting(True, "pack documents with per-document attention (cu_seqlens), or pad")
    data_loader: str = setting("torch", "PyTorch DataLoader or NVIDIA DALI", choices=["torch", "dali"])
    num_workers: int = setting(2, "data-loader worker processes per rank")


@dataclasses.dataclass(frozen=True)
class CheckpointSettings:
    TITLE: ClassVar[str] = "checkpoints"
    save: Optional[str] = setting(None, "checkpoint root to save to")
    load: Optional[str] = setting(None, "checkpoint root to resume from (its latest complete iteration)")
    save_interval: Optional[Union[int, str]] = setting(
        None, "save every this many iterations (also at the end and when stopping early); auto: first at the end "
              "of the first --log-interval, then at the interval that wastes least, sqrt(2 x blocking save time x "
              "mean time between failures) (Young/Daly), from the saves and steps measured and "
              "--failure-rate-per-gpu-day", type=int_or_auto, metavar="N|auto")
    failure_rate_per_gpu_day: float = setting(
        LLAMA3_FAILURES_PER_GPU_DAY, "unexpected interruptions per GPU-day, for --save-interval auto (default: "
                                     "Llama 3's 419 in 54 days on 16,384 H100s)")
    keep_last_n_checkpoints: Optional[int] = setting(
        None, "delete all but the newest N iteration folders after each save")
    ckpt_step: Optional[int] = setting(None, "load this iteration of --load instead of the one its marker names")
    use_checkpoint_args: bool = setting(
        False, "take the model's shape (its whole architecture record: no preset needed) and, unless given, "
               "--seq-length from the checkpoint the run starts from (--load's, else --pretrained-checkpoint's); size "
               "flags given win")
    finetune: bool = setting(
        False, "load the model only; iteration, data position, optimizer and schedule start at 0")
    pretrained_checkpoint: Optional[str] = setting(
        None, "when --load holds no checkpoint: start from this one's weights, as --finetune")
    no_load_optim: bool = setting(
        False, "load the model (and schedule position), start with a fresh optimizer state")
    no_load_rng: bool = setting(False, "do not restore the RNG states of the checkpoint")
    no_save_optim: bool = setting(False, "save checkpoints without the optimizer state")
    no_save_rng: bool = setting(
        False, "save checkpoints without the RNG states (a resume from them starts new streams)")
    async_save: bool = setting(
        False, "write checkpoints in the background (megatron-core's asynchronous torch_dist save): the tensors are "
               "staged in host memory, training goes on while a process per rank writes them, and the marker moves "
               "once every rank's files are written and checksummed")
    dist_ckpt_strictness: str = setting(
        "assume_ok_unexpected", "what a load does with keys the checkpoint and the model do not share "
                                "(megatron-core's StrictHandling)", choices=STRICTNESS)
    no_verify_checkpoint: bool = setting(
        False, "load without checking the files against the checkpoint's checksums")
    allow_data_change: bool = setting(
        False, "resume at the checkpoint's sample position although the data files' content changed since it was "
               "saved (refused otherwise: the position would point into other data)")
    break_save_lock: bool = setting(
        False, "take over --save's lock held by a process on another host (when it is known dead)")
    overwrite_save: bool = setting(
        False, "start in a --save that holds another run's checkpoints, deleting them")


@dataclasses.dataclass(frozen=True)
class FaultSettings:
    """Pre-emption, hangs, and steps that go non-finite."""

    TITLE: ClassVar[str] = "fault tolerance"
    exit_signal_handler: bool = setting(False, "on --exit-signal save a checkpoint and exit cleanly")
    exit_signal: str = setting("SIGTERM", "the signal --exit-signal-handler answers (as Megatron-LM)",
                               choices=list(EXIT_SIGNAL_NAMES))
    exit_interval: Optional[int] = setting(None, "save and exit at this iteration")
    exit_duration_in_mins: Optional[float] = setting(
        None, "save and exit once the run has lasted this long (all ranks stop at the same step)")
    distributed_timeout_minutes: float = setting(
        10, "timeout of collectives; a watchdog line names the step after half of it")
    host_check_after_s: float = setting(
        30, "seconds without progress after which a rank asks a rank on each neighbouring host, and the "
            "rendezvous store, to answer within 5 s (again as often while it waits): a host that does not (cut off, "
            "powered off, frozen) ends the attempt at once, named; a slow peer on a host that answers is waited for "
            "(0: never ask)")
    max_skipped_iters: int = setting(
        10, "stop after this many consecutive steps skipped for a non-finite loss or gradient")
    straggler_detection: bool = setting(
        True, "no straggler warning (by default rank 0 names a rank whose compute time per step, its step less its "
              "wait for the others in the gradient reduction, stays above --straggler-threshold x the others' median "
              "for --straggler-intervals judged windows)", flag="--no-straggler-detection")
    straggler_threshold: float = setting(
        1.2, "a rank slower than this x the median of the others' compute time is a straggler: a fail-slow rank "
             "stretches the job's every step by a tenth or more (FALCON counts a change of 10%), while the ranks of "
             "a healthy job stay within a few percent of each other")
    straggler_intervals: int = setting(
        3, "judged windows a rank must stay slow before it is named. A window is a log interval of at least 8 steps, "
           "or shorter consecutive ones combined: a busy machine's bursts of a second or two average out over 8 "
           "steps. One slow window (a data-loader hiccup) is not a straggler; intervals with a save or a validation "
           "are not judged")
    straggler_exit_intervals: Optional[int] = setting(
        None, "end the straggler's host's part of the job once it has been slow this many judged windows in a row "
              "(at least --straggler-intervals): every rank saves (with --save), the host's ranks exit with an "
              "error line naming the host to drain (ending their torchrun), the others stop (under torchrun they end "
              "the attempt: --nnodes MIN:MAX goes on without the host) (default: never, the job goes on slowly)")


@dataclasses.dataclass(frozen=True)
class EvaluationSettings:
    TITLE: ClassVar[str] = "evaluation"
    eval_interval: int = setting(1000, "iterations between validations (0: none)")
    eval_iters: int = setting(100, "global batches per validation")
    skip_train: bool = setting(
        False, "load, run one validation of --eval-iters batches, and exit without training")


@dataclasses.dataclass(frozen=True)
class LoggingSettings:
    TITLE: ClassVar[str] = "logging"
    log_interval: int = setting(100, "iterations per console and TensorBoard line")
    log_throughput: bool = setting(
        False, "TFLOP/s per GPU on the console ('throughput per GPU (TFLOP/s/GPU)') and, with "
               "--log-timers-to-tensorboard, as 'throughput' on TensorBoard / wandb")
    log_params_norm: bool = setting(
        False, "the parameters' L2 norm on the console and TensorBoard ('params-norm')")
    log_num_zeros_in_grad: bool = setting(
        False, "the count of zero gradient entries on the console and TensorBoard ('num-zeros')")
    tensorboard_dir: Optional[str] = setting(None, "write TensorBoard events here (rank 0)")
    tensorboard_log_interval: int = setting(
        1, "iterations between TensorBoard / wandb writes of the per-step figures")
    log_timers_to_tensorboard: bool = setting(
        False, "'iteration-time' (and 'throughput' with --log-throughput) on TensorBoard / wandb")
    log_validation_ppl_to_tensorboard: bool = setting(False, "'lm loss validation ppl' on TensorBoard / wandb")
    log_memory_to_tensorboard: bool = setting(
        False, "'mem-reserved-bytes', 'mem-allocated-bytes', 'mem-max-allocated-bytes', 'mem-allocated-count' "
               "(CUDA's allocator; GPU only)")
    log_world_size_to_tensorboard: bool = setting(False, "'world-size' on TensorBoard / wandb")
    log_loss_scale_to_tensorboard: bool = setting(
        True, "no 'loss-scale' on TensorBoard / wandb (written every step by default, 1.0 without --fp16)",
        flag="--no-log-loss-scale-to-tensorboard")
    log_straggler: bool = setting(
        False, "as Megatron-LM: every --log-interval, the min and max over the ranks of the compute time per step "
               "(MnRtt/MxRtt) and of the estimated TFLOP/s (MnEtpt/MxEtpt), with their ranks (the straggler "
               "warning does not need it)")
    straggler_minmax_count: int = setting(
        1, "with --log-straggler: the ranks reported at each end (the N slowest and N fastest)")
    disable_straggler_on_startup: bool = setting(
        False, "with --log-straggler: the report starts off (Megatron-LM turns it on through its "
               "--straggler-ctrlr-port, which this trainer does not have: the report then stays off)")
    wandb_project: str = setting("", "log to Weights & Biases (WANDB_MODE=offline works)")
    wandb_exp_name: str = setting("", "the run's name; required with --wandb-project")
    wandb_save_dir: str = setting("", "default: --save/wandb")


@dataclasses.dataclass(frozen=True)
class ProfilingSettings:
    TITLE: ClassVar[str] = "profiling"
    profile: bool = setting(
        False, "PyTorch profiler over steps --profile-step-start + 1 .. --profile-step-end: a trace in "
               "--tensorboard-dir (else --save/profile) and the top operators in the log")
    profile_step_start: int = setting(10, "with --profile: the step after which profiling starts")
    profile_step_end: int = setting(12, "with --profile: the last profiled step")
    profile_ranks: List[int] = setting([0], "with --profile: the global ranks that profile")
    pytorch_profiler_collect_callstack: bool = setting(
        False, "Python stacks in the trace (larger trace, slower profiled steps)")


@dataclasses.dataclass(frozen=True)
class Settings:
    """The run's settings by concern; `explicit`: the settings the user gave (on the command line or in --config);
    `from_checkpoint`: those taken from the args of the checkpoint the run starts from (its tokenizer; with
    --use-checkpoint-args its sequence length); the others took their defaults (the recipe's are reported at
    start-up)."""

    model: ModelSettings = dataclasses.field(default_factory=ModelSettings)
    precision: PrecisionSettings = dataclasses.field(default_factory=PrecisionSettings)
    parallel: ParallelSettings = dataclasses.field(default_factory=ParallelSettings)
    training: TrainingSettings = dataclasses.field(default_factory=TrainingSettings)
    data: DataSettings = dataclasses.field(default_factory=DataSettings)
    checkpoint: CheckpointSettings = dataclasses.field(default_factory=CheckpointSettings)
    faults: FaultSettings = dataclasses.field(default_factory=FaultSettings)
    evaluation: EvaluationSettings = dataclasses.field(default_factory=EvaluationSettings)
    logging: LoggingSettings = dataclasses.field(default_factory=LoggingSettings)
    profiling: ProfilingSettings = dataclasses.field(default_factory=ProfilingSettings)
    explicit: FrozenSet[str] = frozenset()
    from_checkpoint: FrozenSet[str] = frozenset()

    def sections(self) -> list:
        return [getattr(self, name) for name in SECTIONS]

    def as_dict(self) -> dict:
        """Every setting by its Megatron-LM name: what a checkpoint's args and the wandb config record."""
        return {f.name: getattr(section, f.name) for section in self.sections() for f in dataclasses.fields(section)}


SECTIONS = {f.name: f.default_factory for f in dataclasses.fields(Settings)
            if f.name not in ("explicit", "from_checkpoint")}


def declared_fields() -> Iterator[dataclasses.Field]:
    """Every setting's declaration, section by section."""
    for section in SECTIONS.values():
        yield from dataclasses.fields(section)
