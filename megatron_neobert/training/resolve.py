"""From the settings the user gave to the run's `Settings`: each derived default filled in once (--min-lr,
--lr-decay-iters, sample-based schedules, --bf16 and the layer implementation for this machine, ...), and every
combination that cannot run refused in one line, before anything is built."""

import dataclasses
import importlib.util
import os
import tempfile
from typing import Dict, List, Optional, Set, Tuple, Union

from megatron_neobert.data.tokenizer import (NULL_TOKENIZER, NULL_TOKENIZER_ROLES, null_tokenizer_model,
                                              resolve_tokenizer_flags)
from megatron_neobert.flags import defaults
from megatron_neobert.errors import InputError
from megatron_neobert.training.schedule import DECAY_TO_THE_END, resolve_schedule
from megatron_neobert.training.settings import SECTIONS, Settings, declared_fields

# TE's FP8 GEMMs need every dimension but the last a multiple of 8 and the last of 16; the token
# dimension of an activation is tokens per micro-batch, split over TP with sequence parallelism.
FP8_TOKEN_MULTIPLE = 16
FP8_MIN_CAPABILITY = (8, 9)  # Ada / Hopper: FP8 tensor cores
MXFP8_MIN_CAPABILITY = (10, 0)  # Blackwell: MXFP8 block scaling is done by the tensor cores


def _refuse(condition: bool, message: str) -> None:
    if condition:
        raise InputError(message)


def resolve_settings(given: Dict[str, object], explicit: Set[str] = frozenset(),
                     gpu_capability: Optional[Union[Tuple[int, int], bool]] = None,
                     te_available: Optional[bool] = None, distributed_backend: Optional[str] = None,
                     from_checkpoint: Set[str] = frozenset()) -> Settings:
    """The run's settings: the declared defaults under `given` (settings by name), derived defaults resolved and
    checked. `explicit`: the settings the user gave (the others are reported as recipe defaults where they are).
    `gpu_capability` ((major, minor) of this rank's GPU, False without one) and `te_available` describe the
    machine (None: look them up); `distributed_backend`: Megatron-LM's flag, checked against it; `from_checkpoint`: the
    settings in `given` taken from the starting checkpoint's args (`starting_checkpoint.apply_checkpoint_args`)."""
    values = {name: value for section in SECTIONS.values() for name, value in defaults(section).items()}
    unknown = set(given) - set(values)
    if unknown:
        raise InputError(f"unknown settings: {', '.join(sorted(unknown))}")
    values.update(given)
    capability = _detect_capability() if gpu_capability is None else gpu_capability
    te = _detect_te() if te_available is None else te_available
    backend = "nccl" if capability else "gloo"
    _refuse(distributed_backend not in (None, backend), f"--distributed-backend {distributed_backend}: this machine "
            f"runs {backend} ({'GPUs' if backend == 'nccl' else 'no GPU'})")
    _refuse(values["fp16"] and values["bf16"], "--fp16 and --bf16 exclude each other")
    _refuse(values["fp16"] and values["fp8_format"] is not None, "--fp8-format runs with --bf16, not --fp16")
    _refuse(values["tensorboard_log_interval"] < 1, "--tensorboard-log-interval must be at least 1")
    training = SECTIONS["training"](**{f.name: values[f.name] for f in dataclasses.fields(SECTIONS["training"])})
    values.update(dataclasses.asdict(resolve_schedule(training, explicit)))
    _check_optimizer(values)
    _resolve_data(values, explicit | from_checkpoint)
    _check_logging(values)
    _resolve_parallelism(values)
    _check_profiling(values)
    _check_save_folder(values["save"])
    _resolve_precision(values, capability, te)
    sections = {name: section(**{f.name: values[f.name] for f in dataclasses.fields(section)})
                for name, section in SECTIONS.items()}
    return Settings(**sections, explicit=frozenset(explicit), from_checkpoint=frozenset(from_checkpoint))


def _detect_capability() -> Union[Tuple[int, int], bool]:
    import torch  # here: the trainer's --help must not wait for it

    return torch.cuda.get_device_capability() if torch.cuda.is_available() else False


def _detect_te() -> bool:
    from megatron_neobert.kernels import transformer_engine_available

    return transformer_engine_available()


def _resolve_data(values: dict, explicit: Set[str]) -> None:
    per_split = [values["train_data_path"], values["valid_data_path"], values["test_data_path"]]
    # Megatron-LM's scripts pass --split in a block shared by mock and real data: accepted with --mock-data (the
    # start-up notes say it does not apply: megatron-core splits mock data 1,1,1).
    _refuse("split" in explicit and any(per_split),
            "--split divides --data-path; --train/valid/test-data-path do not read it")
    if values["mock_data"]:
        _refuse(values["data_path"] is not None or any(per_split), "--mock-data reads no files: drop --data-path "
                "and --train/valid/test-data-path")
    elif any(per_split):
        _refuse(values["data_path"] is not None, "--data-path and --train/valid/test-data-path exclude each other")
        _refuse(not values["train_data_path"], "--valid/test-data-path need --train-data-path too")
    sources = {"--data-path": values["data_path"], "--data-args-path": values["data_args_path"],
               "--per-split-data-args-path": values["per_split_data_args_path"],
               "--train-data-path": values["train_data_path"], "--mock-data": values["mock_data"] or None}
    named = [flag for flag, value in sources.items() if value is not None]
    _refuse(len(named) != 1, f"give exactly one of {', '.join(sources)} (got {', '.join(named) or 'none'}; see "
            f"tools/preprocess_data.py)")
    try:
        values.update(resolve_tokenizer_flags({k: values[k] for k in ("tokenizer_type", "tokenizer_model",
                                                                        "vocab_file")}, explicit))
        _resolve_null_tokenizer(values, explicit)
    except ValueError as err:  # the data package's checks, in the trainer's error type
        raise InputError(str(err)) from err
    if os.path.exists(values["tokenizer_model"]):
        # A local tokenizer is recorded by its absolute path in the checkpoint's args, so that the export and a
        # resume find it from any working directory.
        values["tokenizer_model"] = os.path.abspath(values["tokenizer_model"])


def _resolve_null_tokenizer(values: dict, explicit: Set[str]) -> None:
    """Megatron-LM's `--tokenizer-type NullTokenizer --vocab-size N`: --vocab-size is the tokenizer's (the data's ids
    0 .. N-1), which `null_tokenizer_model` describes with the MLM's special ids; the model's vocabulary is then the
    tokenizer's, as for every other tokenizer."""
    id_flags = [f"null_tokenizer_{role}_id" for role in NULL_TOKENIZER_ROLES]
    if values["tokenizer_type"] != NULL_TOKENIZER:
        given = [f"--{name.replace('_', '-')}" for name in id_flags if values[name] is not None]
        _refuse(bool(given), f"{', '.join(given)}: only with --tokenizer-type NullTokenizer")
        return
    _refuse("tokenizer_model" in explicit, "--tokenizer-type NullTokenizer takes the data's ids as they are and "
            "reads no --tokenizer-model: give --vocab-size")
    _refuse(values["vocab_size"] is None, "--tokenizer-type NullTokenizer needs --vocab-size: the data's ids are "
            "0 .. vocab size - 1 (as Megatron-LM's)")
    values["tokenizer_model"] = null_tokenizer_model(
        values["vocab_size"], {role: values[name] for role, name in zip(NULL_TOKENIZER_ROLES, id_flags)})
    values["vocab_size"] = None


def _check_optimizer(values: dict) -> None:
    """The ranges torch's Adam checks when the optimizer is built, on every rank, in a traceback."""
    for name in ("lr", "min_lr", "weight_decay", "adam_eps"):
        _refuse(values[name] < 0, f"--{name.replace('_', '-')} {values[name]} must be at least 0")
    for name in ("adam_beta1", "adam_beta2"):
        _refuse(not 0 <= values[name] < 1, f"--{name.replace('_', '-')} {values[name]} must be in [0, 1)")


def _check_save_folder(save: Optional[str]) -> None:
    """--save can be written: a file made and removed in it, or in the nearest folder above it that exists (it is
    made at the start), so that a run refused here leaves nothing behind. Each rank's probe has its own name."""
    if not save:
        return
    existing = os.path.abspath(save)
    while not os.path.exists(existing):
        existing = os.path.dirname(existing)
    _refuse(not os.path.isdir(existing), f"--save {save}: {existing} is a file, not a folder")
    try:
        fd, probe = tempfile.mkstemp(dir=existing, prefix=".neobert-write-check-")
    except OSError as err:
        raise InputError(f"--save {save}: cannot write in {existing} ({err.strerror}); save elsewhere") from None
    os.close(fd)
    os.remove(probe)


def _check_logging(values: dict) -> None:
    if values["wandb_project"]:
        _refuse(not values["wandb_exp_name"], "--wandb-project needs --wandb-exp-name (the run's name)")
        _refuse(importlib.util.find_spec("wandb") is None,
                "--wandb-project needs the wandb package: pip install wandb (or this package's wandb extra)")
        _refuse(not (values["wandb_save_dir"] or values["save"]), "--wandb-project writes into --wandb-save-dir, "
                "else --save/wandb: give one of them")


def _resolve_parallelism(values: dict) -> None:
    _refuse(values["overlap_param_gather"] and not values["use_distributed_optimizer"],
            "--overlap-param-gather needs --use-distributed-optimizer")
    if values["sequence_parallel"] and values["tensor_model_parallel_size"] == 1:
        values["sequence_parallel"] = False  # as Megatron-LM: nothing to split


def _check_profiling(values: dict) -> None:
    if not values["profile"]:
        return
    start, end = values["profile_step_start"], values["profile_step_end"]
    _refuse(not 0 <= start < end <= values["train_iters"], f"--profile-step-start {start} and --profile-step-end "
            f"{end} must satisfy 0 <= start < end <= --train-iters {values['train_iters']}")
    _refuse(not (values["tensorboard_dir"] or values["save"]),
            "--profile writes its trace to --tensorboard-dir, else to --save/profile: give one of them")


def _resolve_precision(values: dict, capability, te: bool) -> None:
    """--bf16 when not given (on for a GPU, off on a CPU) and the layer implementation for this machine, decided
    here once; precision combinations that cannot run on this machine are refused."""
    from megatron_neobert.kernels import choose_transformer_impl

    on_gpu = bool(capability)
    if values["bf16"] is None:
        values["bf16"] = on_gpu and not values["fp16"]  # the recipe trains in bf16; fp32 (--no-bf16) is for debugging
    requested, backend = values["transformer_impl"], values["attention_backend"]
    if backend == "local":  # Megatron-LM's: megatron-core's own layers, no TE kernel
        _refuse(requested == "transformer_engine", "--attention-backend local runs megatron-core's local layers: "
                "not with --transformer-impl transformer_engine")
        requested = "local"
    _refuse(requested == "transformer_engine" and not te,
            "--transformer-impl transformer_engine: Transformer Engine does not import here")
    values["transformer_impl"] = impl = choose_transformer_impl(requested, on_gpu, te)
    uses_te = impl == "transformer_engine"
    _refuse(backend in ("flash", "fused", "unfused") and not uses_te,
            f"--attention-backend {backend} picks a Transformer Engine attention kernel, and the layers here are "
            f"megatron-core's local ones (--transformer-impl {requested}, Transformer Engine "
            f"{'on a CPU' if te else 'absent'}): use --attention-backend auto or local")
    _refuse(uses_te and values["packed"] and not (values["bf16"] or values["fp16"]),
            "Transformer Engine attention has no fp32 kernel for packed (THD) input: pass --bf16 (or --fp16), or "
            "--no-packed, or --transformer-impl local")
    fp8 = values["fp8_format"]
    if fp8 is None:
        return
    _refuse(not te, f"--fp8-format {fp8} needs Transformer Engine, which does not import here; drop --fp8-format")
    _refuse(not uses_te, f"--fp8-format {fp8} runs in Transformer Engine layers: use --transformer-impl "
            f"transformer_engine (or auto on a GPU), not {requested}")
    _refuse(not values["bf16"], f"--fp8-format {fp8} needs --bf16 (FP8 GEMMs in bf16 layers)")
    _refuse(on_gpu and tuple(capability) < FP8_MIN_CAPABILITY, f"--fp8-format {fp8}: this GPU (compute "
            f"capability {capability[0]}.{capability[1]}) has no FP8 tensor cores (needs >= 8.9)")
    _refuse(values["fp8_recipe"] == "mxfp8" and on_gpu and tuple(capability) < MXFP8_MIN_CAPABILITY,
            f"--fp8-recipe mxfp8 needs a Blackwell GPU (compute capability >= 10.0), this one is "
            f"{capability[0]}.{capability[1]}: use --fp8-recipe delayed or tensorwise")
    tokens, tp, sp = values["micro_batch_size"] * values["seq_length"], values["tensor_model_parallel_size"], \
        values["sequence_parallel"]
    per_rank = tokens // tp if sp else tokens
    if (sp and tokens % tp) or per_rank % FP8_TOKEN_MULTIPLE:
        split = f" / --tensor-model-parallel-size {tp} (sequence parallel)" if sp else ""
        raise InputError(f"--fp8-format: tokens per micro-batch (--micro-batch-size {values['micro_batch_size']} x "
                         f"--seq-length {values['seq_length']}{split} = {tokens / (tp if sp else 1):g}) must be a "
                         f"multiple of {FP8_TOKEN_MULTIPLE}")


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
