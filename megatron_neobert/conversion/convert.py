"""Checkpoint conversion between megatron-core distributed checkpoints and Hugging Face folders.

Megatron -> HF: the checkpoint's common state names the architecture ("args"/"arch"); a TP=1/PP=1
model of it is built on this single process and the model tensors alone are loaded (a
distributed checkpoint reshards on load, so any TP/PP/VPP layout works and optimizer state is
never read). Its `state_dict()` is mapped to the published key names and written with
`write_hf_folder`.

HF -> Megatron: the HF weights go into a TP=1/PP=1 model here, which is saved as a staging
distributed checkpoint; then TP x PP gloo (or NCCL) ranks build the target layout, load the
staging checkpoint (megatron-core does the resharding, as the trainer's `--load` would) and save
it again from that layout, with the trainer's common "args" (at TP=1/PP=1 the model here is saved as the
target, with them). Everything is written inside a
temporary sibling of the target, renamed at the end.

Both directions map the state dicts with `state_dict_mapping.py` (names, vocabulary padding, and each head's
q and k rows, which megatron-core stores in rotate-half RoPE order; round trips are bit-exact).

Both directions check everything they can (checkpoint layout, architecture, vocabulary, shards,
preset) before writing anything.
"""

import contextlib
import dataclasses
import logging
import os
import shutil
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Dict, Optional, Tuple, Union

import torch

from megatron_neobert.conversion import shape_bridge
from megatron_neobert.atomic_write import atomic_path
from megatron_neobert.conversion.hf_format import TOKENIZER_FILES, read_hf_folder, write_hf_folder
from megatron_neobert.conversion.state_dict_mapping import hf_state_dict_from_mcore, mcore_state_dict_from_hf
from megatron_neobert.defaults import CONVERSION_DTYPES, torch_dtypes
from megatron_neobert.model import (PRESETS, VOCAB_PADDING_MULTIPLE, NeoBERTArch, get_arch, padded_vocab_size,
                                    parallel_shape_problems)
from megatron_neobert.model_source import check_model_source
from megatron_neobert.progress import progress_bar
from megatron_neobert.checkpoint.layout import iteration_dir, resolve_checkpoint_dir, write_latest_marker
from megatron_neobert.checkpoint.state import (CHECKPOINT_VERSION, checkpoint_args, load_model_state,
                                                        megatron_deprecations_hidden, megatron_lm_args,
                                                        model_sharded_state_dict, read_common_state)
from megatron_neobert.errors import TrainingError, one_line_each

logger = logging.getLogger(__name__)

PathLike = Union[str, os.PathLike]
DTYPES = torch_dtypes(CONVERSION_DTYPES)
HF_TOKENIZER_TYPE = "HuggingFaceTokenizer"
# Files an HF -> Megatron conversion downloads from the hub (weights in either format, config,
# tokenizer); the published repo also holds remote code we do not need.
_HUB_PATTERNS = ["config.json", "*.safetensors", "*.safetensors.index.json", "pytorch_model*.bin",
                 "pytorch_model.bin.index.json", *TOKENIZER_FILES]


class ConversionError(ValueError):
    """The input cannot be converted; the message names what is wrong. Nothing was written."""


@dataclass
class ConversionSummary:
    direction: str
    path: str
    tensors: int
    parameters: int
    dtype: str
    bytes_on_disk: int
    layout: str = ""

    def __str__(self) -> str:
        layout = f" ({self.layout})" if self.layout else ""
        return (f"{self.direction}: wrote {self.path}{layout}: {self.tensors} tensors, "
                f"{self.parameters:,} parameters, {self.dtype}, {self.bytes_on_disk / 2**20:.1f} MiB on disk")


# --------------------------------------------------------------------------------------------------
# Architecture <-> HF config
# --------------------------------------------------------------------------------------------------


def check_convertible(arch: NeoBERTArch) -> None:
    """Only the NeoBERT block (RoPE, SwiGLU, RMSNorm, no biases) has an HF counterpart."""
    shape_bridge_call(shape_bridge.hf_config_for_arch, arch)


def shape_bridge_call(function, *args):
    try:
        return function(*args)
    except shape_bridge.ShapeBridgeError as err:
        raise ConversionError(str(err)) from None


def check_preset(arch: NeoBERTArch, model_preset: Optional[str], where: str) -> None:
    """Raises naming every field of `arch` that differs from the preset (max length excepted:
    the same weights are used at 1024 and 4096 tokens)."""
    if model_preset is None:
        return
    try:
        preset = get_arch(model_preset)
    except ValueError as err:
        raise ConversionError(str(err)) from None
    diff = {f.name: (getattr(arch, f.name), getattr(preset, f.name)) for f in dataclasses.fields(arch)
            if f.name != "max_sequence_length" and getattr(arch, f.name) != getattr(preset, f.name)}
    if diff:
        listed = ", ".join(f"{k}={mine} (preset: {theirs})" for k, (mine, theirs) in diff.items())
        raise ConversionError(f"{where} does not match --model-preset {model_preset}: {listed}")


def preset_name_of(arch: NeoBERTArch) -> Optional[str]:
    return next((name for name, p in PRESETS.items() if p == arch), None)


# --------------------------------------------------------------------------------------------------
# Reading a megatron-core checkpoint
# --------------------------------------------------------------------------------------------------


def read_checkpoint_args(load: PathLike) -> Tuple[str, dict]:
    """(iteration folder, common "args") of a checkpoint root or iteration folder, as the trainer reads them."""
    try:
        ckpt_dir = resolve_checkpoint_dir(str(load))
        return ckpt_dir, checkpoint_args(read_common_state(ckpt_dir))
    except (FileNotFoundError, ValueError, TrainingError) as err:
        raise ConversionError(str(err)) from None


def arch_from_args(args: dict, where: str) -> NeoBERTArch:
    fields = {f.name for f in dataclasses.fields(NeoBERTArch)}
    unknown = sorted(set(args["arch"]) - fields)
    if unknown:
        raise ConversionError(f"{where}: args['arch'] has unknown fields {unknown}")
    try:
        return NeoBERTArch(**args["arch"])
    except TypeError as err:
        raise ConversionError(f"{where}: args['arch'] is incomplete: {err}") from None


def _model_config(arch: NeoBERTArch, dtype: torch.dtype, **parallel):
    from megatron_neobert.model import transformer_config

    # Every tensor is loaded right after: megatron's random initialisation would be wasted time.
    return transformer_config(arch, params_dtype=dtype, pipeline_dtype=dtype, perform_initialization=False,
                              **parallel)


@contextlib.contextmanager
def _single_rank():
    """megatron-core on this one process for the block, its CUDA calls on the CPU where there is no GPU."""
    from megatron_neobert.parallel.cpu import cpu_execution
    from megatron_neobert.parallel.launch import init_distributed, initialize_model_parallel

    init_distributed()
    if torch.distributed.get_world_size() != 1:
        raise RuntimeError("run the converter as one process (not under torchrun): it spawns its own ranks")
    with cpu_execution():
        initialize_model_parallel(1, 1)
        yield


def build_single_rank_model(arch: NeoBERTArch, vocab_size: int, dtype: torch.dtype = torch.float32):
    """The TP=1/PP=1 megatron-core model the conversions go through (local layer spec: its checkpoint
    keys are the Transformer Engine spec's)."""
    from megatron_neobert.model import build_model

    return build_model(arch, _model_config(arch, dtype), transformer_impl="local", vocab_size=vocab_size)


def _sharded_tensors(sharded_state_dict) -> Dict[str, object]:
    """key -> ShardedTensor of a (factory-applied copy of a) sharded state dict."""
    from megatron.core.dist_checkpointing.dict_utils import nested_values
    from megatron.core.dist_checkpointing.mapping import ShardedTensor, apply_factories

    apply_factories(sharded_state_dict)
    return {t.key: t for t in nested_values(sharded_state_dict) if isinstance(t, ShardedTensor)}


def _check_tensors_and_shards(ckpt_dir: str, expected: Dict[str, object], arch: NeoBERTArch) -> torch.dtype:
    """Compares the checkpoint's model tensors with those of the model built from its args, and checks
    that every file holding them is there and long enough. Returns the stored dtype."""
    from megatron.core import dist_checkpointing
    from torch.distributed.checkpoint import FileSystemReader

    stored = dist_checkpointing.load_tensors_metadata(ckpt_dir)
    model_prefixes = ("embedding.", "decoder.", "output_layer.")
    missing = sorted(k for k in expected if k not in stored)
    extra = sorted(k for k in stored if k.startswith(model_prefixes) and k not in expected)
    shapes = sorted(f"{k}: {tuple(stored[k].global_shape)} in the checkpoint, {tuple(t.global_shape)} for "
                    f"the model" for k, t in expected.items()
                    if k in stored and tuple(stored[k].global_shape) != tuple(t.global_shape))
    problems = [f"{what} {items[:4]}{' ...' if len(items) > 4 else ''}" for what, items in
                (("missing tensors", missing), ("tensors not in the model", extra), ("wrong shapes", shapes))
                if items]
    if problems:
        raise ConversionError(f"{ckpt_dir} does not hold the model its args describe ({arch}): "
                              + "; ".join(problems))

    reader = FileSystemReader(ckpt_dir)
    needed = {}
    for index, info in reader.read_metadata().storage_data.items():
        if index.fqn in expected:
            needed[info.relative_path] = max(needed.get(info.relative_path, 0), info.offset + info.length)
    for name, end in sorted(needed.items()):
        path = os.path.join(ckpt_dir, name)
        if not os.path.isfile(path):
            raise ConversionError(f"{ckpt_dir}: shard file {name} holding model tensors is missing")
        if os.path.getsize(path) < end:
            raise ConversionError(f"{ckpt_dir}: shard file {name} is truncated "
                                  f"({os.path.getsize(path)} bytes, needs {end})")
    return stored["embedding.word_embeddings.weight"].dtype


def load_mcore_checkpoint(load: PathLike, model_preset: Optional[str] = None):
    """Reads the model part of a checkpoint of any layout on this single process.

    Returns (arch, args, full TP=1/PP=1 megatron-core state dict, padded vocabulary size, stored dtype).
    """
    from megatron.core import dist_checkpointing
    from megatron.core.dist_checkpointing.validation import StrictHandling

    ckpt_dir, args = read_checkpoint_args(load)
    arch = arch_from_args(args, ckpt_dir)
    check_convertible(arch)
    check_preset(arch, model_preset, f"checkpoint {ckpt_dir} (arch {arch})")
    padded = int(args.get("padded_vocab_size") or padded_vocab_size(arch.vocab_size))
    if padded < arch.vocab_size:
        raise ConversionError(f"{ckpt_dir}: args give padded_vocab_size={padded}, smaller than the "
                              f"vocabulary ({arch.vocab_size})")

    with _single_rank():
        model = build_single_rank_model(arch, padded)
        stored_dtype = _check_tensors_and_shards(ckpt_dir, _sharded_tensors(model.sharded_state_dict()), arch)
        if stored_dtype != torch.float32:  # e.g. bf16 weights of a --bf16 run: load them as they are
            model = build_single_rank_model(arch, padded, stored_dtype)
        # Only the model's tensors are requested: optimizer and RNG state stay on disk.
        with megatron_deprecations_hidden():
            state = dist_checkpointing.load({"model": model.sharded_state_dict()}, ckpt_dir,
                                            strict=StrictHandling.RAISE_UNEXPECTED)
        model.load_state_dict(state["model"], strict=True)
    state_dict = {k: v for k, v in model.state_dict().items() if not k.endswith("_extra_state")}
    return arch, args, state_dict, padded, stored_dtype


# --------------------------------------------------------------------------------------------------
# Megatron -> HF
# --------------------------------------------------------------------------------------------------


def _resolve_tokenizer(tokenizer: Optional[str], args: dict, workdir: Path, no_tokenizer: bool) -> Optional[Path]:
    """A local folder of tokenizer files: `tokenizer` (folder or hub name) or the one the checkpoint's args
    name. An export without one is an error unless `no_tokenizer`: loading it would fail later with a
    misleading message from the tokenizer classes."""
    if no_tokenizer:
        if tokenizer is not None:
            raise ConversionError("--tokenizer and --no-tokenizer contradict each other")
        logger.info("exporting without tokenizer files, as asked (--no-tokenizer)")
        return None
    if tokenizer is None:
        name, kind = args.get("tokenizer_model"), args.get("tokenizer_type")
        fix = "pass --tokenizer FOLDER_OR_HUB_NAME, or --no-tokenizer for an export without one"
        if kind != HF_TOKENIZER_TYPE or not name:
            raise ConversionError(f"the checkpoint's args name no Hugging Face tokenizer (tokenizer_type={kind!r}, "
                                  f"tokenizer_model={name!r}): {fix}")
        if os.path.isdir(name):
            return Path(name)
        if os.path.isabs(name) or name.startswith(".") or name.count("/") > 1:  # a path, not a hub name
            where = "" if os.path.isabs(name) else f" (relative: looked up from {os.getcwd()})"
            raise ConversionError(f"the checkpoint's tokenizer {name}{where} is not a folder here: {fix}")
        tokenizer = name  # a hub name (or a relative folder of another working directory: fails below)
    if os.path.isdir(tokenizer):
        return Path(tokenizer)
    from megatron_neobert.data.tokenizer import load_auto_tokenizer

    try:
        tok = load_auto_tokenizer(tokenizer)
    except Exception as err:
        raise ConversionError(f"cannot load tokenizer {tokenizer!r} (neither a folder in {os.getcwd()} nor a hub "
                              f"tokenizer: {err}): pass --tokenizer FOLDER, or --no-tokenizer for an export "
                              f"without one") from None
    out = workdir / "tokenizer"
    tok.save_pretrained(str(out))
    return out


def _cast(state_dict: Dict[str, torch.Tensor], dtype: torch.dtype, progress: bool, what: str):
    return {k: v.detach().to("cpu", dtype) for k, v in
            progress_bar(state_dict.items(), desc=what, total=len(state_dict), enabled=progress, unit="tensor")}


def _disk_size(path: Path) -> int:
    return sum(p.stat().st_size for p in Path(path).rglob("*") if p.is_file())


def mcore_to_hf(load: PathLike, save: PathLike, dtype: str = "fp32", tokenizer: Optional[str] = None,
                model_preset: Optional[str] = None, overwrite: bool = False,
                progress: bool = True, no_tokenizer: bool = False) -> ConversionSummary:
    """A megatron-core distributed checkpoint (any layout, optimizer state or not) -> HF folder, with the
    tokenizer `tokenizer` or else the checkpoint's own; without one only when `no_tokenizer`."""
    if dtype not in DTYPES:
        raise ConversionError(f"dtype must be one of {sorted(DTYPES)}, got {dtype!r}")
    save = Path(save)
    if save.exists() and not overwrite:
        raise FileExistsError(f"{save} already exists; pass --overwrite to replace it")
    arch, args, mcore_sd, _, _ = load_mcore_checkpoint(load, model_preset)
    config = shape_bridge_call(shape_bridge.hf_config_for_arch, arch, args.get("hf_intermediate_size"))
    hf_sd = _cast(hf_state_dict_from_mcore(mcore_sd, config), DTYPES[dtype], progress, "mcore -> HF")
    with tempfile.TemporaryDirectory() as workdir:
        tok = _resolve_tokenizer(tokenizer, args, Path(workdir), no_tokenizer)
        write_hf_folder(save, hf_sd, config, tokenizer_path=tok, dtype=DTYPES[dtype], overwrite=overwrite)
    return ConversionSummary("mcore-to-hf", str(save), len(hf_sd), sum(v.numel() for v in hf_sd.values()),
                             dtype, _disk_size(save))


# --------------------------------------------------------------------------------------------------
# HF -> Megatron
# --------------------------------------------------------------------------------------------------


def _fetch_hf(load: str) -> Path:
    """A local folder, or a hub name fetched with `snapshot_download` (cache first, network if allowed)."""
    try:
        check_model_source(load, "--load")
    except ValueError as err:
        raise ConversionError(str(err)) from None
    if os.path.exists(load):
        return Path(load)
    from huggingface_hub import snapshot_download

    try:
        return Path(snapshot_download(load, allow_patterns=_HUB_PATTERNS))
    except Exception as err:
        raise ConversionError(f"{load!r} is neither a local folder nor a downloadable hub repository "
                              f"({type(err).__name__}: {err})") from None


def save_target_layout(stage_dir: str, out_dir: str, arch_fields: dict, common: dict, dtype: torch.dtype,
                       tp: int, pp: int) -> None:
    """Run on each of the TP x PP ranks: build this rank's part, load the staging checkpoint (megatron-core
    reshards), save it from this layout."""
    from megatron.core import dist_checkpointing

    from megatron_neobert.parallel.launch import initialize_model_parallel
    from megatron_neobert.model.chunks import build_model_chunks

    arch = NeoBERTArch(**arch_fields)
    initialize_model_parallel(tp, pp)
    config = _model_config(arch, dtype, tensor_model_parallel_size=tp, pipeline_model_parallel_size=pp)
    # The staging model's vocabulary rows (padded with --make-vocab-size-divisible-by), not the default's.
    chunks = build_model_chunks(arch, config, "local", padded_vocab=checkpoint_args(common)["padded_vocab_size"])
    with megatron_deprecations_hidden():
        state = dist_checkpointing.load(model_sharded_state_dict(chunks), stage_dir)
    load_model_state(chunks, state)
    if torch.distributed.get_rank() == 0:
        os.makedirs(out_dir, exist_ok=True)
    torch.distributed.barrier()
    with megatron_deprecations_hidden():
        dist_checkpointing.save(dict(model_sharded_state_dict(chunks), **common), out_dir)


def hf_to_mcore(load: PathLike, save: PathLike, tensor_model_parallel_size: int = 1,
                pipeline_model_parallel_size: int = 1, dtype: str = "fp32", tokenizer: Optional[str] = None,
                model_preset: Optional[str] = None, overwrite: bool = False, progress: bool = True,
                make_vocab_size_divisible_by: int = VOCAB_PADDING_MULTIPLE) -> ConversionSummary:
    """An HF NeoBERT folder or hub name -> a distributed checkpoint root in the trainer's layout
    (`iter_0000000/`, marker, common args), written by TP x PP ranks."""
    from megatron.core import dist_checkpointing

    from megatron_neobert.parallel.launch import preload_on_ranks, run_on_ranks

    tp, pp = tensor_model_parallel_size, pipeline_model_parallel_size
    if dtype not in DTYPES:
        raise ConversionError(f"dtype must be one of {sorted(DTYPES)}, got {dtype!r}")
    save = Path(save)
    if save.exists() and not overwrite:
        raise FileExistsError(f"{save} already exists; pass --overwrite to replace it")
    src = _fetch_hf(str(load))
    try:
        hf_sd, config = read_hf_folder(src)
    except (FileNotFoundError, ValueError, KeyError) as err:
        raise ConversionError(str(err)) from None
    if "decoder.weight" not in hf_sd:
        raise ConversionError(f"{src} has no MLM head (decoder.weight/bias): pre-training needs one")
    arch = shape_bridge_call(shape_bridge.arch_for_hf_config, config)
    check_preset(arch, model_preset, f"{src} (arch {arch})")
    problems = parallel_shape_problems(arch, f"the model in {src}", tp, pp, resizable=False)
    if problems:
        raise ConversionError(one_line_each(problems))
    padded = padded_vocab_size(arch.vocab_size, tp, make_vocab_size_divisible_by)
    tokenizer_vocab_size = None
    if tokenizer is None and any((src / f).is_file() for f in TOKENIZER_FILES):
        tokenizer = str(load) if not os.path.exists(str(load)) else str(src.resolve())
        from megatron_neobert.data.tokenizer import build_tokenizer

        # Recorded, so that a run continuing from the checkpoint refuses a tokenizer of another vocabulary.
        tokenizer_vocab_size = build_tokenizer(HF_TOKENIZER_TYPE, str(src)).vocab_size
    args = megatron_lm_args(arch, padded, make_vocab_size_divisible_by=make_vocab_size_divisible_by,
                            tokenizer_type=HF_TOKENIZER_TYPE if tokenizer else None, tokenizer_model=tokenizer,
                            model_preset=model_preset or preset_name_of(arch), tensor_model_parallel_size=tp,
                            pipeline_model_parallel_size=pp, data_parallel_size=1, world_size=tp * pp,
                            params_dtype=dtype, converted_from=str(load),
                            hf_intermediate_size=config.intermediate_size, tokenizer_vocab_size=tokenizer_vocab_size)

    common = {"args": args, "iteration": 0, "checkpoint_version": CHECKPOINT_VERSION}
    with atomic_path(save) as tmp:
        stage = tmp / "stage-tp1"
        # 1. HF weights into a TP=1/PP=1 model on this process, saved as a staging checkpoint; at TP=1/PP=1 that model
        # is the target layout, saved with the trainer's common state (no rank to start, megatron-core to import).
        with _single_rank():
            model = build_single_rank_model(arch, padded, DTYPES[dtype])
            mcore_sd = mcore_state_dict_from_hf(hf_sd, config, padded)
            params = dict(model.state_dict())
            unexpected = sorted(set(mcore_sd) - set(params))
            if unexpected:
                raise ConversionError(f"converted keys not in the megatron-core model: {unexpected[:4]}")
            with torch.no_grad():
                for name, value in progress_bar(mcore_sd.items(), desc="HF -> mcore", total=len(mcore_sd),
                                                enabled=progress, unit="tensor"):
                    params[name].copy_(value)
            direct = tp * pp == 1
            target = Path(iteration_dir(str(tmp), 0)) if direct else stage
            target.mkdir(parents=True)
            with megatron_deprecations_hidden():
                dist_checkpointing.save(dict(model_sharded_state_dict([model]), **(common if direct else {})),
                                        str(target))
            del model, params, mcore_sd

        # 2. Reshard on TP x PP ranks, save from the target layout with the trainer's common state.
        if not direct:
            preload_on_ranks(__name__)  # the ranks run save_target_layout: this module's imports, once
            run_on_ranks(save_target_layout, tp * pp, str(stage), iteration_dir(str(tmp), 0),
                         dataclasses.asdict(arch), common, DTYPES[dtype], tp, pp)
            shutil.rmtree(stage)
        write_latest_marker(str(tmp), 0)
    return ConversionSummary("hf-to-mcore", str(save), len(hf_sd), sum(v.numel() for v in hf_sd.values()),
                             dtype, _disk_size(save),
                             layout=f"TP={tp} x PP={pp}, vocabulary padded to {padded}, iteration 0")
