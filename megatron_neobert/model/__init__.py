"""NeoBERT on megatron-core: presets, layer specs and the model."""

from typing import Optional

from megatron_neobert.model.config import PRESETS, NeoBERTArch, get_arch, swiglu_width, transformer_config
from megatron_neobert.model.shape import (VOCAB_PADDING_MULTIPLE, ModelShape, padded_vocab_size,
                                          parallel_shape_problems, resolve_model_shape)


def build_model(arch: NeoBERTArch, config, pre_process: bool = True, post_process: bool = True,
                vp_stage: Optional[int] = None, transformer_impl: str = "auto",
                vocab_size: Optional[int] = None):
    """A `NeoBERTModel` (one pipeline stage of it) for `arch` under the megatron-core `config`, from its spec."""
    from megatron.core.transformer.spec_utils import build_module

    from megatron_neobert.model.layer_specs import neobert_model_spec

    return build_module(neobert_model_spec(config, transformer_impl, vp_stage), config=config,
                        vocab_size=vocab_size or arch.vocab_size,
                        max_sequence_length=arch.max_sequence_length, pre_process=pre_process,
                        post_process=post_process, position_embedding_type=arch.position_embedding_type,
                        rotary_base=arch.rotary_base, vp_stage=vp_stage)


__all__ = ["PRESETS", "VOCAB_PADDING_MULTIPLE", "ModelShape", "NeoBERTArch", "build_model", "get_arch",
           "padded_vocab_size", "parallel_shape_problems", "resolve_model_shape", "swiglu_width",
           "transformer_config"]
