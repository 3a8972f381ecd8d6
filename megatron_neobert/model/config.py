"""Architecture presets, by name, and their megatron-core `TransformerConfig`. torch is imported when a config is
built: the trainer's and the tools' --help read the presets only."""

import dataclasses
import math
from dataclasses import dataclass
from functools import partial
from typing import Dict


@dataclass(frozen=True)
class NeoBERTArch:
    """What defines an encoder's shape; training settings live in the trainer's arguments."""

    num_layers: int
    hidden_size: int
    num_attention_heads: int
    ffn_hidden_size: int  # the real width of the MLP (for SwiGLU: of each of gate and up)
    vocab_size: int
    max_sequence_length: int
    normalization: str = "RMSNorm"  # or "LayerNorm" (BERT-like M0)
    activation: str = "swiglu"  # or "gelu"
    position_embedding_type: str = "rope"  # or "learned_absolute"
    add_bias_linear: bool = False
    norm_epsilon: float = 1e-5
    rotary_base: int = 10000
    init_range: float = 0.02  # Linear and Embedding weights ~ uniform(-r, r)

    @property
    def kv_channels(self) -> int:
        return self.hidden_size // self.num_attention_heads


def swiglu_width(nominal_intermediate_size: int) -> int:
    """NeoBERT's real SwiGLU width: 2/3 of the nominal size, rounded up to a multiple of 8."""
    return int(math.ceil(int(2 * nominal_intermediate_size / 3) / 8) * 8)


PRESETS: Dict[str, NeoBERTArch] = {
    # The published model: 28 x 768, 12 heads, SwiGLU 2048, 30522 WordPiece.
    "neobert-250m": NeoBERTArch(28, 768, 12, swiglu_width(3072), 30522, 4096),
    # For tests and the quickstart; its vocabulary is the built-in sample tokenizer's.
    "neobert-tiny": NeoBERTArch(4, 128, 4, swiglu_width(512), 8192, 1024),
    # The paper's ablation ladder. M2-M5 and M9 change data, optimiser, masking and
    # batch, not the architecture: they reuse the preset of the step before them.
    "ablation-m0": NeoBERTArch(12, 768, 12, 3072, 30522, 512, normalization="LayerNorm",
                               activation="gelu", position_embedding_type="learned_absolute",
                               add_bias_linear=True, norm_epsilon=1e-12),
    # M1 swaps in RoPE, SwiGLU and RMSNorm (and, as the final model, drops the biases).
    "ablation-m1": NeoBERTArch(12, 768, 12, swiglu_width(3072), 30522, 512),
    # M7: 250M parameters at BERT's depth-to-width ratio, 16 x 1056 (12 heads of 88).
    "ablation-m7": NeoBERTArch(16, 1056, 12, swiglu_width(4 * 1056), 30522, 1024),
    # M8: the same budget spent on depth, 28 x 768 (NeoBERT's shape at length 1024).
    "ablation-m8": NeoBERTArch(28, 768, 12, swiglu_width(3072), 30522, 1024),
}


def get_arch(name: str, **overrides) -> NeoBERTArch:
    if name not in PRESETS:
        raise ValueError(f"unknown model preset {name!r}; choose one of {sorted(PRESETS)}")
    return dataclasses.replace(PRESETS[name], **overrides)


def _uniform_init(tensor, init_range: float):
    import torch

    return torch.nn.init.uniform_(tensor, -init_range, init_range)


def fused_rope_available() -> bool:
    """Transformer Engine's fused RoPE kernels, through megatron-core (absent without TE)."""
    from megatron.core.models.common.embeddings import rope_utils

    return rope_utils.fused_apply_rotary_pos_emb_thd is not None


def transformer_config(arch: NeoBERTArch, **kwargs):
    """megatron-core `TransformerConfig` for `arch`; kwargs set parallelism, precision, etc."""
    import torch
    import torch.nn.functional as F
    from megatron.core.transformer import TransformerConfig

    from megatron_neobert.megatron_core_compat import whole_layer_cuda_graphs

    on_gpu = torch.cuda.is_available()
    init = partial(_uniform_init, init_range=arch.init_range)
    swiglu = arch.activation == "swiglu"
    defaults = dict(
        num_layers=arch.num_layers,
        hidden_size=arch.hidden_size,
        num_attention_heads=arch.num_attention_heads,
        ffn_hidden_size=arch.ffn_hidden_size,
        kv_channels=arch.kv_channels,
        normalization=arch.normalization,
        layernorm_epsilon=arch.norm_epsilon,
        gated_linear_unit=swiglu,
        activation_func=F.silu if swiglu else F.gelu,
        add_bias_linear=arch.add_bias_linear,
        add_qkv_bias=arch.add_bias_linear,
        hidden_dropout=0.0,
        attention_dropout=0.0,
        # NeoBERT rotates adjacent pairs (2i, 2i+1) of each head's q and k. Here each head's Q and K
        # rows are stored in rotate-half order (pairs (i, i + d/2)): conversion permutes them, q.k is
        # unchanged, and megatron-core's fused THD RoPE (which ignores rotary_interleaved) is right.
        rotary_interleaved=False,
        init_method=init,
        output_layer_init_method=init,
        embedding_init_method=init,
        # The jit/TE fusions only pay (and only all work) on GPUs. SwiGLU's fusion takes no bias;
        # GELU's needs one.
        apply_rope_fusion=on_gpu and arch.position_embedding_type == "rope" and fused_rope_available(),
        bias_activation_fusion=on_gpu and (swiglu or arch.add_bias_linear),
        cross_entropy_loss_fusion=on_gpu,
        bias_dropout_fusion=on_gpu,
        masked_softmax_fusion=False,
        persist_layer_norm=False,
        use_cpu_initialization=not on_gpu,
        # Loss is summed over masked tokens and divided once by their global count.
        calculate_per_token_loss=True,
        **whole_layer_cuda_graphs(),
    )
    if kwargs.get("virtual_pipeline_model_parallel_size"):
        # As Megatron-LM: interleaved stages use unbatched p2p, which puts the two directions on
        # two process groups. Batched, a 2-stage pipeline sends activations and gradients to the
        # same peer in an order its receives do not match.
        defaults.update(overlap_p2p_comm=True, batch_p2p_comm=False)
    defaults.update(kwargs)
    return TransformerConfig(**defaults)
