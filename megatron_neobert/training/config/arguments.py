"""The pre-training command line, generated from the settings' declarations, with Megatron-LM's spellings, meanings
and defaults.

Defaults reproduce NeoBERT's recipe: AdamW (0.9, 0.95, 1e-8), weight decay 0.1, gradient clipping 1.0, 2,000
warmup steps to 6e-4, cosine decay to 10% of the peak over 90% of the steps then constant, 20% masking all replaced
by [MASK], 1024 tokens, 2M tokens per step. A `--config` YAML file holds the same settings (keys are flag names,
with - or _); flags given on the command line override it.

argv -> the values given (command line over --config) -> the args of the checkpoint the run starts from
(`starting_checkpoint`: its tokenizer, and with --use-checkpoint-args its shape and length) -> the Megatron-LM adapter
(`MegatronLMFlags`: aliases map onto settings, flags that choose nothing are checked and dropped) ->
`resolve.resolve_settings` -> `Settings`.
"""

import argparse
import dataclasses
from typing import ClassVar, Dict, Optional, Sequence, Set, Tuple

import yaml

from megatron_neobert.flags import ArgumentParser, add_flags, closest, convert_value, parse_given, setting
from megatron_neobert.model.config import PRESETS, NeoBERTArch, get_arch
from megatron_neobert.errors import InputError, refuse
from megatron_neobert.training.config.resolve import resolve_settings
from megatron_neobert.training.config.settings import SECTIONS, Settings
from megatron_neobert.training.config.starting_checkpoint import apply_checkpoint_args, starting_checkpoint

CKPT_FORMATS = ("torch_dist", "torch", "torch_dcp", "zarr", "fsdp_dtensor")


@dataclasses.dataclass(frozen=True)
class MegatronLMFlags:
    """Megatron-LM's flags that choose nothing here: aliases of settings, flags accepted for what is always so, and
    values refused where Megatron-LM's feature is not implemented. `adapt` checks them and maps the aliases; none of
    them is a setting of the run."""

    TITLE: ClassVar[str] = "Megatron-LM's flags that NeoBERT's recipe fixes"
    position_embedding_type: Optional[str] = setting(
        None, "must be the preset's (rope; learned_absolute: ablation-m0)", choices=["learned_absolute", "rope"])
    normalization: Optional[str] = setting(
        None, "must be the preset's (RMSNorm; LayerNorm: ablation-m0)", choices=["LayerNorm", "RMSNorm"])
    swiglu: bool = setting(False, "must agree with the preset (SwiGLU but ablation-m0)")
    untie_embeddings_and_output_weights: bool = setting(
        False, "accepted: the MLM decoder is never tied to the embedding")
    bert_no_binary_head: bool = setting(False, "accepted: NeoBERT has no binary (next-sentence) head")
    recompute_activations: bool = setting(False, "selective recomputation (= --recompute-granularity selective)")
    mask_prob: Optional[float] = setting(None, "Megatron-LM's name of --mask-rate")
    short_seq_prob: float = setting(
        0.0, "0 only: documents are packed whole up to --seq-length, never cut short on purpose")
    legacy_tokenizer: bool = setting(
        False, "accepted: the BertWordPiece tokenizers here give Megatron-LM's legacy tokenizers' ids")
    dataloader_type: str = setting(
        "single", "single only: one pass over the dataset's own shuffled sample order, resumable by consumed samples",
        choices=["single", "cyclic", "external"])
    use_checkpoint_opt_param_scheduler: bool = setting(
        False, "the schedule of the loaded checkpoint wins over the flags: always so here unless "
               "--override-opt-param-scheduler")
    ckpt_format: str = setting("torch_dist", "checkpoint format; torch_dist (megatron-core distributed checkpoint) "
                                             "only")
    auto_detect_ckpt_format: bool = setting(
        False, "accepted: checkpoints are read as torch_dist, and another format is refused by name")
    ckpt_fully_parallel_save: bool = setting(False, "accepted: data-parallel ranks always share the writing")
    distributed_backend: Optional[str] = setting(
        None, "nccl on GPUs, gloo on CPU; the other one is refused", choices=["nccl", "gloo"])
    timing_log_level: int = setting(
        0, "0 only: Megatron-LM's per-phase timers are not implemented (--profile traces the steps)", choices=[0, 1, 2])


ADAPTER_FLAGS = {f.name for f in dataclasses.fields(MegatronLMFlags)}


@dataclasses.dataclass(frozen=True)
class ConfigFile:
    config: Optional[str] = setting(None, "YAML file of settings (flag names as keys); flags override it")


def build_parser(prog: str = "neobert-pretrain", description: str = "Pre-train NeoBERT with megatron-core.",
                 shown: Optional[Set[str]] = None, epilog: Optional[str] = None) -> argparse.ArgumentParser:
    """The trainer's command line. A tool that reads a part of the settings from the training command (`shown`:
    their names) takes every flag of it, and its --help lists only those."""
    # The shared parser refuses abbreviations: Megatron-LM's --exit-signal must not be read as a prefix of another.
    p = ArgumentParser(prog=prog, description=description, epilog=epilog,
                       error_class=InputError)  # one line, on rank 0, in place of the usage on every rank
    add_flags(p, ConfigFile)
    for section in SECTIONS.values():
        add_flags(p.add_argument_group(section.TITLE), section)
    add_flags(p.add_argument_group(MegatronLMFlags.TITLE), MegatronLMFlags)
    if shown is not None:
        for action in p._actions:
            if action.dest not in shown | {"help", "config"}:
                action.help = argparse.SUPPRESS
    return p


def _config_file_values(parser: argparse.ArgumentParser, path: str) -> Dict[str, object]:
    try:
        with open(path) as f:
            loaded = yaml.safe_load(f) or {}
    except (OSError, yaml.YAMLError) as err:
        raise InputError(f"--config {path}: {err}") from err
    if not isinstance(loaded, dict):
        raise InputError(f"--config {path}: a mapping of flag names to values, not a {type(loaded).__name__}")
    known = {a.dest for a in parser._actions} - {"help", "config"}
    values = {}
    for key, value in loaded.items():
        dest = str(key).replace("-", "_")
        if dest not in known:
            meant = closest(dest, known)
            hint = f" (did you mean {meant[0].replace('_', '-')}?)" if meant else ""
            raise InputError(f"{path}: unknown setting {key!r}{hint}")
        try:
            values[dest] = convert_value(parser, dest, value)
        except ValueError as err:
            raise InputError(f"{path}: {key}: {err}") from err
    return values


def given_values(argv: Optional[Sequence[str]] = None,
                 parser: Optional[argparse.ArgumentParser] = None) -> Dict[str, object]:
    """What the command line and its --config file give (the command line wins), and nothing else."""
    parser = parser or build_parser()
    given = parse_given(parser, argv)
    config = given.pop("config", None)
    return {**(_config_file_values(parser, config) if config else {}), **given}


def adapt(given: Dict[str, object], checkpoint_arch: Optional[dict] = None) -> Tuple[Dict[str, object], Set[str]]:
    """(the settings' values the user gave, Megatron-LM's aliases mapped onto them; their names): the adapter's
    own flags are checked here, against the preset's architecture or with --use-checkpoint-args `checkpoint_arch`,
    and go no further."""
    flags = MegatronLMFlags(**{k: v for k, v in given.items() if k in ADAPTER_FLAGS})
    values = {k: v for k, v in given.items() if k not in ADAPTER_FLAGS}
    refuse(flags.ckpt_format != "torch_dist",
            f"--ckpt-format {flags.ckpt_format}: only torch_dist is written and read (megatron-core's distributed "
            f"checkpoint, loadable at any TP/PP/DP); Megatron-LM's other formats ({', '.join(CKPT_FORMATS[1:])}) "
            f"are not implemented here")
    refuse(flags.dataloader_type != "single", f"--dataloader-type {flags.dataloader_type}: only single is "
            "implemented (one pass in the dataset's own shuffled order, resumable by consumed samples)")
    refuse(flags.short_seq_prob != 0, f"--short-seq-prob {flags.short_seq_prob}: documents are packed whole up to "
            "--seq-length; Megatron-LM's short-sequence sampling is not implemented (drop the flag)")
    refuse(flags.timing_log_level != 0, f"--timing-log-level {flags.timing_log_level}: Megatron-LM's per-phase "
            "timers are not implemented; --profile writes a trace of the steps instead")
    refuse(flags.use_checkpoint_opt_param_scheduler and values.get("override_opt_param_scheduler", False),
            "--use-checkpoint-opt_param-scheduler and --override-opt-param-scheduler exclude each other")
    if flags.mask_prob is not None:
        refuse("mask_rate" in values, "--mask-prob is Megatron-LM's name of --mask-rate: give one of them")
        values["mask_rate"] = flags.mask_prob
    if flags.recompute_activations:
        refuse(values.get("recompute_granularity") == "full",
                "--recompute-activations means --recompute-granularity selective; not with full")
        values["recompute_granularity"] = "selective"
    _check_architecture_flags(flags, values.get("model_preset", SECTIONS["model"]().model_preset), checkpoint_arch)
    return values, set(values)


def _check_architecture_flags(flags: MegatronLMFlags, preset_name: str, checkpoint_arch: Optional[dict]) -> None:
    """Megatron-LM's architecture flags choose no architecture here (the preset does, or the checkpoint's record):
    each one given must agree with it, or the error names the presets that have what it asks for."""
    arch = NeoBERTArch(**checkpoint_arch) if checkpoint_arch else get_arch(preset_name)
    source = "the checkpoint's model (--use-checkpoint-args)" if checkpoint_arch else f"the {preset_name} preset"
    asked = {"position_embedding_type": flags.position_embedding_type, "normalization": flags.normalization,
             "activation": "swiglu" if flags.swiglu else None}
    for field, value in asked.items():
        if value is None or getattr(arch, field) == value:
            continue
        flag = {"activation": "--swiglu"}.get(field, f"--{field.replace('_', '-')} {value}")
        having = [name for name, preset in PRESETS.items() if getattr(preset, field) == value]
        raise InputError(f"{flag}: {source} has {field} {getattr(arch, field)}; "
                         f"--model-preset {' or '.join(having)} has {value}")


def parse_settings(argv: Optional[Sequence[str]] = None, gpu_capability=None, te_available=None,
                   parser: Optional[argparse.ArgumentParser] = None) -> Settings:
    """The run's settings from its command line (`parser`: a tool's `build_parser`), checked. `gpu_capability`
    ((major, minor) of this rank's GPU, False without one) and `te_available` describe the machine; None: look them
    up."""
    given = given_values(argv, parser)
    found = starting_checkpoint(given)  # before any check, as Megatron-LM's load_args_from_checkpoint
    use_arch = given.get("use_checkpoint_args") and found is not None
    values, explicit = adapt(given, found[1]["arch"] if use_arch else None)
    from_checkpoint = apply_checkpoint_args(values, explicit, found)
    return resolve_settings(values, explicit, gpu_capability=gpu_capability, te_available=te_available,
                            distributed_backend=given.get("distributed_backend"), from_checkpoint=from_checkpoint)

