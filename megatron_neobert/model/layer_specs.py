"""Layer specs: Transformer Engine when it imports, megatron-core's local modules otherwise.

Both build the same pre-norm block (norm -> fused QKV -> bidirectional attention -> out-proj;
norm -> fc1 -> activation -> fc2) and checkpoint under the same keys, so a run can switch specs
across a restart.
"""

from typing import Optional

import torch
from megatron.core.fusions.fused_bias_dropout import get_bias_dropout_add
from megatron.core.tensor_parallel.layers import ColumnParallelLinear, RowParallelLinear
from megatron.core.transformer.attention import SelfAttention, SelfAttentionSubmodules
from megatron.core.transformer.enums import AttnMaskType
from megatron.core.transformer.identity_op import IdentityOp
from megatron.core.transformer.mlp import MLPSubmodules
from megatron.core.transformer.spec_utils import ModuleSpec
from megatron.core.transformer.transformer_block import TransformerBlockSubmodules, get_num_layers_to_build
from megatron.core.transformer.transformer_config import TransformerConfig
from megatron.core.transformer.transformer_layer import TransformerLayer, TransformerLayerSubmodules

from megatron_neobert.megatron_core_compat import mlp_submodule
from megatron_neobert.model.attention import BidirectionalAttention
from megatron_neobert.model.neobert_model import NeoBERTModel

# Megatron's local spec maps its separate norms onto TE's fused names in checkpoints.
_LOCAL_TO_TE_CHECKPOINT_KEYS = {
    "input_layernorm.": "self_attention.linear_qkv.layer_norm_",
    "pre_mlp_layernorm.": "mlp.linear_fc1.layer_norm_",
}


class _ConfigNorm:
    """A PyTorch norm built from megatron-core's (config, hidden_size, eps) and usable with sequence parallelism.

    Not apex's FusedLayerNorm (which rejects RMSNorm) nor megatron-core's WrappedTorchNorm
    (which rejects sequence parallelism): under sequence parallelism each TP rank sees a slice of
    the sequence, so the weight's gradient is partial, and the `sequence_parallel` flag makes
    megatron-core all-reduce it across the tensor-parallel group.
    """

    def __init__(self, config: TransformerConfig, hidden_size: int, eps: float = 1e-5, **kwargs):
        super().__init__(hidden_size, eps=eps, dtype=config.params_dtype)
        for param in self.parameters():
            param.sequence_parallel = config.sequence_parallel


class RMSNorm(_ConfigNorm, torch.nn.RMSNorm):
    pass


class LayerNorm(_ConfigNorm, torch.nn.LayerNorm):
    pass


NORMS = {"RMSNorm": RMSNorm, "LayerNorm": LayerNorm}


def local_layer_spec(normalization: str = "RMSNorm") -> ModuleSpec:
    """megatron-core linear layers, our norm (`normalization`: RMSNorm or LayerNorm) and our bidirectional
    core attention."""
    norm = NORMS[normalization]
    return ModuleSpec(
        module=TransformerLayer,
        submodules=TransformerLayerSubmodules(
            input_layernorm=norm,
            self_attention=ModuleSpec(
                module=SelfAttention,
                params={"attn_mask_type": AttnMaskType.padding},
                submodules=SelfAttentionSubmodules(
                    linear_qkv=ColumnParallelLinear,
                    core_attention=BidirectionalAttention,
                    linear_proj=RowParallelLinear,
                    q_layernorm=IdentityOp,
                    k_layernorm=IdentityOp,
                ),
            ),
            self_attn_bda=get_bias_dropout_add,
            pre_mlp_layernorm=norm,
            mlp=mlp_submodule(MLPSubmodules(linear_fc1=ColumnParallelLinear, linear_fc2=RowParallelLinear)),
            mlp_bda=get_bias_dropout_add,
            sharded_state_dict_keys_map=_LOCAL_TO_TE_CHECKPOINT_KEYS,
        ),
    )


def transformer_engine_layer_spec() -> ModuleSpec:
    """TE linears with the norm fused into QKV and fc1; TE's fused attention (padding / THD)."""
    from megatron.core.extensions.transformer_engine import (
        TEDotProductAttention,
        TELayerNormColumnParallelLinear,
        TERowParallelLinear,
    )

    return ModuleSpec(
        module=TransformerLayer,
        submodules=TransformerLayerSubmodules(
            self_attention=ModuleSpec(
                module=SelfAttention,
                params={"attn_mask_type": AttnMaskType.padding},
                submodules=SelfAttentionSubmodules(
                    linear_qkv=TELayerNormColumnParallelLinear,
                    core_attention=TEDotProductAttention,
                    linear_proj=TERowParallelLinear,
                    q_layernorm=IdentityOp,
                    k_layernorm=IdentityOp,
                ),
            ),
            self_attn_bda=get_bias_dropout_add,
            pre_mlp_layernorm=IdentityOp,
            mlp=mlp_submodule(MLPSubmodules(linear_fc1=TELayerNormColumnParallelLinear,
                                            linear_fc2=TERowParallelLinear)),
            mlp_bda=get_bias_dropout_add,
        ),
    )


def get_block_spec(config: TransformerConfig, transformer_impl: str,
                   vp_stage: Optional[int] = None) -> TransformerBlockSubmodules:
    """This pipeline stage's layers and final norm (`transformer_impl`: "transformer_engine" or "local"). Given a
    bare layer spec, megatron-core would pick the final norm itself (apex's FusedLayerNorm when apex imports, which
    rejects RMSNorm)."""
    num_layers = get_num_layers_to_build(config, vp_stage)
    if transformer_impl == "transformer_engine":
        from megatron.core.extensions.transformer_engine import TENorm

        return TransformerBlockSubmodules(layer_specs=[transformer_engine_layer_spec()] * num_layers,
                                          layer_norm=TENorm)
    norm = NORMS[config.normalization]
    return TransformerBlockSubmodules(layer_specs=[local_layer_spec(config.normalization)] * num_layers,
                                      layer_norm=norm)


def neobert_model_spec(config: TransformerConfig, transformer_impl: str = "auto",
                       vp_stage: Optional[int] = None) -> ModuleSpec:
    """`NeoBERTModel` with this stage's block, in Transformer Engine layers or megatron-core's local ones
    (`transformer_impl`; auto: TE when it imports on a GPU, `kernels.choose_transformer_impl`)."""
    from megatron_neobert.kernels import choose_transformer_impl, transformer_engine_available

    impl = choose_transformer_impl(transformer_impl, torch.cuda.is_available(), transformer_engine_available())
    return ModuleSpec(module=NeoBERTModel, params={"local_attention": impl == "local"},
                      submodules=get_block_spec(config, impl, vp_stage))
