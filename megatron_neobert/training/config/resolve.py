"""From the settings the user gave to the run's `Settings`: each derived default filled in once (--min-lr,
--lr-decay-iters, sample-based schedules, --bf16 and the layer implementation for this machine, ...), and every
combination that cannot run refused in one line, before anything is built."""

import contextlib
import dataclasses
import os
import tempfile
from typing import Dict, List, NamedTuple, Optional, Set, Tuple, Union

from megatron_neobert.data.tokenizer import (NULL_TOKENIZER, NULL_TOKENIZER_ROLES, null_tokenizer_model,
                                              resolve_tokenizer_flags)
from megatron_neobert.flags import defaults
from megatron_neobert.errors import InputError, refuse
from megatron_neobert.extras import require_extra
from megatron_neobert.training.config.schedule import DECAY_TO_THE_END, resolve_schedule
from megatron_neobert.defaults import LLAMA3_FAILURES_PER_GPU_DAY
from megatron_neobert.training.config.settings import (SECTIONS, DataSettings, FaultSettings, LoggingSettings,
                                                       ParallelSettings, PrecisionSettings, Settings, TrainingSettings,
                                                       declared_fields)

# TE's FP8 GEMMs need every dimension but the last a multiple of 8 and the last of 16; the token
# dimension of an activation is tokens per micro-batch, split over TP with sequence parallelism.
FP8_TOKEN_MULTIPLE = 16
FP8_MIN_CAPABILITY = (8, 9)  # Ada / Hopper: FP8 tensor cores
MXFP8_MIN_CAPABILITY = (10, 0)  # Blackwell: MXFP8 block scaling is done by the tensor cores


class Machine(NamedTuple):
    """What this rank runs on, as the settings are checked against it."""
    capability: Union[Tuple[int, int], bool]  # (major, minor) of this rank's GPU, False without one
    te_available: bool


@contextlib.contextmanager
def _as_input_error():
    """The data package's checks (ValueError), in the trainer's error type."""
    try:
        yield
    except ValueError as err:
        raise InputError(str(err)) from err


def resolve_settings(given: Dict[str, object], explicit: Set[str] = frozenset(),
                     gpu_capability: Optional[Union[Tuple[int, int], bool]] = None,
                     te_available: Optional[bool] = None, distributed_backend: Optional[str] = None,
                     from_checkpoint: Set[str] = frozenset()) -> Settings:
    """The run's settings: the declared defaults under `given` (settings by name), derived defaults resolved and
    checked. `explicit`: the settings the user gave (the others are reported as recipe defaults where they are).
    `gpu_capability` ((major, minor) of this rank's GPU, False without one) and `te_available` describe the
    machine (None: look them up); `distributed_backend`: Megatron-LM's flag, checked against it; `from_checkpoint`: the
    settings in `given` taken from the starting checkpoint's args (`starting_checkpoint.apply_checkpoint_args`).
    Each section is resolved on its own first, then the rules that span sections (`cross_section_rules`)."""
    values = {name: value for section in SECTIONS.values() for name, value in defaults(section).items()}
    unknown = set(given) - set(values)
    if unknown:
        raise InputError(f"unknown settings: {', '.join(sorted(unknown))}")
    values.update(given)
    machine = Machine(_detect_capability() if gpu_capability is None else gpu_capability,
                      _detect_te() if te_available is None else te_available)
    backend = "nccl" if machine.capability else "gloo"
    refuse(distributed_backend not in (None, backend), f"--distributed-backend {distributed_backend}: this machine "
            f"runs {backend} ({'GPUs' if backend == 'nccl' else 'no GPU'})")
    settings = Settings(**{name: section(**{f.name: values[f.name] for f in dataclasses.fields(section)})
                           for name, section in SECTIONS.items()},
                        explicit=frozenset(explicit), from_checkpoint=frozenset(from_checkpoint))
    _check_precision(settings.precision)
    _check_logging(settings.logging)
    _check_straggler(settings.faults)
    training = resolve_schedule(settings.training, explicit)
    _check_optimizer(training)
    data = _resolve_data(settings.data, explicit | from_checkpoint)
    parallel = _resolve_parallelism(settings.parallel)
    _check_save_folder(settings.checkpoint.save)
    _check_save_interval(settings.checkpoint)
    return cross_section_rules(dataclasses.replace(settings, training=training, data=data, parallel=parallel),
                               machine)


def _detect_capability() -> Union[Tuple[int, int], bool]:
    import torch  # here: the trainer's --help must not wait for it

    return torch.cuda.get_device_capability() if torch.cuda.is_available() else False


def _detect_te() -> bool:
    from megatron_neobert.kernels import transformer_engine_available

    return transformer_engine_available()


def _check_precision(precision: PrecisionSettings) -> None:
    refuse(precision.fp16 and precision.bf16, "--fp16 and --bf16 exclude each other")
    refuse(precision.fp16 and precision.fp8_format is not None, "--fp8-format runs with --bf16, not --fp16")


def _check_logging(logging: LoggingSettings) -> None:
    refuse(logging.tensorboard_log_interval < 1, "--tensorboard-log-interval must be at least 1")
    refuse(logging.straggler_minmax_count < 1, "--straggler-minmax-count must be at least 1")
    if logging.wandb_project:
        refuse(not logging.wandb_exp_name, "--wandb-project needs --wandb-exp-name (the run's name)")
        require_extra("wandb", "--wandb-project")


def _check_straggler(faults: FaultSettings) -> None:
    refuse(faults.straggler_threshold <= 1, f"--straggler-threshold {faults.straggler_threshold} must be above 1 (a "
                                            f"rank's time over the others' median)")
    refuse(faults.straggler_intervals < 1, "--straggler-intervals must be at least 1")
    refuse(faults.straggler_exit_intervals is not None and faults.straggler_exit_intervals < faults.straggler_intervals,
           f"--straggler-exit-intervals {faults.straggler_exit_intervals} must be at least --straggler-intervals "
           f"{faults.straggler_intervals}: a host is named before its part ends")


def _check_optimizer(training: TrainingSettings) -> None:
    """The ranges torch's Adam checks when the optimizer is built, on every rank, in a traceback."""
    for name in ("lr", "min_lr", "weight_decay", "adam_eps"):
        value = getattr(training, name)
        refuse(value < 0, f"--{name.replace('_', '-')} {value} must be at least 0")
    for name in ("adam_beta1", "adam_beta2"):
        value = getattr(training, name)
        refuse(not 0 <= value < 1, f"--{name.replace('_', '-')} {value} must be in [0, 1)")


def _resolve_data(data: DataSettings, explicit: Set[str]) -> DataSettings:
    """`data` with its tokenizer flags resolved, after one source of data is checked to be named."""
    per_split = [data.train_data_path, data.valid_data_path, data.test_data_path]
    # Megatron-LM's scripts pass --split in a block shared by mock and real data: accepted with --mock-data (the
    # start-up notes say it does not apply: megatron-core splits mock data 1,1,1).
    refuse("split" in explicit and any(per_split),
            "--split divides --data-path; --train/valid/test-data-path do not read it")
    if data.mock_data:
        refuse(data.data_path is not None or any(per_split), "--mock-data reads no files: drop --data-path "
                "and --train/valid/test-data-path")
    elif any(per_split):
        refuse(data.data_path is not None, "--data-path and --train/valid/test-data-path exclude each other")
        refuse(not data.train_data_path, "--valid/test-data-path need --train-data-path too")
    sources = {"--data-path": data.data_path, "--data-args-path": data.data_args_path,
               "--per-split-data-args-path": data.per_split_data_args_path,
               "--train-data-path": data.train_data_path, "--mock-data": data.mock_data or None}
    named = [flag for flag, value in sources.items() if value is not None]
    refuse(len(named) != 1, f"give exactly one of {', '.join(sources)} (got {', '.join(named) or 'none'}; see "
            f"tools/preprocess_data.py)")
    with _as_input_error():
        data = dataclasses.replace(data, **resolve_tokenizer_flags(
            {k: getattr(data, k) for k in ("tokenizer_type", "tokenizer_model", "vocab_file")}, explicit))
    if os.path.exists(data.tokenizer_model):
        # A local tokenizer is recorded by its absolute path in the checkpoint's args, so that the export and a
        # resume find it from any working directory.
        data = dataclasses.replace(data, tokenizer_model=os.path.abspath(data.tokenizer_model))
    return data


def _resolve_parallelism(parallel: ParallelSettings) -> ParallelSettings:
    refuse(parallel.overlap_param_gather and not parallel.use_distributed_optimizer,
            "--overlap-param-gather needs --use-distributed-optimizer")
    if parallel.sequence_parallel and parallel.tensor_model_parallel_size == 1:
        parallel = dataclasses.replace(parallel, sequence_parallel=False)  # as Megatron-LM: nothing to split
    return parallel


def _check_save_folder(save: Optional[str]) -> None:
    """--save can be written: a file made and removed in it, or in the nearest folder above it that exists (it is
    made at the start), so that a run refused here leaves nothing behind. Each rank's probe has its own name."""
    if not save:
        return
    existing = os.path.abspath(save)
    while not os.path.exists(existing):
        existing = os.path.dirname(existing)
    refuse(not os.path.isdir(existing), f"--save {save}: {existing} is a file, not a folder")
    try:
        fd, probe = tempfile.mkstemp(dir=existing, prefix=".neobert-write-check-")
    except OSError as err:
        raise InputError(f"--save {save}: cannot write in {existing} ({err.strerror}); save elsewhere") from None
    os.close(fd)
    os.remove(probe)


def _check_save_interval(checkpoint) -> None:
    interval, rate = checkpoint.save_interval, checkpoint.failure_rate_per_gpu_day
    refuse(interval != "auto" and interval is not None and interval <= 0,
           f"--save-interval {interval}: give a number of iterations above 0, or auto")
    refuse(interval == "auto" and not checkpoint.save, "--save-interval auto chooses when to save to --save: give it")
    refuse(not rate > 0, f"--failure-rate-per-gpu-day {rate}: give a rate above 0 (Llama 3's was "
                         f"{LLAMA3_FAILURES_PER_GPU_DAY:.1e})")


def cross_section_rules(settings: Settings, machine: Machine) -> Settings:
    """The rules that span sections, on sections each resolved on its own: the NullTokenizer's vocabulary (data and
    model), where wandb and the profiler write (logging, profiling and checkpoints), the profiled steps within the
    run, and the precision and layers this machine runs (precision, model, and for FP8 the tokens per micro-batch:
    training, data, parallelism)."""
    settings = _resolve_null_tokenizer(settings)
    logging, profiling, save = settings.logging, settings.profiling, settings.checkpoint.save
    refuse(bool(logging.wandb_project) and not (logging.wandb_save_dir or save), "--wandb-project writes into "
            "--wandb-save-dir, else --save/wandb: give one of them")
    if profiling.profile:
        start, end, iters = profiling.profile_step_start, profiling.profile_step_end, settings.training.train_iters
        refuse(not 0 <= start < end <= iters, f"--profile-step-start {start} and --profile-step-end {end} must "
                f"satisfy 0 <= start < end <= --train-iters {iters}")
        refuse(not (logging.tensorboard_dir or save),
                "--profile writes its trace to --tensorboard-dir, else to --save/profile: give one of them")
    settings = _resolve_precision(settings, machine)
    _check_fp8_tokens(settings)
    return settings


def _resolve_null_tokenizer(settings: Settings) -> Settings:
    """Megatron-LM's `--tokenizer-type NullTokenizer --vocab-size N`: --vocab-size is the tokenizer's (the data's ids
    0 .. N-1), which `null_tokenizer_model` describes with the MLM's special ids; the model's vocabulary is then the
    tokenizer's, as for every other tokenizer."""
    data, vocab_size = settings.data, settings.model.vocab_size
    id_flags = [f"null_tokenizer_{role}_id" for role in NULL_TOKENIZER_ROLES]
    if data.tokenizer_type != NULL_TOKENIZER:
        given = [f"--{name.replace('_', '-')}" for name in id_flags if getattr(data, name) is not None]
        refuse(bool(given), f"{', '.join(given)}: only with --tokenizer-type NullTokenizer")
        return settings
    refuse("tokenizer_model" in settings.explicit | settings.from_checkpoint, "--tokenizer-type NullTokenizer takes "
            "the data's ids as they are and reads no --tokenizer-model: give --vocab-size")
    refuse(vocab_size is None, "--tokenizer-type NullTokenizer needs --vocab-size: the data's ids are 0 .. vocab "
            "size - 1 (as Megatron-LM's)")
    with _as_input_error():
        model = null_tokenizer_model(vocab_size, {role: getattr(data, name)
                                                  for role, name in zip(NULL_TOKENIZER_ROLES, id_flags)})
    return dataclasses.replace(settings, data=dataclasses.replace(data, tokenizer_model=model),
                               model=dataclasses.replace(settings.model, vocab_size=None))


def _resolve_precision(settings: Settings, machine: Machine) -> Settings:
    """--bf16 when not given (on for a GPU, off on a CPU) and the layer implementation for this machine, decided
    here once; precision combinations that cannot run on this machine are refused."""
    from megatron_neobert.kernels import choose_transformer_impl

    capability, te = machine
    on_gpu = bool(capability)
    precision = settings.precision
    if precision.bf16 is None:
        # the recipe trains in bf16; fp32 (--no-bf16) is for debugging
        precision = dataclasses.replace(precision, bf16=on_gpu and not precision.fp16)
    requested, backend = settings.model.transformer_impl, settings.model.attention_backend
    if backend == "local":  # Megatron-LM's: megatron-core's own layers, no TE kernel
        refuse(requested == "transformer_engine", "--attention-backend local runs megatron-core's local layers: "
                "not with --transformer-impl transformer_engine")
        requested = "local"
    refuse(requested == "transformer_engine" and not te,
            "--transformer-impl transformer_engine: Transformer Engine does not import here")
    impl = choose_transformer_impl(requested, on_gpu, te)
    uses_te = impl == "transformer_engine"
    refuse(backend in ("flash", "fused", "unfused") and not uses_te,
            f"--attention-backend {backend} picks a Transformer Engine attention kernel, and the layers here are "
            f"megatron-core's local ones (--transformer-impl {requested}, Transformer Engine "
            f"{'on a CPU' if te else 'absent'}): use --attention-backend auto or local")
    refuse(uses_te and settings.data.packed and not (precision.bf16 or precision.fp16),
            "Transformer Engine attention has no fp32 kernel for packed (THD) input: pass --bf16 (or --fp16), or "
            "--no-packed, or --transformer-impl local")
    fp8 = precision.fp8_format
    if fp8 is not None:
        refuse(not te, f"--fp8-format {fp8} needs Transformer Engine, which does not import here; drop --fp8-format")
        refuse(not uses_te, f"--fp8-format {fp8} runs in Transformer Engine layers: use --transformer-impl "
                f"transformer_engine (or auto on a GPU), not {requested}")
        refuse(not precision.bf16, f"--fp8-format {fp8} needs --bf16 (FP8 GEMMs in bf16 layers)")
        refuse(on_gpu and tuple(capability) < FP8_MIN_CAPABILITY, f"--fp8-format {fp8}: this GPU (compute "
                f"capability {capability[0]}.{capability[1]}) has no FP8 tensor cores (needs >= 8.9)")
        refuse(precision.fp8_recipe == "mxfp8" and on_gpu and tuple(capability) < MXFP8_MIN_CAPABILITY,
                f"--fp8-recipe mxfp8 needs a Blackwell GPU (compute capability >= 10.0), this one is "
                f"{capability[0]}.{capability[1]}: use --fp8-recipe delayed or tensorwise")
    return dataclasses.replace(settings, precision=precision,
                               model=dataclasses.replace(settings.model, transformer_impl=impl))


def _check_fp8_tokens(settings: Settings) -> None:
    """With --fp8-format, the tokens of a micro-batch on each rank a multiple of FP8_TOKEN_MULTIPLE."""
    if settings.precision.fp8_format is None:
        return
    mbs, seq_length = settings.training.micro_batch_size, settings.data.seq_length
    tp, sp = settings.parallel.tensor_model_parallel_size, settings.parallel.sequence_parallel
    tokens = mbs * seq_length
    per_rank = tokens // tp if sp else tokens
    if (sp and tokens % tp) or per_rank % FP8_TOKEN_MULTIPLE:
        split = f" / --tensor-model-parallel-size {tp} (sequence parallel)" if sp else ""
        raise InputError(f"--fp8-format: tokens per micro-batch (--micro-batch-size {mbs} x --seq-length "
                         f"{seq_length}{split} = {tokens / (tp if sp else 1):g}) must be a multiple of "
                         f"{FP8_TOKEN_MULTIPLE}")


def recipe_defaults_applied(settings: Settings) -> List[str]:
    """The recipe defaults the user left in place, with their final values, for the start-up report."""
    training, data = settings.training, settings.data
    skip = ({"lr_decay_iters", "lr_warmup_iters", "train_iters"} if training.train_samples is not None
            else {"lr_decay_samples", "lr_warmup_samples"})
    if training.lr_warmup_fraction is not None:
        skip |= {"lr_warmup_iters", "lr_warmup_samples"}
    if training.lr_decay_style in DECAY_TO_THE_END:  # the decay ends with the run, as Megatron-LM's
        skip |= {"lr_decay_iters", "lr_decay_samples"}
    if data.mock_data or data.train_data_path:
        skip.add("split")
    skip |= settings.from_checkpoint
    values = settings.as_dict()
    return [f"--{f.name.replace('_', '-')} {values[f.name]} (Megatron-LM's default: {f.metadata['megatron_default']})"
            for f in declared_fields() if f.metadata.get("megatron_default") is not None
            and f.name not in settings.explicit and f.name not in skip]
