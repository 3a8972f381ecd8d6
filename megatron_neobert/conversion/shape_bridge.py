"""The one bridge between a run's model shape (`NeoBERTArch`) and the Hugging Face `NeoBERTConfig`, both ways,
from one table. Every conversion (checkpoints, exports, the throughput benchmark's HF model) goes through it."""

from typing import Optional

from megatron_neobert.hf import NeoBERTConfig
from megatron_neobert.hf.configuration_neobert import published_swiglu_width
from megatron_neobert.model import NeoBERTArch

# (NeoBERTArch field, NeoBERTConfig field): the same number under two names. init_range is both of the published
# uniform ranges (embeddings; Linear layers and decoder); reading back takes the embeddings' one.
SHAPE_FIELDS = (
    ("num_layers", "num_hidden_layers"),
    ("hidden_size", "hidden_size"),
    ("num_attention_heads", "num_attention_heads"),
    ("ffn_hidden_size", "ffn_hidden_size"),
    ("vocab_size", "vocab_size"),
    ("max_sequence_length", "max_length"),
    ("norm_epsilon", "norm_eps"),
    ("init_range", "embedding_init_range"),
    ("init_range", "decoder_init_range"),
)
# What only the NeoBERT block has an HF counterpart for.
NEOBERT_BLOCK = dict(position_embedding_type="rope", activation="swiglu", normalization="RMSNorm",
                     add_bias_linear=False)


class ShapeBridgeError(ValueError):
    """The shape has no counterpart on the other side; the message says which field."""


def hf_config_for_arch(arch: NeoBERTArch, intermediate_size: Optional[int] = None, **config_kwargs) -> NeoBERTConfig:
    """The HF config of `arch` (`config_kwargs`: fields of the HF side only, e.g. classifier_pooling).

    `intermediate_size`: the nominal size a Hugging Face source said (a checkpoint's args record it), kept when it
    gives this SwiGLU width: several nominal sizes give one width (512 and 516 both 344), and an export should say
    what its source said."""
    wrong = {k: getattr(arch, k) for k, v in NEOBERT_BLOCK.items() if getattr(arch, k) != v}
    if wrong:
        raise ShapeBridgeError(
            f"this architecture has {wrong}; only NeoBERT's RoPE / SwiGLU / RMSNorm / bias-free blocks "
            f"convert to the Hugging Face NeoBERT layout (BERT-like presets such as ablation-m0 do not)")
    fields = {hf: getattr(arch, mine) for mine, hf in SHAPE_FIELDS}
    # The published nominal size the SwiGLU width is said to come from; the width itself is ffn_hidden_size.
    keeps_width = intermediate_size and published_swiglu_width(intermediate_size) == arch.ffn_hidden_size
    fields["intermediate_size"] = intermediate_size if keeps_width else 3 * arch.ffn_hidden_size // 2
    fields["rope_parameters"] = {"rope_type": "default", "rope_theta": float(arch.rotary_base)}
    return NeoBERTConfig(**fields, **config_kwargs)


def arch_for_hf_config(config: NeoBERTConfig) -> NeoBERTArch:
    """The run shape of an HF config; refuses what megatron-core's NeoBERT here has no counterpart for."""
    rope = dict(config.rope_parameters or {})
    theta = float(rope.pop("rope_theta", NeoBERTConfig.default_theta))
    if rope.pop("rope_type", "default") != "default" or rope:
        raise ShapeBridgeError(f"rope_parameters={config.rope_parameters} has no megatron-core counterpart here; "
                               f"convert the unscaled model")
    if theta != int(theta):
        raise ShapeBridgeError(f"rope_theta={theta} is not an integer base")
    fields = {mine: getattr(config, hf) for mine, hf in SHAPE_FIELDS}
    return NeoBERTArch(**fields, rotary_base=int(theta), **NEOBERT_BLOCK)
