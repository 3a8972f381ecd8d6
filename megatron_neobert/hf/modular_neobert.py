# Copyright 2025 Chandar Research Lab and the megatron_neobert authors. All rights reserved.
#
# Licensed under the Apache License, Version 2.0 (the "License");
# you may not use this file except in compliance with the License.
# You may obtain a copy of the License at
#
#     http://www.apache.org/licenses/LICENSE-2.0
#
# Unless required by applicable law or agreed to in writing, software
# distributed under the License is distributed on an "AS IS" BASIS,
# WITHOUT WARRANTIES OR CONDITIONS OF ANY KIND, either express or implied.
# See the License for the specific language governing permissions and
# limitations under the License.
"""NeoBERT (Le Breton et al., 2025): a pre-RMSNorm encoder with SwiGLU and rotary positions.

Written as transformers writes a model: this modular file is what transformers' `utils/modular_model_converter.py`
turns into `configuration_neobert.py` and `modeling_neobert.py` (relative imports of transformers become absolute
ones in this package's copies). Module names reproduce the published `chandar-lab/NeoBERT` checkpoint keys
(`model.encoder`, `model.transformer_encoder.{i}.{attention_norm,qkv,wo,ffn_norm,ffn.w12,ffn.w3}`,
`model.layer_norm`, `decoder`), and its `config.json` loads as it is.

What is NeoBERT's own:
- RoPE rotates interleaved pairs (2i, 2i+1), as the published complex form does (Cohere's rotation), in fp32;
- `attention_mask` takes the formats transformers takes: [batch, length] 0/1 or bool, or a 4D additive or bool
  mask; positions count real tokens only, so left and right padding give the same result;
- padding-free batches (`DataCollatorWithFlattening`: `cu_seq_lens_q/k` + `max_length_q/k`, or restarting
  `position_ids`, or `cu_seqlens` / `max_seqlen`): tokens never attend across documents on any implementation;
  flash-attn's varlen kernel runs them as they are, the others regroup the documents into a
  [documents, longest document] batch, so memory grows with the documents, never with the square of the batch;
- forward reads no tensor value on the host when the documents come with their longest length: the input checks
  that read values run only on CPU tensors (where a read costs no device synchronisation) and never when traced,
  so padded and packed batches export and compile without graph breaks;
- heads for question answering and multiple choice, sequence classification of packed documents,
  `classifier_pooling` = "cls" | "mean", and losses that honour the Trainer's `num_items_in_batch`.
"""

import copy
from typing import Literal

import torch
import torch.nn.functional as F
from huggingface_hub.dataclasses import strict
from torch import nn

from ... import initialization as init
from ...configuration_utils import PreTrainedConfig
from ...loss.loss_utils import fixed_cross_entropy
from ...masking_utils import create_bidirectional_mask
from ...modeling_layers import GradientCheckpointingLayer
from ...modeling_outputs import (
    BaseModelOutput,
    MaskedLMOutput,
    MultipleChoiceModelOutput,
    QuestionAnsweringModelOutput,
    SequenceClassifierOutput,
    TokenClassifierOutput,
)
from ...modeling_rope_utils import RopeParameters
from ...modeling_utils import ALL_ATTENTION_FUNCTIONS, PreTrainedModel
from ...processing_utils import Unpack
from ...utils import TransformersKwargs, is_tracing
from ...utils.generic import can_return_tuple
from ...utils.output_capturing import capture_outputs
from ..align.modeling_align import eager_attention_forward
from ..cohere.modeling_cohere import CohereRotaryEmbedding, apply_rotary_pos_emb
from ..llama.modeling_llama import LlamaRMSNorm


def published_swiglu_width(intermediate_size: int, multiple_of: int = 8) -> int:
    """The SwiGLU width of the published code for its nominal `intermediate_size`: int(2/3 * I) rounded up to
    `multiple_of` (3072 -> 2048)."""
    width = int(2 * intermediate_size / 3)
    return multiple_of * ((width + multiple_of - 1) // multiple_of)


@strict
class NeoBERTConfig(PreTrainedConfig):
    r"""
    Configuration of a NeoBERT encoder. Field names and defaults are those of the published `config.json`
    (`chandar-lab/NeoBERT`), which loads as it is; `head_dim` and `max_position_embeddings` are aliases of
    `dim_head` and `max_length`.

    Args:
        vocab_size (`int`, *optional*, defaults to 30522):
            Vocabulary size.
        hidden_size (`int`, *optional*, defaults to 768):
            Width of the encoder.
        intermediate_size (`int`, *optional*, defaults to 3072):
            The published nominal FFN size; the real SwiGLU width is `ffn_hidden_size`.
        ffn_hidden_size (`int`, *optional*):
            The real width of each of the SwiGLU gate and up projections. By default the published rule applied
            to `intermediate_size` (int(2/3 * I) rounded up to 8: 3072 -> 2048).
        num_hidden_layers (`int`, *optional*, defaults to 28):
            Number of encoder blocks.
        num_attention_heads (`int`, *optional*, defaults to 12):
            Attention heads per block.
        dim_head (`int`, *optional*):
            Per-head size; `hidden_size // num_attention_heads` by default.
        max_length (`int`, *optional*, defaults to 4096):
            The trained context length (RoPE itself has no length limit).
        pad_token_id (`int`, *optional*, defaults to 0):
            Padding token id.
        norm_eps (`float`, *optional*, defaults to 1e-05):
            RMSNorm epsilon.
        embedding_init_range (`float`, *optional*, defaults to 0.02):
            Embeddings are initialised uniform(-r, r).
        decoder_init_range (`float`, *optional*, defaults to 0.02):
            Linear layers of the encoder and the MLM decoder are initialised uniform(-r, r).
        classifier_init_range (`float`, *optional*, defaults to 0.02):
            Standard deviation of the classification heads' normal initialisation.
        classifier_dropout (`float`, *optional*, defaults to 0.1):
            Dropout of the classification heads.
        classifier_pooling (`str`, *optional*, defaults to `"cls"`):
            What the sequence classification and multiple choice heads read: `"cls"` (the first token, as
            published) or `"mean"` (the mean over real tokens).
        rope_parameters (`RopeParameters`, *optional*):
            RoPE settings as transformers defines them (`rope_theta`, and a `rope_type` of transformers' RoPE
            functions with its parameters, e.g. `{"rope_type": "yarn", "factor": 2.0}` to evaluate past the
            trained length).
        tie_word_embeddings (`bool`, *optional*, defaults to `False`):
            The MLM decoder is a matrix of its own, with a bias: never tied to the embedding.
    """

    model_type = "neobert"
    attribute_map = {"head_dim": "dim_head", "max_position_embeddings": "max_length"}
    default_theta = 10000.0

    vocab_size: int = 30522
    hidden_size: int = 768
    intermediate_size: int = 3072
    ffn_hidden_size: int | None = None
    num_hidden_layers: int = 28
    num_attention_heads: int = 12
    dim_head: int | None = None
    max_length: int = 4096
    pad_token_id: int | None = 0
    norm_eps: float = 1e-5
    embedding_init_range: float = 0.02
    decoder_init_range: float = 0.02
    classifier_init_range: float = 0.02
    classifier_dropout: float | int | None = 0.1
    classifier_pooling: Literal["cls", "mean"] = "cls"
    rope_parameters: RopeParameters | dict | None = None
    tie_word_embeddings: bool = False

    def __post_init__(self, **kwargs):
        # The published config.json stores extra constructor arguments under a literal "kwargs" key.
        published_kwargs = kwargs.pop("kwargs", None)
        if isinstance(published_kwargs, dict) and "classifier_dropout" in published_kwargs:
            self.classifier_dropout = published_kwargs["classifier_dropout"]
        sizes = {"hidden_size": self.hidden_size, "intermediate_size": self.intermediate_size,
                 "num_hidden_layers": self.num_hidden_layers, "num_attention_heads": self.num_attention_heads,
                 "vocab_size": self.vocab_size, "max_length": self.max_length}
        bad = [f"{name}={value!r}" for name, value in sizes.items() if value < 1]
        if bad:
            raise ValueError(f"NeoBERT config: {', '.join(bad)}: sizes must be positive")
        if self.hidden_size % self.num_attention_heads != 0:
            raise ValueError(
                f"hidden_size ({self.hidden_size}) must be divisible by num_attention_heads ({self.num_attention_heads})"
            )
        if self.dim_head is None:
            self.dim_head = self.hidden_size // self.num_attention_heads
        if self.dim_head * self.num_attention_heads != self.hidden_size:
            raise ValueError(
                f"dim_head ({self.dim_head}) * num_attention_heads ({self.num_attention_heads}) must equal "
                f"hidden_size ({self.hidden_size})"
            )
        if self.dim_head % 2 != 0:
            raise ValueError(f"RoPE rotates pairs of dimensions: dim_head must be even, got {self.dim_head}")
        if self.ffn_hidden_size is None:
            self.ffn_hidden_size = published_swiglu_width(self.intermediate_size)
        if self.ffn_hidden_size < 1:
            raise ValueError(f"NeoBERT config: ffn_hidden_size={self.ffn_hidden_size!r}: sizes must be positive")
        super().__post_init__(**kwargs)


class NeoBERTRMSNorm(LlamaRMSNorm):
    pass


class NeoBERTRotaryEmbedding(CohereRotaryEmbedding):
    """cos/sin of interleaved pairs, kept in fp32 whatever the activations' dtype: rotating bf16 or fp16 queries by
    reduced-precision angles loses the positions of long sequences."""

    def forward(self, x, position_ids):
        freqs = position_ids[..., None].float() * self.inv_freq.to(device=x.device, dtype=torch.float)
        emb = torch.repeat_interleave(freqs, 2, dim=-1)
        return emb.cos() * self.attention_scaling, emb.sin() * self.attention_scaling


MASK_FORMATS = (
    "attention_mask must be [batch, length] with 1 (or True) for real tokens and 0 (or False) for padding, or 4D "
    "[batch, 1 or heads, 1 or length, length], either additive float (0 to attend, a large negative number or -inf "
    "not to) or bool (True to attend)"
)


def values_are_checkable(tensor: torch.Tensor) -> bool:
    """Whether the input checks may read `tensor`'s values: on the CPU a read costs no device synchronisation, on an
    accelerator it would stall every forward, and a traced forward has no values to read."""
    return tensor.device.type == "cpu" and not is_tracing(tensor)


def additive_mask(keep: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """0 where `keep`, else the most negative finite number of `dtype` (never -inf: a row with no visible key then
    gives uniform weights, not NaN)."""
    zero = torch.zeros((), dtype=dtype, device=keep.device)
    return torch.where(keep, zero, torch.finfo(dtype).min)


def is_flash(attn_implementation: str) -> bool:
    return "flash" in attn_implementation


def checked_padding_mask(mask: torch.Tensor, batch: int, length: int) -> torch.Tensor:
    """The [batch, length] keep mask of a 2D `attention_mask`; its values are checked (0/1) where that is free."""
    if tuple(mask.shape) != (batch, length):
        raise ValueError(
            f"attention_mask has shape {tuple(mask.shape)}, the input is [batch, length] = [{batch}, {length}]"
        )
    if mask.dtype != torch.bool:
        if mask.dtype.is_complex:
            raise ValueError(f"{MASK_FORMATS}; got a complex mask")
        if values_are_checkable(mask) and bool(((mask != 0) & (mask != 1)).any()):
            raise ValueError(
                f"{MASK_FORMATS}. This [batch, length] mask holds values other than 0 and 1 (an additive 0/-inf "
                f"mask?): give an additive mask the 4D shape [batch, 1, 1, length], or convert it to 0/1"
            )
    return mask.bool()


def additive_4d_mask(mask, batch: int, length: int, num_heads: int, dtype: torch.dtype, attn_implementation: str):
    """A 4D `attention_mask` as an additive bias, which eager, sdpa and flex attention all take."""
    b, h, q, k = mask.shape
    if b not in (1, batch) or h not in (1, num_heads) or q not in (1, length) or k != length:
        raise ValueError(
            f"4D attention_mask has shape {tuple(mask.shape)}, which does not broadcast to [batch, heads, length, "
            f"length] = [{batch}, {num_heads}, {length}, {length}]"
        )
    if is_flash(attn_implementation):
        raise ValueError(
            f"attn_implementation={attn_implementation!r} takes a [batch, length] padding mask, not a 4D one; "
            f"use 'sdpa', 'eager' or 'flex_attention' for arbitrary masks"
        )
    if mask.dtype == torch.bool:
        bias = additive_mask(mask, dtype)
    elif mask.dtype.is_floating_point:
        if values_are_checkable(mask) and bool((mask > 0).any()):
            raise ValueError(
                f"{MASK_FORMATS}. This 4D float mask has positive values (a 0/1 mask?): a 4D float mask is "
                f"additive; give 0/1 masks as [batch, length] or as bool"
            )
        bias = mask.to(dtype).clamp(min=torch.finfo(dtype).min)  # -inf rows would give NaN
    else:
        raise ValueError(f"{MASK_FORMATS}; got a 4D {mask.dtype} mask")
    if attn_implementation == "flex_attention":
        if h != 1:
            raise ValueError("flex_attention takes a 4D attention_mask with one head dimension [batch, 1, ...]")
        bias = bias.expand(batch, 1, length, length)  # flex indexes it per (batch, query, key)
    return bias


def key_padding_mask(keep: torch.Tensor, dtype: torch.dtype, attn_implementation: str):
    """The mask of a regrouped pack ([documents, longest] keep mask): flex attention's block mask, else a
    [documents, 1, 1, longest] additive bias, which grows with the tokens, not with the documents times the
    longest one squared. Every row sees its first slot, so no row is fully masked (an empty document's row would
    otherwise give NaN in sdpa's and flex's kernels, and its gradient would reach the token gathered there)."""
    keep = keep.clone()
    keep[:, 0] = True
    if attn_implementation == "flex_attention":
        from torch.nn.attention.flex_attention import create_block_mask

        documents, longest = keep.shape
        return create_block_mask(lambda b, h, q, kv: keep[b, kv], documents, None, longest, longest, device=keep.device)
    return additive_mask(keep, dtype)[:, None, None, :]


class PackedDocuments:
    """Where the documents of a padding-free batch lie among its flattened batch * length tokens. Tokens after
    the last boundary form one more document (possibly empty), so nothing here depends on the boundaries' values."""

    def __init__(self, cu_seqlens: torch.Tensor, max_seqlen: int | None, total: int):
        cu_seqlens = cu_seqlens.to(torch.int32).flatten()
        if cu_seqlens.numel() < 2:
            raise ValueError("cu_seqlens must start at 0 and hold at least one document boundary")
        if values_are_checkable(cu_seqlens):
            if int(cu_seqlens[0]) != 0:
                raise ValueError("cu_seqlens must start at 0 and hold at least one document boundary")
            if bool((cu_seqlens[1:] < cu_seqlens[:-1]).any()) or int(cu_seqlens[-1]) > total:
                raise ValueError(f"cu_seqlens must be non-decreasing and end at most at the {total} tokens given")
        self.cu_seqlens = torch.cat([cu_seqlens, cu_seqlens.new_full((1,), total)])
        self.lengths = self.cu_seqlens[1:] - self.cu_seqlens[:-1]
        if max_seqlen is None:  # the one host read of a pack: give max_seqlen (max_length_q) to avoid it
            max_seqlen = int(self.lengths.max())
        elif values_are_checkable(self.lengths) and int(max_seqlen) < int(self.lengths.max()):
            raise ValueError(
                f"max_seqlen={int(max_seqlen)} is shorter than the longest document ({int(self.lengths.max())} tokens)"
            )
        self.max_seqlen = max(int(max_seqlen), 1)
        tokens = torch.arange(total, device=cu_seqlens.device, dtype=torch.int32)
        self.doc_ids = torch.searchsorted(self.cu_seqlens[1:], tokens, right=True)
        self.position_ids = (tokens - self.cu_seqlens[self.doc_ids]).long()

    @classmethod
    def from_position_ids(cls, position_ids: torch.Tensor) -> "PackedDocuments | None":
        """Documents of a [batch, length] padding-free batch (a new one wherever positions restart), or None when
        each row is one sequence. Reads the positions on the host: give cu_seq_lens_q and max_length_q instead
        (`DataCollatorWithFlattening(return_flash_attn_kwargs=True)`) for a forward without that read."""
        batch, length = position_ids.shape
        starts = torch.ones_like(position_ids, dtype=torch.bool)
        starts[:, 1:] = position_ids[:, 1:] <= position_ids[:, :-1]
        if not bool(starts[:, 1:].any()):
            return None
        starts_at = starts.flatten().nonzero().flatten()
        return cls(torch.cat([starts_at, starts_at.new_full((1,), batch * length)]), None, batch * length)

    @classmethod
    def of_inputs(cls, attention_mask, position_ids, batch: int, length: int, device, cu_seqlens, max_seqlen,
                  kwargs: dict) -> "PackedDocuments | None":
        """The documents given as `cu_seqlens` (ours, or transformers' `cu_seq_lens_q/k`), or by restarting
        `position_ids` without an attention mask (not when traced); None for a padded or plain batch."""
        cu_seq_lens_q, cu_seq_lens_k = kwargs.get("cu_seq_lens_q"), kwargs.get("cu_seq_lens_k")
        if cu_seq_lens_q is not None or cu_seq_lens_k is not None:
            if cu_seqlens is not None:
                raise ValueError("Give the documents as cu_seqlens or as cu_seq_lens_q/k, not both")
            if cu_seq_lens_q is not None and cu_seq_lens_k is not None and cu_seq_lens_q is not cu_seq_lens_k:
                if cu_seq_lens_q.shape != cu_seq_lens_k.shape or (
                    values_are_checkable(cu_seq_lens_q) and not torch.equal(cu_seq_lens_q, cu_seq_lens_k.cpu())
                ):
                    raise ValueError("NeoBERT is self-attention only: cu_seq_lens_q and cu_seq_lens_k must be equal")
            cu_seqlens = cu_seq_lens_q if cu_seq_lens_q is not None else cu_seq_lens_k
            max_length_q = kwargs.get("max_length_q")
            max_seqlen = max_length_q if max_length_q is not None else kwargs.get("max_length_k")
        if cu_seqlens is not None:
            if (
                attention_mask is not None
                and values_are_checkable(attention_mask)
                and not bool(attention_mask.bool().all())
            ):
                raise ValueError(
                    "Packed inputs (cu_seqlens) take no padding mask: leave padding out of the pack, or put it "
                    "after cu_seqlens[-1] where it forms its own document."
                )
            return cls(cu_seqlens.to(device), max_seqlen, batch * length)
        if attention_mask is None and position_ids is not None and not is_tracing(position_ids):
            return cls.from_position_ids(position_ids.to(device).reshape(-1, length).expand(batch, length))
        return None

    def regrouped(self):
        """index [documents, longest] of each document's tokens (0 past its end), valid [documents, longest], and
        each token's place in that grid (flattened)."""
        slots = torch.arange(self.max_seqlen, device=self.cu_seqlens.device)
        valid = slots[None, :] < self.lengths[:, None]
        index = torch.where(valid, self.cu_seqlens[:-1, None].long() + slots, 0)
        return index, valid, self.doc_ids.long() * self.max_seqlen + self.position_ids

    def first_tokens(self) -> torch.Tensor:
        """The flat index of each given document's first token (the trailing pack-padding document excluded)."""
        return self.cu_seqlens[:-2].long()


class NeoBERTSwiGLU(nn.Module):
    """w3(silu(x W_gate^T) * x W_up^T) with w12 = [gate; up], no biases."""

    def __init__(self, hidden_size: int, ffn_hidden_size: int):
        super().__init__()
        self.w12 = nn.Linear(hidden_size, 2 * ffn_hidden_size, bias=False)
        self.w3 = nn.Linear(ffn_hidden_size, hidden_size, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        gate, up = self.w12(x).chunk(2, dim=-1)
        return self.w3(F.silu(gate) * up)


class NeoBERTAttention(nn.Module):
    """Softmax attention of rotated q, k and v through transformers' attention interface. Holds no weights: the
    published checkpoint keeps `qkv` and `wo` on the block. Returns (output [batch, length, heads, dim], weights
    or None), so `output_attentions` can record the weights here."""

    def __init__(self, config: NeoBERTConfig):
        super().__init__()
        self.config = config
        self.is_causal = False
        self.scaling = config.dim_head**-0.5

    def forward(self, query, key, value, attention_mask=None, documents: PackedDocuments | None = None,
                attn_implementation: str = "eager", position_ids=None):
        interface = ALL_ATTENTION_FUNCTIONS.get_interface(attn_implementation, eager_attention_forward)
        if documents is not None:
            return self._packed(interface, query, key, value, documents, attn_implementation)
        extra = {"position_ids": position_ids} if is_flash(attn_implementation) else {}
        q, k, v = (t.transpose(1, 2) for t in (query, key, value))
        return interface(self, q, k, v, attention_mask, dropout=0.0, scaling=self.scaling, is_causal=False, **extra)

    def _packed(self, interface, query, key, value, documents: PackedDocuments, attn_implementation: str):
        batch, length, heads, dim = query.shape
        q, k, v = (t.reshape(batch * length, heads, dim) for t in (query, key, value))
        weights = None
        if is_flash(attn_implementation):  # varlen kernel on the flat tokens
            cu, longest = documents.cu_seqlens, documents.max_seqlen
            out, _ = interface(self, *(t.transpose(0, 1)[None] for t in (q, k, v)), None, dropout=0.0,
                               scaling=self.scaling, is_causal=False, cu_seq_lens_q=cu, cu_seq_lens_k=cu,
                               max_length_q=longest, max_length_k=longest)
        else:  # regroup into [documents, longest document]: memory grows with the documents, not the batch squared
            index, valid, grid = documents.regrouped()
            mask = key_padding_mask(valid, q.dtype, attn_implementation)
            out, grouped_weights = interface(self, *(t[index].transpose(1, 2) for t in (q, k, v)), mask,
                                             dropout=0.0, scaling=self.scaling, is_causal=False)
            out = out.reshape(-1, heads, dim)[grid]
            if attn_implementation == "eager":
                weights = self._scatter_weights(grouped_weights, index, valid, batch * length)
        return out.reshape(batch, length, heads, dim), weights

    @staticmethod
    def _scatter_weights(grouped, index, valid, total):
        """[documents, heads, S, S] weights -> [1, heads, T, T] over the flat tokens (zero across documents)."""
        pairs = valid[:, :, None] & valid[:, None, :]
        rows = index[:, :, None].expand_as(pairs)[pairs]
        cols = index[:, None, :].expand_as(pairs)[pairs]
        dense = grouped.new_zeros(grouped.shape[1], total, total)
        dense[:, rows, cols] = grouped.transpose(0, 1)[:, pairs]
        return dense[None]


class NeoBERTEncoderBlock(GradientCheckpointingLayer):
    """Pre-norm block: x + attn(norm(x)), then x + ffn(norm(x))."""

    def __init__(self, config: NeoBERTConfig):
        super().__init__()
        self.config = config
        self.num_heads = config.num_attention_heads
        self.dim_head = config.dim_head
        self.attention_norm = NeoBERTRMSNorm(config.hidden_size, config.norm_eps)
        self.qkv = nn.Linear(config.hidden_size, 3 * config.hidden_size, bias=False)
        self.wo = nn.Linear(config.hidden_size, config.hidden_size, bias=False)
        self.attention = NeoBERTAttention(config)
        self.ffn_norm = NeoBERTRMSNorm(config.hidden_size, config.norm_eps)
        self.ffn = NeoBERTSwiGLU(config.hidden_size, config.ffn_hidden_size)

    def forward(self, hidden_states, attention_mask=None, position_embeddings=None, documents=None,
                attn_implementation: str = "eager", position_ids=None):
        # hidden_states is positional: reentrant gradient checkpointing only sees positional tensors.
        cos, sin = position_embeddings
        x = self.attention_norm(hidden_states)
        batch, length, hidden = x.shape
        # qkv rows are grouped per head ([q_h; k_h; v_h] for each head h), as in the published weights.
        q, k, v = self.qkv(x).view(batch, length, self.num_heads, 3 * self.dim_head).chunk(3, dim=-1)
        q, k = apply_rotary_pos_emb(q, k, cos, sin, unsqueeze_dim=2)
        attn, _ = self.attention(q, k, v, attention_mask, documents=documents,
                                 attn_implementation=attn_implementation, position_ids=position_ids)
        hidden_states = hidden_states + self.wo(attn.reshape(batch, length, hidden))
        return hidden_states + self.ffn(self.ffn_norm(hidden_states))


class NeoBERTKwargs(TransformersKwargs, total=False):
    """transformers' keyword arguments (`num_items_in_batch`, `output_hidden_states`, `output_attentions`,
    `cu_seq_lens_q/k`, `max_length_q/k`), and NeoBERT's own name for packed documents."""

    cu_seqlens: torch.Tensor
    max_seqlen: int


class NeoBERTPreTrainedModel(PreTrainedModel):
    config_class = NeoBERTConfig
    base_model_prefix = "model"
    supports_gradient_checkpointing = True
    _no_split_modules = ["NeoBERTEncoderBlock"]
    _supports_sdpa = True
    _supports_flash_attn = True
    _supports_flex_attn = True
    _supports_attention_backend = True
    _can_record_outputs = {"hidden_states": NeoBERTEncoderBlock, "attentions": NeoBERTAttention}
    # Loading an MLM checkpoint into the bare encoder or a classifier leaves the decoder out, by design.
    _keys_to_ignore_on_load_unexpected = [r"^decoder\."]

    def _init_weights(self, module):
        if isinstance(module, nn.Linear):
            init.uniform_(module.weight, -self.config.decoder_init_range, self.config.decoder_init_range)
            if module.bias is not None:
                init.zeros_(module.bias)
        elif isinstance(module, nn.Embedding):
            init.uniform_(module.weight, -self.config.embedding_init_range, self.config.embedding_init_range)
            if module.padding_idx is not None and not getattr(module.weight, "_is_hf_initialized", False):
                init.zeros_(module.weight[module.padding_idx])
        else:
            super()._init_weights(module)


class NeoBERT(NeoBERTPreTrainedModel):
    """The encoder. `last_hidden_state` is taken after the final RMSNorm.

    `hidden_states` (when requested) follows the transformers convention for pre-norm models: the input of
    each block (embeddings first), then the final normalised output, i.e. num_hidden_layers + 1 tensors.
    """

    def __init__(self, config: NeoBERTConfig):
        super().__init__(config)
        self.encoder = nn.Embedding(config.vocab_size, config.hidden_size, padding_idx=config.pad_token_id)
        self.rotary_emb = NeoBERTRotaryEmbedding(config)
        self.transformer_encoder = nn.ModuleList(NeoBERTEncoderBlock(config) for _ in range(config.num_hidden_layers))
        self.layer_norm = NeoBERTRMSNorm(config.hidden_size, config.norm_eps)
        self.gradient_checkpointing = False
        self.post_init()

    def get_input_embeddings(self):
        return self.encoder

    def set_input_embeddings(self, value):
        self.encoder = value

    @capture_outputs
    def forward(
        self,
        input_ids: torch.Tensor | None = None,
        attention_mask: torch.Tensor | None = None,
        position_ids: torch.Tensor | None = None,
        inputs_embeds: torch.Tensor | None = None,
        cu_seqlens: torch.Tensor | None = None,
        max_seqlen: int | None = None,
        **kwargs: Unpack[NeoBERTKwargs],
    ) -> BaseModelOutput:
        """
        Args:
            attention_mask: [batch, length] 1 (or True) for real tokens, 0 for padding; or a 4D additive / bool mask
                (see MASK_FORMATS). Optional.
            position_ids: RoPE positions; by default 0.. per sequence, counting real tokens only (so left and right
                padding give the same result). Without an attention_mask, positions that restart (padding-free
                batches from `DataCollatorWithFlattening`) start a new document.
            cu_seqlens / max_seqlen (or transformers' cu_seq_lens_q/k, max_length_q/k): packed documents.
                `cu_seqlens` holds the cumulative document lengths over the flattened `batch * length` tokens;
                tokens never attend across documents and positions restart at each one. Tokens after
                `cu_seqlens[-1]` form one more document.
        """
        if (input_ids is None) == (inputs_embeds is None):
            raise ValueError("Specify exactly one of input_ids or inputs_embeds")
        x = self.encoder(input_ids) if input_ids is not None else inputs_embeds
        if x.dim() == 2:  # a single unbatched sequence
            x = x[None]
        batch, length, _ = x.shape
        # Attention weights exist only on the eager path (as `capture_outputs` reads the flag): a call that returns
        # them runs eagerly, whatever the model's implementation.
        attn_implementation = (
            "eager" if kwargs.get("output_attentions", self.config.output_attentions) else self.config._attn_implementation
        )

        documents = PackedDocuments.of_inputs(
            attention_mask, position_ids, batch, length, x.device, cu_seqlens, max_seqlen, kwargs
        )
        mask = None
        if documents is not None:
            if position_ids is None:
                position_ids = documents.position_ids
        elif attention_mask is not None and attention_mask.dim() == 4:
            mask = additive_4d_mask(
                attention_mask.to(x.device), batch, length, self.config.num_attention_heads, x.dtype,
                attn_implementation,
            )
        elif attention_mask is not None:
            if attention_mask.dim() != 2:
                raise ValueError(f"{MASK_FORMATS}; got shape {tuple(attention_mask.shape)}")
            keep = checked_padding_mask(attention_mask.to(x.device), batch, length)
            mask = create_bidirectional_mask(self._config_for(attn_implementation), x, keep)
            if position_ids is None:
                position_ids = (keep.long().cumsum(-1) - 1).clamp(min=0)
        elif position_ids is not None and not is_flash(attn_implementation):
            # Traced (so no data-dependent documents): restarting positions become a dense per-row document mask.
            pos = position_ids.to(x.device).reshape(-1, length).expand(batch, length)
            starts = torch.cat([torch.ones_like(pos[:, :1], dtype=torch.bool), pos[:, 1:] <= pos[:, :-1]], dim=1)
            doc = starts.long().cumsum(-1)
            mask = additive_mask(doc[:, :, None] == doc[:, None, :], x.dtype)[:, None]
            if attn_implementation == "flex_attention":
                mask = mask.expand(batch, 1, length, length)
        if position_ids is None:
            position_ids = torch.arange(length, device=x.device)
        position_ids = position_ids.to(x.device).reshape(-1, length).expand(batch, length)
        position_embeddings = self.rotary_emb(x, position_ids)

        for layer in self.transformer_encoder:
            x = layer(x, mask, position_embeddings, documents=documents, attn_implementation=attn_implementation,
                      position_ids=position_ids)
        return BaseModelOutput(last_hidden_state=self.layer_norm(x))

    def _config_for(self, attn_implementation: str) -> NeoBERTConfig:
        """The config `create_bidirectional_mask` reads the implementation from: a copy naming eager when this call
        runs eagerly to return attention weights."""
        if attn_implementation == self.config._attn_implementation:
            return self.config
        config = copy.copy(self.config)
        config._attn_implementation = attn_implementation
        return config


def items_mean(loss, logits: torch.Tensor, labels: torch.Tensor, num_items_in_batch=None) -> torch.Tensor:
    """`loss` over the items: their mean, or with the HF Trainer's `num_items_in_batch` (items in the whole
    accumulated batch) their sum divided by it, so gradient accumulation gives the full batch's gradient.
    transformers' regression and multi-label losses always take each micro-batch's mean."""
    labels = labels.to(logits.device)
    if num_items_in_batch is None:
        return loss(logits.float(), labels)
    if torch.is_tensor(num_items_in_batch):
        num_items_in_batch = num_items_in_batch.to(logits.device)
    return loss(logits.float(), labels, reduction="sum") / num_items_in_batch


class NeoBERTLMHead(NeoBERTPreTrainedModel):
    """NeoBERT with its MLM decoder: a single Linear (with bias) on the final-normed states, untied."""

    def __init__(self, config: NeoBERTConfig):
        super().__init__(config)
        self.model = NeoBERT(config)
        self.decoder = nn.Linear(config.hidden_size, config.vocab_size)
        # The published class name does not say which loss it takes (transformers reads it from "...ForMaskedLM").
        self.loss_type = "ForMaskedLM"
        self.post_init()

    def get_output_embeddings(self):
        return self.decoder

    def set_output_embeddings(self, value):
        self.decoder = value

    @can_return_tuple
    def forward(self, input_ids=None, attention_mask=None, position_ids=None, inputs_embeds=None, labels=None,
                **kwargs: Unpack[NeoBERTKwargs]) -> MaskedLMOutput:
        """`labels`: token ids to predict, -100 where no prediction is scored. Other keyword arguments go to
        `NeoBERT.forward` (packed documents, output_hidden_states, output_attentions)."""
        out = self.model(input_ids=input_ids, attention_mask=attention_mask, position_ids=position_ids,
                         inputs_embeds=inputs_embeds, return_dict=True, **kwargs)
        logits = self.decoder(out.last_hidden_state)
        loss = None
        if labels is not None:
            loss = self.loss_function(logits, labels, vocab_size=self.config.vocab_size, **kwargs)
        return MaskedLMOutput(loss=loss, logits=logits, hidden_states=out.hidden_states, attentions=out.attentions)


class NeoBERTClassifierBase(NeoBERTPreTrainedModel):
    """Shared by the classification heads: dropout -> dense -> tanh -> dropout -> classifier."""

    def __init__(self, config: NeoBERTConfig, num_outputs: int | None = None):
        super().__init__(config)
        self.num_labels = config.num_labels
        self.model = NeoBERT(config)
        self.dense = nn.Linear(config.hidden_size, config.hidden_size)
        self.dropout = nn.Dropout(config.classifier_dropout or 0.0)
        self.classifier = nn.Linear(config.hidden_size, config.num_labels if num_outputs is None else num_outputs)
        self.post_init()

    def _init_weights(self, module):
        # The published heads draw from N(0, classifier_init_range) with zero bias.
        if module is getattr(self, "dense", None) or module is getattr(self, "classifier", None):
            init.normal_(module.weight, mean=0.0, std=self.config.classifier_init_range)
            init.zeros_(module.bias)
        else:
            super()._init_weights(module)

    def _head(self, states: torch.Tensor) -> torch.Tensor:
        x = self.dropout(states)
        x = torch.tanh(self.dense(x))
        return self.classifier(self.dropout(x))

    def _pool(self, states: torch.Tensor, attention_mask, position_ids, kwargs: dict) -> torch.Tensor:
        """One vector per sequence: the first real token ("cls", the published head) or the mean over real tokens.
        A padding-free batch gives one vector per document."""
        batch, length = states.shape[:2]
        documents = PackedDocuments.of_inputs(attention_mask, position_ids, batch, length, states.device,
                                              kwargs.get("cu_seqlens"), kwargs.get("max_seqlen"), kwargs)
        if documents is not None:
            flat = states.reshape(batch * length, -1)
            if self.config.classifier_pooling == "cls":
                return flat[documents.first_tokens()]
            count = documents.lengths.numel() - 1
            sums = flat.new_zeros(count + 1, flat.shape[-1]).index_add_(0, documents.doc_ids.long(), flat)
            return sums[:count] / documents.lengths[:count, None].clamp(min=1).to(flat.dtype)
        if attention_mask is not None and attention_mask.dim() != 2:
            raise ValueError(
                f"{type(self).__name__} pools over a [batch, length] attention_mask, got a {attention_mask.dim()}D one"
            )
        if attention_mask is None:
            keep = torch.ones(states.shape[:2], dtype=torch.bool, device=states.device)
        else:
            keep = attention_mask.to(states.device).bool()
        if self.config.classifier_pooling == "mean":
            weights = keep.to(states.dtype)[..., None]
            return (states * weights).sum(1) / weights.sum(1).clamp(min=1)
        first = keep.long().argmax(-1)  # the first real token, so left padding works too
        return states[torch.arange(states.shape[0], device=states.device), first]

    def _encode(self, input_ids, attention_mask, position_ids, inputs_embeds, kwargs):
        return self.model(input_ids=input_ids, attention_mask=attention_mask, position_ids=position_ids,
                          inputs_embeds=inputs_embeds, return_dict=True, **kwargs)


class NeoBERTForSequenceClassification(NeoBERTClassifierBase):
    """Classification / regression from the first ([CLS]) token, or the mean over tokens (`classifier_pooling`);
    of each document of a padding-free batch (`cu_seq_lens_q` or restarting `position_ids`), one label each."""

    @can_return_tuple
    def forward(self, input_ids=None, attention_mask=None, position_ids=None, inputs_embeds=None, labels=None,
                **kwargs: Unpack[NeoBERTKwargs]) -> SequenceClassifierOutput:
        out = self._encode(input_ids, attention_mask, position_ids, inputs_embeds, kwargs)
        logits = self._head(self._pool(out.last_hidden_state, attention_mask, position_ids, kwargs))

        loss = None
        if labels is not None:
            labels = labels.reshape(-1) if labels.dim() > 1 and logits.shape[0] != labels.shape[0] else labels
            problem_type = self.config.problem_type
            if problem_type is None:
                if self.num_labels == 1:
                    problem_type = "regression"
                elif labels.dtype in (torch.long, torch.int):
                    problem_type = "single_label_classification"
                else:
                    problem_type = "multi_label_classification"
                self.config.problem_type = problem_type
            num_items_in_batch = kwargs.get("num_items_in_batch")
            if problem_type == "regression":
                loss = items_mean(F.mse_loss, logits.view(labels.shape), labels.float(), num_items_in_batch)
            elif problem_type == "single_label_classification":
                # Upcast as transformers' masked-LM and token losses do (a bf16 model outside autocast).
                loss = self.loss_function(labels=labels, pooled_logits=logits.float(), config=self.config, **kwargs)
            else:
                loss = items_mean(F.binary_cross_entropy_with_logits, logits, labels.float(), num_items_in_batch)

        return SequenceClassifierOutput(
            loss=loss, logits=logits, hidden_states=out.hidden_states, attentions=out.attentions
        )


class NeoBERTForTokenClassification(NeoBERTClassifierBase):
    """Per-token classification; `labels` of -100 (e.g. padding, sub-word continuations) are not scored."""

    @can_return_tuple
    def forward(self, input_ids=None, attention_mask=None, position_ids=None, inputs_embeds=None, labels=None,
                **kwargs: Unpack[NeoBERTKwargs]) -> TokenClassifierOutput:
        out = self._encode(input_ids, attention_mask, position_ids, inputs_embeds, kwargs)
        logits = self._head(out.last_hidden_state)
        loss = None
        if labels is not None:
            labels = labels.to(logits.device)
            if attention_mask is not None and attention_mask.dim() == 2:
                # Padding never counts, whatever label the collator left there.
                labels = labels.masked_fill(~attention_mask.to(labels.device).bool(), -100)
            loss = self.loss_function(logits, labels, config=self.config, **kwargs)
        return TokenClassifierOutput(
            loss=loss, logits=logits, hidden_states=out.hidden_states, attentions=out.attentions
        )


class NeoBERTForQuestionAnswering(NeoBERTClassifierBase):
    """Extractive question answering: start and end logits per token (the classifier has 2 outputs)."""

    def __init__(self, config: NeoBERTConfig):
        super().__init__(config, num_outputs=2)

    @can_return_tuple
    def forward(self, input_ids=None, attention_mask=None, position_ids=None, inputs_embeds=None,
                start_positions=None, end_positions=None,
                **kwargs: Unpack[NeoBERTKwargs]) -> QuestionAnsweringModelOutput:
        """`start_positions` / `end_positions`: token indices of the answer span; positions outside the sequence
        are clamped to its length and not scored (as in transformers' question-answering models)."""
        out = self._encode(input_ids, attention_mask, position_ids, inputs_embeds, kwargs)
        start_logits, end_logits = (t.contiguous() for t in self._head(out.last_hidden_state).unbind(-1))
        loss = None
        if start_positions is not None and end_positions is not None:
            loss = self.loss_function(start_logits.float(), end_logits.float(), start_positions, end_positions,
                                      **kwargs)
        return QuestionAnsweringModelOutput(loss=loss, start_logits=start_logits, end_logits=end_logits,
                                            hidden_states=out.hidden_states, attentions=out.attentions)


class NeoBERTForMultipleChoice(NeoBERTClassifierBase):
    """Multiple choice: inputs [batch, choices, length]; one score per choice from the pooled sequence."""

    def __init__(self, config: NeoBERTConfig):
        super().__init__(config, num_outputs=1)

    @can_return_tuple
    def forward(self, input_ids=None, attention_mask=None, position_ids=None, inputs_embeds=None, labels=None,
                **kwargs: Unpack[NeoBERTKwargs]) -> MultipleChoiceModelOutput:
        """`labels`: [batch] index of the right choice."""
        source = input_ids if input_ids is not None else inputs_embeds
        if source is None:
            raise ValueError("Specify exactly one of input_ids or inputs_embeds")
        if any(kwargs.get(k) is not None for k in ("cu_seqlens", "cu_seq_lens_q", "cu_seq_lens_k")):
            raise ValueError(f"{type(self).__name__} scores [batch, choices, length] inputs, not packed ones")
        num_choices = source.shape[1]

        def flat(t):
            return None if t is None else t.reshape(-1, *t.shape[2:])

        if attention_mask is not None and attention_mask.dim() == 3:
            attention_mask = flat(attention_mask)
        position_ids = flat(position_ids)
        out = self._encode(flat(input_ids), attention_mask, position_ids, flat(inputs_embeds), kwargs)
        logits = self._head(self._pool(out.last_hidden_state, attention_mask, None, kwargs)).view(-1, num_choices)
        loss = None
        if labels is not None:
            # transformers has no multiple-choice loss to look up: its cross-entropy, over the choices.
            loss = fixed_cross_entropy(logits.float(), labels.view(-1).to(logits.device),
                                       kwargs.get("num_items_in_batch"))
        return MultipleChoiceModelOutput(loss=loss, logits=logits, hidden_states=out.hidden_states,
                                         attentions=out.attentions)


__all__ = [
    "NeoBERTConfig",
    "NeoBERTPreTrainedModel",
    "NeoBERT",
    "NeoBERTLMHead",
    "NeoBERTForSequenceClassification",
    "NeoBERTForTokenClassification",
    "NeoBERTForQuestionAnswering",
    "NeoBERTForMultipleChoice",
]
