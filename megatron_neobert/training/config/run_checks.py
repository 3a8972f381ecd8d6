"""Checks at the start of a run that would otherwise fail deep inside a step or a load."""

import os
import re
from typing import Optional

from megatron_neobert.checkpoint.state import checkpoint_args
from megatron_neobert.data.datasets import checks as data_checks
from megatron_neobert.data.datasets.trainer_datasets import data_sources
from megatron_neobert.data.indexed import IndexedDataError, check_sizes
from megatron_neobert.data.preprocessing.readers import JSON_SUFFIXES, PARQUET_SUFFIXES
from megatron_neobert.data.tokenizer import MLMTokenizer, build_tokenizer
from megatron_neobert.errors import InputError, TrainingError, one_line_each
from megatron_neobert.model import ModelShape, NeoBERTArch, parallel_shape_problems
from megatron_neobert.training.config.settings import DataSettings, Settings

# What decides the model's tensors (besides the vocabulary rows, see check_vocabulary_rows).
TENSOR_SHAPE_FIELDS = ("num_layers", "hidden_size", "num_attention_heads", "ffn_hidden_size", "normalization",
                       "activation", "position_embedding_type", "add_bias_linear")
# Settings that decide the layout of the optimizer state in a checkpoint: (section, name).
OPTIMIZER_SETUP = (("precision", "bf16"), ("parallel", "use_distributed_optimizer"))


def check_inputs(data: DataSettings) -> MLMTokenizer:
    """The run's tokenizer, once every dataset the data flags name exists, the tokenizer loads and covers the ids
    each dataset's record names. Needs no process group: every rank checks before the group exists, so bad input
    ends the run at once. The datasets first: a few bytes of each file, where a tokenizer by name may look for the
    Hub first."""
    try:
        prefixes = data_prefixes(data)
        for prefix in prefixes:
            check_dataset(prefix, data.tokenizer_model)
        tokenizer = build_tokenizer(data.tokenizer_type, data.tokenizer_model)
        for prefix in prefixes:
            data_checks.check_vocabulary(prefix, tokenizer)
        return tokenizer
    except (ValueError, OSError) as err:  # a tokenizer that does not load, an unreadable or bad data-args file
        raise InputError(str(err)) from err


def data_prefixes(data: DataSettings) -> list:
    """Every dataset prefix the data flags name (none with --mock-data)."""
    sources = data_sources(data)
    blends = [sources["blend"], *(sources["blend_per_split"] or [])]
    return list(dict.fromkeys(prefix for blend in blends if blend for prefix in blend[0]))


def check_dataset(prefix: str, tokenizer_model: str) -> None:
    """A --data-path prefix names a .bin / .idx pair whose sizes and header are megatron-core's (constant time:
    a few bytes of each file); else an InputError saying how to get one: the prefix without a .bin / .idx
    suffix, raw text (Parquet, JSON lines) preprocessed first, or the dataset made with preprocess_data.py."""
    stem, suffix = os.path.splitext(prefix)
    if suffix in (".bin", ".idx"):
        made = os.path.isfile(stem + ".bin") and os.path.isfile(stem + ".idx")
        raise InputError(f"--data-path {prefix}: a dataset is named by its prefix, without {suffix}: --data-path "
                         f"{stem}" + ("" if made else f" (which names {stem}.bin and {stem}.idx; neither pair is "
                                                      f"there yet)"))
    raw = next((s for s in JSON_SUFFIXES + PARQUET_SUFFIXES if prefix.endswith(s)), None)
    if raw:
        output_prefix = prefix[:-len(raw)]
        raise InputError(f"--data-path {prefix} is raw text: the trainer reads tokenized .bin / .idx datasets; make "
                         f"one first with python tools/preprocess_data.py --input {prefix} --output-prefix "
                         f"{output_prefix} --json-keys text --tokenizer-model {tokenizer_model} (--json-keys: the "
                         f"field holding the text), then train with --data-path {output_prefix}_text_document")
    if not (os.path.isfile(prefix + ".bin") and os.path.isfile(prefix + ".idx")):
        # preprocess_data.py names its output {output prefix}_{key}_document.
        named = re.fullmatch(r"(.*)_([^_/]+)_document", prefix)
        output_prefix, key = (named.group(1), named.group(2)) if named else (prefix, "text")
        raise InputError(f"dataset {prefix} not found (no {prefix}.bin / .idx): make it with "
                         f"python tools/preprocess_data.py --input CORPUS.parquet --output-prefix "
                         f"{output_prefix} --json-keys {key} --tokenizer-model {tokenizer_model}, which "
                         f"writes {output_prefix}_{key}_document.bin / .idx")
    try:
        check_sizes(prefix + ".idx", prefix + ".bin")
    except IndexedDataError as err:
        raise InputError(f"dataset {prefix}: {err} (make it again with python tools/preprocess_data.py)") from None


def check_vocabulary(tokenizer: MLMTokenizer, arch: NeoBERTArch) -> None:
    """Token ids beyond the model's vocabulary would index past its embedding."""
    if tokenizer.vocab_size > arch.vocab_size:
        raise InputError(f"tokenizer {tokenizer.tokenizer_model} has {tokenizer.vocab_size:,} entries, more than "
                         f"the model's vocabulary of {arch.vocab_size:,}: raise --vocab-size to at least "
                         f"{tokenizer.vocab_size} or use a smaller tokenizer")


def check_model_shape(shape: ModelShape, checkpoint: str, common: dict) -> None:
    """A checkpoint loads only into a model of its own shape; compared from its args before the model
    is built (megatron-core would stop in the load with a "Global shape mismatch" on one tensor)."""
    arch = shape.arch
    saved = checkpoint_args(common).get("arch")
    if saved is None:  # a checkpoint without our args: megatron-core's own check applies
        return
    learned = arch.position_embedding_type == "learned_absolute"
    fields = TENSOR_SHAPE_FIELDS + (("max_sequence_length",) if learned else ())
    differs = [f"{name} {saved.get(name)} there, {getattr(arch, name)} here" for name in fields
               if saved.get(name) != getattr(arch, name)]
    if differs:
        raise InputError(f"checkpoint {checkpoint} holds a model of another shape ({'; '.join(differs)}; "
                         f"this run: {shape.base} and its overrides): give the "
                         f"checkpoint's sizes, or --use-checkpoint-args to take them from it")


def check_positions(settings: Settings, arch: NeoBERTArch) -> None:
    """Learned positions cannot go beyond their table (RoPE can: the shape records the longest trained length)."""
    seq_length = settings.data.seq_length
    if arch.position_embedding_type != "rope" and seq_length > arch.max_sequence_length:
        raise InputError(f"--seq-length {seq_length} is longer than the {arch.max_sequence_length} learned positions "
                         f"of the model ({arch.position_embedding_type}); lower --seq-length or raise "
                         f"--max-position-embeddings (a new position table)")


def check_vocabulary_rows(settings: Settings, shape: ModelShape, checkpoint: Optional[str]) -> None:
    """A loaded checkpoint's vocabulary rows are fixed: they must hold the vocabulary and split over TP. (30522
    pads to 30592 at TP 1 but to 30720 at TP 2, and megatron-core loads saved rows into another count without a
    word: it cuts them, or fills zeros, extra zero logits in the softmax: other losses.)"""
    if checkpoint is None:
        return
    rows, tp = shape.padded_vocab_size, settings.parallel.tensor_model_parallel_size
    if rows < shape.arch.vocab_size:
        raise InputError(f"checkpoint {checkpoint} has {rows} vocabulary rows, fewer than the model's vocabulary "
                         f"({shape.arch.vocab_size}, --vocab-size or the tokenizer's)")
    if rows % tp:
        raise InputError(f"checkpoint {checkpoint} has its vocabulary padded to {rows} rows, which "
                         f"--tensor-model-parallel-size {tp} does not divide")


def check_tokenizer_matches_checkpoint(tokenizer: MLMTokenizer, checkpoint: Optional[str],
                                       common: Optional[dict]) -> None:
    """A loaded model's embedding rows mean the tokens of the tokenizer it was trained with: another vocabulary
    would train every id as some other token. Compared with the size its args record (the trainer's and the
    converter's do; older checkpoints record none)."""
    args = checkpoint_args(common) if common else {}
    saved = args.get("tokenizer_vocab_size")
    if saved is None or saved == tokenizer.vocab_size:
        return
    recorded = args.get("tokenizer_model")
    raise InputError(f"tokenizer {tokenizer.tokenizer_model} has {tokenizer.vocab_size:,} entries, the tokenizer "
                     f"of checkpoint {checkpoint} {saved:,}" + (f" ({recorded})" if recorded else "")
                     + ": give the checkpoint's tokenizer (--tokenizer-model), or drop the tokenizer flags to take "
                       "the one its args name")


def check_optimizer_setup(settings: Settings, checkpoint: str, common: dict) -> None:
    """A checkpoint's optimizer state loads only into the optimizer setup that saved it."""
    saved = checkpoint_args(common)
    on_off = lambda value: "on" if value else "off"
    here = {name: getattr(getattr(settings, section), name) for section, name in OPTIMIZER_SETUP}
    differs = [f"--{name.replace('_', '-')} {on_off(saved.get(name))} there, {on_off(value)} here"
               for name, value in here.items() if bool(saved.get(name)) != bool(value)]
    if differs:
        raise TrainingError(f"checkpoint {checkpoint} holds optimizer state of another setup ({'; '.join(differs)}); "
                            f"start with a fresh optimizer state with --no-load-optim (the weights, iteration, "
                            f"schedule and data position still load)")


def check_parallel_shape(settings: Settings, shape: ModelShape) -> None:
    """The run's final shape against its parallel layout (and FP8), before any model is built; each problem one
    `error:` line."""
    parallel = settings.parallel
    problems = parallel_shape_problems(
        shape.arch, shape.base, parallel.tensor_model_parallel_size, parallel.pipeline_model_parallel_size,
        parallel.num_layers_per_virtual_pipeline_stage, fp8=settings.precision.fp8_format is not None)
    if problems:
        raise InputError(one_line_each(problems))
