"""Layer specs: Transformer Engine when it imports, megatron-core's local modules otherwise.

Both build the same pre-norm block (norm -> fused QKV -> bidirectional attention -> out-proj;
norm -> fc1 -> activation -> fc2) and checkpoint under the same keys, so a run can switch specs
across a restart.
"""

import importlib
import logging
from functools import lru_cache
from typing import Optional

import torch
from megatron.core.fusions.fused_bias_dropout import get_bias_dropout_add
from megatron.core.tensor_parallel.layers import ColumnParallelLinear, RowParallelLinear
from megatron.core.transformer.attention import SelfAttention, SelfAttentionSubmodules
from megatron.core.transformer.enums import AttnMaskType
from megatron.core.transformer.identity_op import IdentityOp
from megatron.core.transformer.mlp import MLP, MLPSubmodules
from megatron.core.transformer.spec_utils import ModuleSpec
from megatron.core.transformer.transformer_block import TransformerBlockSubmodules, get_num_layers_to_build
from megatron.core.transformer.transformer_config import TransformerConfig
from megatron.core.transformer.transformer_layer import TransformerLayer, TransformerLayerSubmodules

from megatron_neobert.model.attention import BidirectionalAttention

logger = logging.getLogger(__name__)

# Megatron's local spec maps its separate norms onto TE's fused names in checkpoints.
_LOCAL_TO_TE_CHECKPOINT_KEYS = {
    "input_layernorm.": "self_attention.linear_qkv.layer_norm_",
    "pre_mlp_layernorm.": "mlp.linear_fc1.layer_norm_",
}


@lru_cache(maxsize=None)
def transformer_engine_available() -> bool:
    try:
        importlib.import_module("transformer_engine")
        importlib.import_module("megatron.core.extensions.transformer_engine")
    except Exception:  # ImportError, or a TE build that does not match this torch/CUDA
        return False
    return True


class Norm:
    """PyTorch RMSNorm or LayerNorm, usable with sequence parallelism.

    Not apex's FusedLayerNorm (which rejects RMSNorm) nor megatron-core's WrappedTorchNorm
    (which rejects sequence parallelism): under sequence parallelism each TP rank sees a slice of
    the sequence, so the weight's gradient is partial, and the `sequence_parallel` flag makes
    megatron-core all-reduce it across the tensor-parallel group.
    """

    def __new__(cls, config: TransformerConfig, hidden_size: int, eps: float = 1e-5, **kwargs):
        norm_cls = {"RMSNorm": torch.nn.RMSNorm, "LayerNorm": torch.nn.LayerNorm}[config.normalization]
        norm = norm_cls(hidden_size, eps=eps, dtype=config.params_dtype)
        for param in norm.parameters():
            param.sequence_parallel = config.sequence_parallel
        return norm


def local_layer_spec() -> ModuleSpec:
    """megatron-core linear layers, our norm and our bidirectional core attention."""
    return ModuleSpec(
        module=TransformerLayer,
        submodules=TransformerLayerSubmodules(
            input_layernorm=Norm,
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
            pre_mlp_layernorm=Norm,
            mlp=ModuleSpec(module=MLP, submodules=MLPSubmodules(linear_fc1=ColumnParallelLinear,
                                                                 linear_fc2=RowParallelLinear)),
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
            mlp=ModuleSpec(module=MLP, submodules=MLPSubmodules(
                linear_fc1=TELayerNormColumnParallelLinear, linear_fc2=TERowParallelLinear)),
            mlp_bda=get_bias_dropout_add,
        ),
    )


def get_block_spec(config: TransformerConfig, transformer_impl: str = "auto",
                   vp_stage: Optional[int] = None) -> TransformerBlockSubmodules:
    """This pipeline stage's layers and final norm. Given a bare layer spec, megatron-core would
    pick the final norm itself (apex's FusedLayerNorm when apex imports, which rejects RMSNorm)."""
    num_layers = get_num_layers_to_build(config, vp_stage)
    if use_transformer_engine(transformer_impl):
        from megatron.core.extensions.transformer_engine import TENorm

        return TransformerBlockSubmodules(layer_specs=[transformer_engine_layer_spec()] * num_layers,
                                          layer_norm=TENorm)
    return TransformerBlockSubmodules(layer_specs=[local_layer_spec()] * num_layers, layer_norm=Norm)


def use_transformer_engine(transformer_impl: str = "auto") -> bool:
    """`transformer_impl`: "auto" (TE when it imports and a GPU is present), "transformer_engine"
    or "local". Logs the choice."""
    if transformer_impl not in ("auto", "transformer_engine", "local"):
        raise ValueError(f"--transformer-impl must be auto, transformer_engine or local, "
                         f"not {transformer_impl!r}")
    use_te = transformer_impl == "transformer_engine" or (
        transformer_impl == "auto" and transformer_engine_available() and torch.cuda.is_available())
    if use_te:
        if not transformer_engine_available():
            raise RuntimeError("--transformer-impl transformer_engine: transformer_engine does not import")
        logger.info("Layer spec: Transformer Engine (fused norm+linear, TE fused attention)")
        return True
    from megatron_neobert.model.attention import PACKED_KERNELS, packed_attention_backend

    logger.info("Layer spec: local megatron-core modules, attention through %s (packed) and PyTorch "
                "SDPA (padded)", PACKED_KERNELS[packed_attention_backend(torch.cuda.is_available())])
    return False
