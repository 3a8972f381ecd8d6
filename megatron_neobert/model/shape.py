"""The model's shape for a run, decided in one place: the preset (or, with --use-checkpoint-args, the checkpoint's
own record), the size flags, the tokenizer and a loaded checkpoint -> `ModelShape`. Nothing here checks: the
trainer's checks run on what this returns, so that they see the shape the model will have."""

import dataclasses
from typing import Mapping, Optional, Tuple

from megatron_neobert.model.config import NeoBERTArch, get_arch, swiglu_width

# Megatron-LM's --make-vocab-size-divisible-by: embedding rows a multiple of this x TP (tensor-core friendly shards).
VOCAB_PADDING_MULTIPLE = 128


def padded_vocab_size(vocab_size: int, tensor_model_parallel_size: int = 1,
                      make_vocab_size_divisible_by: int = VOCAB_PADDING_MULTIPLE) -> int:
    """Megatron-LM's rule: pad the vocabulary to a multiple of divisible_by x TP."""
    multiple = make_vocab_size_divisible_by * tensor_model_parallel_size
    return -(-vocab_size // multiple) * multiple


def derived_ffn_hidden_size(activation: str, hidden_size: int) -> int:
    """The MLP width for --hidden-size without --ffn-hidden-size, by the presets' own rule (SwiGLU: 2/3 x 4h rounded
    up to 8, as NeoBERT; Megatron-LM rounds down to 64; GELU: 4h)."""
    return swiglu_width(4 * hidden_size) if activation == "swiglu" else 4 * hidden_size


@dataclasses.dataclass(frozen=True)
class ModelShape:
    """What the run builds and records.

    `padded_vocab_size`: rows of the embedding and output layer (a loaded checkpoint's own: its rows are fixed);
    `preset`: the preset named (with --use-checkpoint-args the one the checkpoint's args record: None for a shape that
    is not a preset's); `base`: what the shape started from, in words; `changes`: 'field base -> this run (why)' for
    each size where the model is not the base's;
    `hf_intermediate_size`: the nominal SwiGLU size a Hugging Face source gave for this width, kept so that the
    export says what the source said (several nominal sizes map to one width: 512 and 516 both to 344)."""

    arch: NeoBERTArch
    padded_vocab_size: int
    preset: Optional[str]
    base: str
    changes: Tuple[str, ...] = ()
    hf_intermediate_size: Optional[int] = None


def resolve_model_shape(preset: str, overrides: Mapping[str, int], *, tokenizer_vocab_size: Optional[int] = None,
                        seq_length: Optional[int] = None, tensor_model_parallel_size: int = 1,
                        make_vocab_size_divisible_by: int = VOCAB_PADDING_MULTIPLE,
                        checkpoint_args: Optional[dict] = None, use_checkpoint_args: bool = False) -> ModelShape:
    """The run's shape.

    The base is the preset, or with `use_checkpoint_args` the checkpoint's arch record (the preset is a name for a
    shape, never required). `overrides` (NeoBERTArch field -> value, the size flags given) win over the base, as
    Megatron-LM's command line over load_args_from_checkpoint. The vocabulary is the tokenizer's unless given (the
    checkpoint's with `use_checkpoint_args`). With RoPE, `max_sequence_length` becomes the longest length the model
    has been trained at: this run's `seq_length`, the loaded checkpoint's record, or (from scratch) the preset's;
    a loaded checkpoint's length replaces the preset's, which it was never trained at. A loaded checkpoint
    (`checkpoint_args`) fixes the vocabulary rows."""
    saved = checkpoint_args or {}
    saved_arch = saved.get("arch")
    if use_checkpoint_args:
        base, base_name, name = NeoBERTArch(**saved_arch), "the checkpoint's shape", saved.get("model_preset")
    else:
        base, base_name, name = get_arch(preset), f"model preset {preset}", preset
    fields = dict(overrides)
    why = {}
    if "vocab_size" not in fields and tokenizer_vocab_size is not None and not use_checkpoint_args:
        fields["vocab_size"], why["vocab_size"] = tokenizer_vocab_size, "the tokenizer's"
    if "hidden_size" in fields and "ffn_hidden_size" not in fields:
        fields["ffn_hidden_size"] = derived_ffn_hidden_size(base.activation, fields["hidden_size"])
        why["ffn_hidden_size"] = "derived from --hidden-size"
    arch = dataclasses.replace(base, **fields)
    if arch.position_embedding_type == "rope":
        loaded = saved_arch["max_sequence_length"] if saved_arch else 0
        start = fields.get("max_sequence_length") or loaded or base.max_sequence_length
        arch = dataclasses.replace(arch, max_sequence_length=max(start, seq_length or 0, loaded))
        if arch.max_sequence_length != base.max_sequence_length and "max_sequence_length" not in fields:
            why["max_sequence_length"] = ("--seq-length" if arch.max_sequence_length == seq_length
                                          else "the length the loaded checkpoint was trained at")
    changes = tuple(f"{f.name} {getattr(base, f.name)} -> {getattr(arch, f.name)}"
                    + (f" ({why[f.name]})" if f.name in why else "")
                    for f in dataclasses.fields(arch) if getattr(base, f.name) != getattr(arch, f.name))
    rows = saved.get("padded_vocab_size") or padded_vocab_size(arch.vocab_size, tensor_model_parallel_size,
                                                                make_vocab_size_divisible_by)
    same_width = saved_arch is not None and saved_arch.get("ffn_hidden_size") == arch.ffn_hidden_size
    return ModelShape(arch, rows, name, base_name, changes, saved.get("hf_intermediate_size") if same_width else None)
