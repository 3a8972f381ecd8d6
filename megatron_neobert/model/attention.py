"""Bidirectional core attention for the local (non-Transformer-Engine) layer spec.

It takes the place of megatron-core's `DotProductAttention`, which is causal-or-padding only
and cannot take packed sequences. Two layouts reach it from megatron-core's `SelfAttention`:
- padded `sbhd`: q, k, v `[s, b, heads, d]` with a key-padding mask `[b, 1, 1, s]` (True =
  masked out, megatron-core's convention); PyTorch SDPA;
- packed `thd`: q, k, v `[t, heads, d]` with `packed_seq_params.cu_seqlens_q`; a token only
  attends within its own document. Kernels, best first: flash-attn's varlen kernel (GPU, fp16 or
  bf16), FlexAttention with a document BlockMask (GPU, no dropout), PyTorch SDPA over segments of
  whole documents. The kernel is chosen once, when the module is built;
  `NEOBERT_PACKED_ATTENTION=flash|flex|sdpa` forces one (tests, benchmarks).

The model hands packed input down as `LocalPackedSeqParams`, made once per batch: the `PackedLayout`
every layer's kernel reads (document ids, SDPA segments, the FlexAttention block mask, each built on
first use), and, for RoPE by position, each token's cos/sin, gathered by its position in its document,
which rotate q and k with megatron-core's unfused arithmetic. megatron-core's own unfused THD RoPE
reads the document lengths to the host (`.tolist()`) and splits q and k per document in every layer.
"""

import dataclasses
import logging
import os
from functools import lru_cache
from typing import Optional

import torch
import torch.nn.functional as F
from megatron.core.packed_seq_params import PackedSeqParams
from megatron.core.transformer.enums import AttnMaskType
from megatron.core.transformer.module import MegatronModule
from megatron.core.transformer.transformer_config import TransformerConfig
from megatron.core.utils import divide

from megatron_neobert.megatron_core_compat import rotate_half

logger = logging.getLogger(__name__)

PACKED_ATTENTION_ENV = "NEOBERT_PACKED_ATTENTION"
PACKED_KERNELS = {
    "flash": "flash-attn varlen",
    "flex": "FlexAttention (torch.compile, document BlockMask)",
    "sdpa": "PyTorch SDPA over segments of whole documents (block-diagonal masks)",
}
# Segments are at least this long: a GPU attention tile, below which a shorter segment saves nothing.
_MIN_SEGMENT = 128


@lru_cache(maxsize=None)
def flash_attn_varlen():
    """flash-attn's varlen kernel, or None when flash-attn does not import."""
    try:
        from flash_attn import flash_attn_varlen_func
    except ImportError:
        return None
    return flash_attn_varlen_func


@lru_cache(maxsize=None)
def flex_attention_kernels(compiled: bool):
    """(flex_attention, create_block_mask), compiled as FlexAttention needs for speed on GPU (uncompiled
    they materialise the full score matrix), or None before torch 2.5."""
    try:
        from torch.nn.attention.flex_attention import create_block_mask, flex_attention
    except ImportError:
        return None
    if compiled:
        return torch.compile(flex_attention), torch.compile(create_block_mask)
    return flex_attention, create_block_mask


def packed_attention_backend(on_gpu: bool, half_precision: bool = True, dropout: bool = False) -> str:
    """The kernel for packed inputs: the one `NEOBERT_PACKED_ATTENTION` names, else flash-attn
    varlen (GPU, fp16/bf16) > FlexAttention (GPU, no dropout) > segmented SDPA."""
    forced = os.environ.get(PACKED_ATTENTION_ENV, "")
    if forced and forced not in PACKED_KERNELS:
        raise ValueError(f"{PACKED_ATTENTION_ENV} must be one of {', '.join(PACKED_KERNELS)}, not {forced!r}")
    if forced == "flash" and not (on_gpu and flash_attn_varlen() is not None):
        raise RuntimeError(f"{PACKED_ATTENTION_ENV}=flash needs a GPU and flash-attn")
    if forced == "flex" and (dropout or flex_attention_kernels(False) is None):
        raise RuntimeError(f"{PACKED_ATTENTION_ENV}=flex needs torch >= 2.5 and no attention dropout")
    if forced:
        return forced
    if on_gpu and half_precision and flash_attn_varlen() is not None:
        return "flash"
    if on_gpu and not dropout and flex_attention_kernels(True) is not None:
        return "flex"
    return "sdpa"


@lru_cache(maxsize=None)
def _log_packed_kernel(backend: str):
    logger.debug("Packed attention: %s", PACKED_KERNELS[backend])


class PackedLayout:
    """What the packed kernels derive from one batch's `cu_seqlens`, each part built on first use and shared by
    every layer of the step."""

    def __init__(self, cu_seqlens: torch.Tensor, total: int, max_seqlen: Optional[int]):
        self.cu_seqlens, self.total, self.max_seqlen = cu_seqlens, total, max_seqlen
        self.doc_ids = torch.bucketize(torch.arange(total, device=cu_seqlens.device),
                                       cu_seqlens[1:].to(torch.long), right=True)  # of each token
        self._segments = self._block_mask = None

    def segments(self):
        """Documents split greedily, in order, into segments of at most L tokens, for one batched SDPA:
        `gather` `[n * L]` (the token in each slot; padding slots read token 0, which is harmless as
        no real query sees them and their outputs are dropped), `scatter` `[t]` (the slot of each
        token), `keep` `[n, 1, L, L]` (True = attend: same document; padding slots see each other,
        never a fully masked row, which SDPA can turn into NaN)."""
        if self._segments is None:
            # A host loop over documents (one device sync per step): cu_seqlens holds a few per sample.
            bounds = self.cu_seqlens.tolist()
            if bounds[0] != 0 or bounds[-1] != self.total:
                raise ValueError(f"cu_seqlens must run from 0 to the {self.total} packed tokens, "
                                 f"not {bounds[0]}..{bounds[-1]}")
            lengths = [end - start for start, end in zip(bounds, bounds[1:])]
            seg_len = max(max(lengths), self.max_seqlen or 0, _MIN_SEGMENT)
            # A multiple of 16: SDPA's memory-efficient kernel pads an unaligned mask on every call.
            seg_len = -(-seg_len // 16) * 16
            first_slot, segment, used = [], 0, 0
            for length in lengths:
                if used + length > seg_len:
                    segment, used = segment + 1, 0
                first_slot.append(segment * seg_len + used)
                used += length
            device, doc = self.cu_seqlens.device, self.doc_ids
            tokens = torch.arange(self.total, device=device)
            scatter = (torch.tensor(first_slot, device=device)[doc]
                       + tokens - torch.tensor(bounds[:-1], device=device)[doc])
            gather = torch.zeros((segment + 1) * seg_len, dtype=torch.long, device=device)
            gather[scatter] = tokens
            slot_doc = torch.full_like(gather, -1)
            slot_doc[scatter] = doc
            slot_doc = slot_doc.view(segment + 1, seg_len)
            keep = (slot_doc[:, :, None] == slot_doc[:, None, :]).unsqueeze(1)
            self._segments = gather, scatter, keep
        return self._segments

    def block_mask(self, compiled: bool):
        """FlexAttention's BlockMask: a token attends to the tokens of its own document."""
        if self._block_mask is None:
            doc_ids = self.doc_ids

            def same_document(b, h, q_idx, kv_idx):
                return doc_ids[q_idx] == doc_ids[kv_idx]

            create_block_mask = flex_attention_kernels(compiled)[1]
            self._block_mask = create_block_mask(same_document, None, None, self.total, self.total,
                                                 device=doc_ids.device)
        return self._block_mask


@dataclasses.dataclass
class LocalPackedSeqParams(PackedSeqParams):
    """THD parameters as `BidirectionalAttention` reads them, made once per batch by the model: the batch's
    `PackedLayout` and, for RoPE by position, each token's cos and sin `[t, 1, 1, d]` (positions restarting at each
    document), which megatron-core's SelfAttention then does not apply (it gets no rotary_pos_emb)."""

    layout: Optional[PackedLayout] = None
    rotary_cos: Optional[torch.Tensor] = None
    rotary_sin: Optional[torch.Tensor] = None
    rotary_interleaved: bool = False

    @classmethod
    def of(cls, params: PackedSeqParams, total: int, **rotary) -> "LocalPackedSeqParams":
        fields = {f.name: getattr(params, f.name) for f in dataclasses.fields(PackedSeqParams)}
        return cls(**fields, layout=PackedLayout(params.cu_seqlens_q, total, params.max_seqlen_q), **rotary)

    @staticmethod
    def rotary_by_position(freqs: torch.Tensor, positions: torch.Tensor, dtype: torch.dtype,
                           interleaved: bool) -> dict:
        """The rotary fields for `of`: `freqs` `[max_seqlen, 1, 1, d]` (megatron-core's RotaryEmbedding) at
        `positions` `[t]`, as cos and sin in the activations' `dtype`: megatron-core's `(cos(freqs) *
        mscale).to(dtype)` with mscale 1. Device work only (a gather, no host read)."""
        token_freqs = freqs[positions]
        return dict(rotary_cos=torch.cos(token_freqs).to(dtype), rotary_sin=torch.sin(token_freqs).to(dtype),
                    rotary_interleaved=interleaved)

    def rotate(self, t: torch.Tensor) -> torch.Tensor:
        """RoPE on packed `t` `[t, heads, d]`: megatron-core's `_apply_rotary_pos_emb_bshd` on `t[:, None]`, as
        its unfused THD path calls it, with the frequencies it would gather per document."""
        t4, cos, sin = t.unsqueeze(1), self.rotary_cos.to(t.dtype), self.rotary_sin.to(t.dtype)  # no-op casts
        return ((t4 * cos) + (rotate_half(t4, self.rotary_interleaved) * sin)).squeeze(1)


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
        self.packed_backend = packed_attention_backend(
            torch.cuda.is_available(), config.bf16 or config.fp16, self.dropout_p > 0)
        _log_packed_kernel(self.packed_backend)

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
        total = query.shape[0]
        if not isinstance(params, LocalPackedSeqParams):  # a caller of the module alone
            params = LocalPackedSeqParams.of(params, total)
        if params.rotary_cos is not None:
            query, key = params.rotate(query), params.rotate(key)
        backend = self.packed_backend
        if backend == "flash":  # takes fewer key/value heads as they are (GQA)
            out = flash_attn_varlen()(query, key, value, params.cu_seqlens_q, params.cu_seqlens_kv,
                                      params.max_seqlen_q, params.max_seqlen_kv, dropout_p=dropout_p,
                                      softmax_scale=self.softmax_scale, causal=False)
            return out.reshape(total, -1)

        layout = params.layout
        if backend == "flex":
            # [t, h, d] -> [1, h, t, d]
            q, k, v = (x.transpose(0, 1).unsqueeze(0) for x in (query, key, value))
            flex_attention = flex_attention_kernels(query.is_cuda)[0]
            out = flex_attention(q, k, v, block_mask=layout.block_mask(query.is_cuda),
                                 scale=self.softmax_scale, enable_gqa=k.shape[1] != q.shape[1])
            return out.squeeze(0).transpose(0, 1).reshape(total, -1)

        gather, scatter, keep = layout.segments()
        segments, seg_len = keep.shape[0], keep.shape[-1]
        key, value = self._expand_kv(key, value, head_dim=1)
        # [t, h, d] -> [n, h, L, d]
        q, k, v = (x[gather].view(segments, seg_len, *x.shape[1:]).transpose(1, 2)
                   for x in (query, key, value))
        out = F.scaled_dot_product_attention(q, k, v, attn_mask=keep, dropout_p=dropout_p,
                                             scale=self.softmax_scale)
        return out.transpose(1, 2).reshape(segments * seg_len, -1)[scatter]
