"""Bidirectional core attention for the local (non-Transformer-Engine) layer spec.

It takes the place of megatron-core's `DotProductAttention`, which is causal-or-padding only
and cannot take packed sequences. Two layouts reach it from megatron-core's `SelfAttention`:
- padded `sbhd`: q, k, v `[s, b, heads, d]` with a key-padding mask `[b, 1, 1, s]` (True =
  masked out, megatron-core's convention);
- packed `thd`: q, k, v `[t, heads, d]` with `packed_seq_params.cu_seqlens_q`; a token only
  attends within its own document.
Kernels: flash-attn's varlen kernel for packed inputs on GPU when flash-attn imports, otherwise
PyTorch SDPA (a block-diagonal mask for packed inputs).
"""

import logging
from functools import lru_cache
from typing import Optional

import torch
import torch.nn.functional as F
from megatron.core.packed_seq_params import PackedSeqParams
from megatron.core.transformer.enums import AttnMaskType
from megatron.core.transformer.module import MegatronModule
from megatron.core.transformer.transformer_config import TransformerConfig
from megatron.core.utils import divide

logger = logging.getLogger(__name__)


@lru_cache(maxsize=None)
def flash_attn_varlen():
    """flash-attn's varlen kernel, or None when flash-attn does not import."""
    try:
        from flash_attn import flash_attn_varlen_func
    except ImportError:
        return None
    return flash_attn_varlen_func


def document_mask(cu_seqlens: torch.Tensor, total: int) -> torch.Tensor:
    """`[t, t]` bool, True where query and key belong to the same document."""
    doc_ids = torch.bucketize(torch.arange(total, device=cu_seqlens.device),
                              cu_seqlens[1:].to(torch.long), right=True)
    return doc_ids[:, None] == doc_ids[None, :]


class BidirectionalAttention(MegatronModule):
    """Non-causal softmax attention over padded or packed sequences (one TP shard of heads)."""

    def __init__(self, config: TransformerConfig, layer_number: int, attn_mask_type: AttnMaskType,
                 attention_type: str, attention_dropout: Optional[float] = None,
                 softmax_scale: Optional[float] = None, cp_comm_type: Optional[str] = None,
                 pg_collection=None):
        super().__init__(config=config)
        if config.context_parallel_size != 1:
            raise ValueError("context parallelism needs the Transformer Engine spec")
        if pg_collection is None:
            from megatron.core.process_groups_config import ProcessGroupCollection

            pg_collection = ProcessGroupCollection.use_mpu_process_groups(required_pgs=["tp"])
        tp_size = pg_collection.tp.size()
        self.heads_per_partition = divide(config.num_attention_heads, tp_size)
        self.kv_groups_per_partition = divide(config.num_query_groups or config.num_attention_heads,
                                              tp_size)
        self.softmax_scale = softmax_scale if softmax_scale is not None else config.kv_channels ** -0.5
        self.dropout_p = config.attention_dropout if attention_dropout is None else attention_dropout

    def _expand_kv(self, key, value, head_dim: int):
        repeat = self.heads_per_partition // self.kv_groups_per_partition
        if repeat > 1:
            key = key.repeat_interleave(repeat, dim=head_dim)
            value = value.repeat_interleave(repeat, dim=head_dim)
        return key, value

    def forward(self, query, key, value, attention_mask, attn_mask_type=None, attention_bias=None,
                packed_seq_params: Optional[PackedSeqParams] = None):
        dropout_p = self.dropout_p if self.training else 0.0
        if packed_seq_params is not None:
            return self._forward_packed(query, key, value, packed_seq_params, dropout_p)

        # [s, b, h, d] -> [b, h, s, d]
        q, k, v = (x.permute(1, 2, 0, 3) for x in (query, key, value))
        k, v = self._expand_kv(k, v, head_dim=1)
        keep = None if attention_mask is None else ~attention_mask  # SDPA: True = attend
        out = F.scaled_dot_product_attention(q, k, v, attn_mask=keep, dropout_p=dropout_p,
                                             scale=self.softmax_scale)
        s, b = query.shape[0], query.shape[1]
        return out.permute(2, 0, 1, 3).reshape(s, b, -1)

    def _forward_packed(self, query, key, value, params: PackedSeqParams, dropout_p: float):
        key, value = self._expand_kv(key, value, head_dim=1)
        cu_seqlens = params.cu_seqlens_q
        kernel = flash_attn_varlen() if query.is_cuda else None
        if kernel is not None:
            out = kernel(query, key, value, cu_seqlens, params.cu_seqlens_kv, params.max_seqlen_q,
                         params.max_seqlen_kv, dropout_p=dropout_p,
                         softmax_scale=self.softmax_scale, causal=False)
            return out.reshape(out.shape[0], -1)
        total = query.shape[0]
        keep = document_mask(cu_seqlens, total)
        # [t, h, d] -> [1, h, t, d]
        q, k, v = (x.transpose(0, 1).unsqueeze(0) for x in (query, key, value))
        out = F.scaled_dot_product_attention(q, k, v, attn_mask=keep, dropout_p=dropout_p,
                                             scale=self.softmax_scale)
        return out.squeeze(0).transpose(0, 1).reshape(total, -1)
