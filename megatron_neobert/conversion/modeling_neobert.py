# coding=utf-8
"""NeoBERT for Hugging Face transformers (remote code, `trust_remote_code=True`).

Module names reproduce the published `chandar-lab/NeoBERT` checkpoint keys exactly
(`model.encoder`, `model.transformer_encoder.{i}.{attention_norm,qkv,wo,ffn_norm,ffn.w12,ffn.w3}`,
`model.layer_norm`, `decoder`), so this file is a drop-in replacement for the published `model.py`.

Written on transformers' own helpers, as its `modeling_modernbert.py` is: the attention interface
(`attn_implementation` = "eager", "sdpa", "flash_attention_2", "flex_attention"), `create_bidirectional_mask`,
`capture_outputs` (hidden states and attention weights), `GradientCheckpointingLayer`, `can_return_tuple`,
`TransformersKwargs` and `self.loss_function`. Requires transformers >= 5.2.0, the first release with all of them
(what later releases add to these helpers, such as hidden states selected by index or checkpointing every n layers,
works where the installed release has it).

What is NeoBERT's own, and differs from the published code:
- no xformers, runs on CPU; `output_attentions=True` computes that call eagerly, whatever the implementation;
- RoPE rotates interleaved pairs (2i, 2i+1), as the published complex form does; cos/sin are computed from the
  config in each forward (no buffers), so loading on the meta device never leaves stale tables behind; optional
  RoPE scaling (linear / NTK-aware / YaRN) evaluates beyond the trained length;
- `attention_mask` is optional and takes the formats transformers takes: [batch, length] 0/1 or bool, or a 4D
  additive (0 / large negative or -inf) or bool mask; anything else is refused with an error. Positions count real
  tokens only, so left and right padding give the same result;
- padding-free batches (`DataCollatorWithFlattening`: `position_ids` restarting at 0, or `cu_seq_lens_q/k` +
  `max_length_q/k`, or our `cu_seqlens` / `max_seqlen`): tokens never attend across documents on any
  implementation. flash-attn's varlen kernel runs them as they are; the others regroup the documents into a
  [documents, longest document] batch, so memory grows with the documents, never with the square of the batch;
- the padded path has no data-dependent control flow when traced, so `torch.export` and
  `torch.compile(fullgraph=True)` work on padded batches;
- heads for question answering and multiple choice, `classifier_pooling` = "cls" | "mean", and losses that
  honour the Trainer's `num_items_in_batch` (exact gradient accumulation), regression and multi-label included.

This file must stay self-contained (torch + transformers only): it is copied into exported checkpoint folders.
"""

import copy
import math
from typing import Optional, Tuple

import torch
import torch.nn.functional as F
from torch import nn
from transformers import PreTrainedConfig, PreTrainedModel
from transformers.loss.loss_utils import fixed_cross_entropy
from transformers.masking_utils import create_bidirectional_mask
from transformers.modeling_layers import GradientCheckpointingLayer
from transformers.modeling_outputs import (
    BaseModelOutput,
    MaskedLMOutput,
    MultipleChoiceModelOutput,
    QuestionAnsweringModelOutput,
    SequenceClassifierOutput,
    TokenClassifierOutput,
)
from transformers.modeling_utils import ALL_ATTENTION_FUNCTIONS
from transformers.processing_utils import Unpack
from transformers.utils import TransformersKwargs, is_tracing
from transformers.utils.generic import can_return_tuple
from transformers.utils.output_capturing import capture_outputs

_ROPE_SCALING_TYPES = ("linear", "ntk", "yarn")


def swiglu_hidden_size(intermediate_size: int, multiple_of: int = 8) -> int:
    """Real SwiGLU width for a nominal `intermediate_size`: int(2/3 * I) rounded up to `multiple_of`."""
    width = int(2 * intermediate_size / 3)
    return multiple_of * ((width + multiple_of - 1) // multiple_of)


class NeoBERTConfig(PreTrainedConfig):
    r"""Configuration of a NeoBERT encoder. Field names and defaults follow the published `config.json`.

    Args:
        intermediate_size: nominal FFN size; the SwiGLU width is `swiglu_hidden_size(intermediate_size)`
            (3072 -> 2048), exposed as `ffn_hidden_size`.
        dim_head: per-head size; defaults to `hidden_size // num_attention_heads`.
        max_length: the trained context length (RoPE itself has no length limit here).
        rope_theta: RoPE base.
        rope_scaling: `None` or `{"type": "linear" | "ntk" | "yarn", "factor": float,
            "original_max_position_embeddings": int}` (YaRN also takes optional `beta_fast`/`beta_slow`).
        classifier_dropout: dropout of the classification heads.
        classifier_pooling: what the sequence classification and multiple choice heads read: "cls" (the first
            token, as published) or "mean" (the mean over real tokens).
    """

    model_type = "neobert"
    # Declared as a field: transformers refuses to save configs holding generation parameters (`max_length` is one)
    # unless the config class declares them itself.
    max_length: int = 4096
    # transformers turns `rope_scaling` into a deprecated alias of its own `rope_parameters` schema, which knows
    # nothing of our "ntk" type. A plain class attribute shadows that property so our field is stored and
    # serialised like any other one.
    rope_scaling = None

    def __init__(
        self,
        hidden_size: int = 768,
        intermediate_size: int = 3072,
        num_hidden_layers: int = 28,
        num_attention_heads: int = 12,
        dim_head: Optional[int] = None,
        vocab_size: int = 30522,
        pad_token_id: int = 0,
        norm_eps: float = 1e-5,
        max_length: int = 4096,
        embedding_init_range: float = 0.02,
        decoder_init_range: float = 0.02,
        classifier_init_range: float = 0.02,
        classifier_dropout: float = 0.1,
        rope_theta: float = 10000.0,
        rope_scaling: Optional[dict] = None,
        classifier_pooling: str = "cls",
        **kwargs,
    ):
        # The published config.json stores extra constructor kwargs under a literal "kwargs" key.
        legacy = kwargs.pop("kwargs", None)
        if isinstance(legacy, dict) and "classifier_dropout" in legacy:
            classifier_dropout = legacy["classifier_dropout"]
        # The MLM decoder is a separate matrix with its own bias: never tie it to the embedding.
        kwargs["tie_word_embeddings"] = False
        super().__init__(pad_token_id=pad_token_id, **kwargs)

        # A hand-edited config.json ("hidden_size": "big") fails here by name, not in arithmetic below.
        sizes = dict(hidden_size=hidden_size, intermediate_size=intermediate_size, num_hidden_layers=num_hidden_layers,
                     num_attention_heads=num_attention_heads, vocab_size=vocab_size, max_length=max_length,
                     **({} if dim_head is None else {"dim_head": dim_head}))
        bad = [f"{k}={v!r}" for k, v in sizes.items() if isinstance(v, bool) or not isinstance(v, int) or v < 1]
        if bad:
            raise ValueError(f"NeoBERT config: {', '.join(bad)}: sizes must be positive integers")
        numbers = dict(norm_eps=norm_eps, embedding_init_range=embedding_init_range,
                       decoder_init_range=decoder_init_range, classifier_init_range=classifier_init_range,
                       classifier_dropout=classifier_dropout, rope_theta=rope_theta)
        bad = [f"{k}={v!r}" for k, v in numbers.items() if isinstance(v, bool) or not isinstance(v, (int, float))]
        if bad:
            raise ValueError(f"NeoBERT config: {', '.join(bad)}: must be numbers")
        if hidden_size % num_attention_heads != 0:
            raise ValueError(f"hidden_size ({hidden_size}) must be divisible by num_attention_heads ({num_attention_heads})")
        if dim_head is None:
            dim_head = hidden_size // num_attention_heads
        if dim_head * num_attention_heads != hidden_size:
            raise ValueError(
                f"dim_head ({dim_head}) * num_attention_heads ({num_attention_heads}) must equal hidden_size ({hidden_size})"
            )
        if classifier_pooling not in ("cls", "mean"):
            raise ValueError(f"classifier_pooling must be 'cls' or 'mean', got {classifier_pooling!r}")
        if dim_head % 2 != 0:
            raise ValueError(f"RoPE rotates pairs of dimensions: dim_head must be even, got {dim_head}")

        self.hidden_size = hidden_size
        self.intermediate_size = intermediate_size
        self.num_hidden_layers = num_hidden_layers
        self.num_attention_heads = num_attention_heads
        self.dim_head = dim_head
        self.vocab_size = vocab_size
        self.norm_eps = norm_eps
        self.max_length = max_length
        self.embedding_init_range = embedding_init_range
        self.decoder_init_range = decoder_init_range
        self.classifier_init_range = classifier_init_range
        self.classifier_dropout = classifier_dropout
        self.classifier_pooling = classifier_pooling
        self.rope_theta = float(rope_theta)
        self.rope_scaling = self._validated_rope_scaling(rope_scaling, max_length)

    @property
    def ffn_hidden_size(self) -> int:
        return swiglu_hidden_size(self.intermediate_size)

    @staticmethod
    def _validated_rope_scaling(rope_scaling: Optional[dict], max_length: int) -> Optional[dict]:
        if rope_scaling is None:
            return None
        if not isinstance(rope_scaling, dict):
            raise ValueError(f"rope_scaling must be a dict or None, got {type(rope_scaling).__name__}")
        scaling = dict(rope_scaling)
        kind = scaling.pop("type", None)
        kind = scaling.pop("rope_type", None) or kind  # accept the HF spelling too
        if kind not in _ROPE_SCALING_TYPES:
            raise ValueError(f"rope_scaling type must be one of {_ROPE_SCALING_TYPES}, got {kind!r}")
        factor = float(scaling.pop("factor", 0.0))
        if factor < 1.0:
            raise ValueError(f"rope_scaling factor must be >= 1, got {factor}")
        original = int(scaling.pop("original_max_position_embeddings", max_length))
        out = {"type": kind, "factor": factor, "original_max_position_embeddings": original}
        if kind == "yarn":
            out["beta_fast"] = float(scaling.pop("beta_fast", 32.0))
            out["beta_slow"] = float(scaling.pop("beta_slow", 1.0))
        if scaling:
            raise ValueError(f"Unknown rope_scaling keys for type {kind!r}: {sorted(scaling)}")
        return out


# --------------------------------------------------------------------------------------------------------
# Rotary position embedding
# --------------------------------------------------------------------------------------------------------


def rope_inverse_frequencies(config: NeoBERTConfig, device=None) -> Tuple[torch.Tensor, float, float]:
    """Returns (inv_freq [dim_head/2] fp32, position divisor, attention scale) for the config's RoPE."""
    dim = config.dim_head
    theta = config.rope_theta
    scaling = config.rope_scaling
    kind = scaling["type"] if scaling else None
    factor = scaling["factor"] if scaling else 1.0

    if kind == "ntk":
        # NTK-aware: stretch the base so the lowest frequency is interpolated by `factor`, the highest kept.
        theta = theta * factor ** (dim / (dim - 2))
    # Same fp32 formula as the published precompute_freqs_cis.
    inv_freq = 1.0 / (theta ** (torch.arange(0, dim, 2, device=device, dtype=torch.float32) / dim))

    position_divisor, attention_scale = 1.0, 1.0
    if kind == "linear":
        position_divisor = factor
    elif kind == "yarn":
        # Dimensions that rotate more than beta_fast times over the original context keep their frequency,
        # those rotating fewer than beta_slow times are interpolated by `factor`, a linear ramp in between.
        original = scaling["original_max_position_embeddings"]

        def correction_dim(num_rotations: float) -> float:
            return dim * math.log(original / (num_rotations * 2 * math.pi)) / (2 * math.log(theta))

        low = max(math.floor(correction_dim(scaling["beta_fast"])), 0)
        high = min(math.ceil(correction_dim(scaling["beta_slow"])), dim - 1)
        if low == high:
            high += 0.001  # avoid a zero-width ramp
        ramp = ((torch.arange(dim // 2, device=device, dtype=torch.float32) - low) / (high - low)).clamp(0, 1)
        inv_freq = (inv_freq / factor) * ramp + inv_freq * (1.0 - ramp)
        # YaRN temperature: q and k are both scaled by 0.1 ln(s) + 1 (logits by its square), as in the paper.
        attention_scale = 0.1 * math.log(factor) + 1.0
    return inv_freq, position_divisor, attention_scale


def rope_cos_sin(config: NeoBERTConfig, position_ids: torch.Tensor) -> Tuple[torch.Tensor, torch.Tensor]:
    """cos/sin tables of shape [*position_ids.shape, dim_head/2] in fp32."""
    inv_freq, position_divisor, attention_scale = rope_inverse_frequencies(config, device=position_ids.device)
    positions = position_ids.to(torch.float32)
    if position_divisor != 1.0:
        positions = positions / position_divisor
    angles = positions[..., None] * inv_freq
    cos, sin = angles.cos(), angles.sin()
    if attention_scale != 1.0:
        cos, sin = cos * attention_scale, sin * attention_scale
    return cos, sin


def apply_rotary(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """Rotates interleaved pairs (2i, 2i+1) of x [B, L, heads, D] by cos/sin [B or 1, L, D/2], in fp32.

    Equal to the published complex form: view_as_real(view_as_complex(x.reshape(..., D/2, 2)) * e^{i angle}).
    """
    pairs = x.float().unflatten(-1, (-1, 2))
    even, odd = pairs[..., 0], pairs[..., 1]
    cos, sin = cos[:, :, None, :], sin[:, :, None, :]
    rotated = torch.stack((even * cos - odd * sin, even * sin + odd * cos), dim=-1)
    return rotated.flatten(-2).type_as(x)


# --------------------------------------------------------------------------------------------------------
# Attention masks and padding-free batches
# --------------------------------------------------------------------------------------------------------

MASK_FORMATS = (
    "attention_mask must be [batch, length] with 1 (or True) for real tokens and 0 (or False) for padding, or 4D "
    "[batch, 1 or heads, 1 or length, length], either additive float (0 to attend, a large negative number or -inf "
    "not to) or bool (True to attend)"
)


def _additive_mask(keep: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    # A large finite negative instead of -inf: a row with no visible key gives uniform weights, not NaN.
    zero = torch.zeros((), dtype=dtype, device=keep.device)
    return torch.where(keep, zero, torch.finfo(dtype).min)


def _is_flash(attn_implementation: str) -> bool:
    return "flash" in attn_implementation


def checked_padding_mask(mask: torch.Tensor, batch: int, length: int) -> torch.Tensor:
    """The [batch, length] keep mask of a 2D `attention_mask`. Its values are checked (0/1) only when not traced, so
    a padded batch compiles and exports without data-dependent branches."""
    if tuple(mask.shape) != (batch, length):
        raise ValueError(f"attention_mask has shape {tuple(mask.shape)}, the input is [batch, length] = [{batch}, {length}]")
    if mask.dtype != torch.bool:
        if mask.dtype.is_complex:
            raise ValueError(f"{MASK_FORMATS}; got a complex mask")
        if not is_tracing(mask) and bool(((mask != 0) & (mask != 1)).any()):
            raise ValueError(
                f"{MASK_FORMATS}. This [batch, length] mask holds values other than 0 and 1 (an additive 0/-inf "
                f"mask?): give an additive mask the 4D shape [batch, 1, 1, length], or convert it to 0/1"
            )
    return mask.bool()


def additive_4d_mask(mask: torch.Tensor, batch: int, length: int, num_heads: int, dtype: torch.dtype,
                     attn_implementation: str) -> torch.Tensor:
    """A 4D `attention_mask` as an additive bias, which eager, sdpa and flex attention all take (transformers passes a
    4D mask on as it is, and eager attention adds its mask to the scores)."""
    b, h, q, k = mask.shape
    if b not in (1, batch) or h not in (1, num_heads) or q not in (1, length) or k != length:
        raise ValueError(
            f"4D attention_mask has shape {tuple(mask.shape)}, which does not broadcast to [batch, heads, length, "
            f"length] = [{batch}, {num_heads}, {length}, {length}]"
        )
    if _is_flash(attn_implementation):
        raise ValueError(
            f"attn_implementation={attn_implementation!r} takes a [batch, length] padding mask, not a 4D one; "
            f"use 'sdpa', 'eager' or 'flex_attention' for arbitrary masks"
        )
    if mask.dtype == torch.bool:
        bias = _additive_mask(mask, dtype)
    elif mask.dtype.is_floating_point:
        if not is_tracing(mask) and bool((mask > 0).any()):
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
    [documents, 1, 1, longest] additive bias. Not `create_bidirectional_mask`'s [documents, 1, longest, longest]:
    this one grows with the tokens, not with the documents times the longest one squared."""
    if attn_implementation == "flex_attention":
        from torch.nn.attention.flex_attention import create_block_mask

        documents, longest = keep.shape
        return create_block_mask(lambda b, h, q, kv: keep[b, kv], documents, None, longest, longest, device=keep.device)
    return _additive_mask(keep, dtype)[:, None, None, :]


class PackedDocuments:
    """Where the documents of a padding-free batch lie among its flattened batch * length tokens."""

    def __init__(self, cu_seqlens: torch.Tensor, max_seqlen: Optional[int], total: int):
        cu_seqlens = cu_seqlens.to(torch.int32).flatten()
        if cu_seqlens.numel() < 2 or int(cu_seqlens[0]) != 0:
            raise ValueError("cu_seqlens must start at 0 and hold at least one document boundary")
        if bool((cu_seqlens[1:] < cu_seqlens[:-1]).any()) or int(cu_seqlens[-1]) > total:
            raise ValueError(f"cu_seqlens must be non-decreasing and end at most at the {total} tokens given")
        if int(cu_seqlens[-1]) < total:
            # Trailing tokens (pack padding) form their own document, so they never attend into real ones.
            cu_seqlens = torch.cat([cu_seqlens, cu_seqlens.new_tensor([total])])
        self.cu_seqlens = cu_seqlens
        self.lengths = cu_seqlens[1:] - cu_seqlens[:-1]
        longest = int(self.lengths.max())
        if max_seqlen is not None and int(max_seqlen) < longest:
            raise ValueError(f"max_seqlen={int(max_seqlen)} is shorter than the longest document ({longest} tokens)")
        self.max_seqlen = longest
        tokens = torch.arange(total, device=cu_seqlens.device, dtype=torch.int32)
        self.doc_ids = torch.searchsorted(cu_seqlens[1:], tokens, right=True)
        self.position_ids = (tokens - cu_seqlens[self.doc_ids]).long()

    @classmethod
    def from_position_ids(cls, position_ids: torch.Tensor) -> Optional["PackedDocuments"]:
        """Documents of a [batch, length] padding-free batch (a new one wherever positions restart), or None when
        each row is one sequence."""
        batch, length = position_ids.shape
        starts = torch.ones_like(position_ids, dtype=torch.bool)
        starts[:, 1:] = position_ids[:, 1:] <= position_ids[:, :-1]
        if not bool(starts[:, 1:].any()):
            return None
        cu = torch.cat([starts.flatten().nonzero().flatten(), position_ids.new_tensor([batch * length])])
        return cls(cu, None, batch * length)

    @classmethod
    def of_inputs(cls, attention_mask, position_ids, batch: int, length: int, device, cu_seqlens, max_seqlen,
                  kwargs: dict) -> Optional["PackedDocuments"]:
        """The documents given as `cu_seqlens` (ours, or transformers' `cu_seq_lens_q/k`), or by restarting
        `position_ids` without an attention mask; None for a padded or plain batch."""
        cu_seq_lens_q, cu_seq_lens_k = kwargs.get("cu_seq_lens_q"), kwargs.get("cu_seq_lens_k")
        if cu_seq_lens_q is not None or cu_seq_lens_k is not None:
            if cu_seqlens is not None:
                raise ValueError("Give the documents as cu_seqlens or as cu_seq_lens_q/k, not both")
            if cu_seq_lens_q is not None and cu_seq_lens_k is not None and not torch.equal(cu_seq_lens_q, cu_seq_lens_k):
                raise ValueError("NeoBERT is self-attention only: cu_seq_lens_q and cu_seq_lens_k must be equal")
            cu_seqlens = cu_seq_lens_q if cu_seq_lens_q is not None else cu_seq_lens_k
            max_length_q = kwargs.get("max_length_q")
            max_seqlen = max_length_q if max_length_q is not None else kwargs.get("max_length_k")
        if cu_seqlens is not None:
            if attention_mask is not None and not bool(attention_mask.bool().all()):
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


def eager_attention_forward(module, query, key, value, attention_mask, scaling: float, dropout: float = 0.0, **kwargs):
    """query/key/value [batch, heads, length, dim]; returns ([batch, length, heads, dim], weights)."""
    scores = torch.matmul(query, key.transpose(2, 3)) * scaling
    if attention_mask is not None:
        scores = scores + attention_mask
    weights = scores.softmax(dim=-1, dtype=torch.float32).to(query.dtype)
    return torch.matmul(weights, value).transpose(1, 2).contiguous(), weights


# --------------------------------------------------------------------------------------------------------
# Modules
# --------------------------------------------------------------------------------------------------------


class NeoBERTRMSNorm(nn.Module):
    def __init__(self, hidden_size: int, eps: float):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(hidden_size))
        self.eps = eps

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        dtype = x.dtype
        x = x.float()
        x = x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.eps)
        return self.weight * x.to(dtype)

    def extra_repr(self) -> str:
        return f"{self.weight.shape[0]}, eps={self.eps}"


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

    def forward(self, query, key, value, attention_mask=None, documents: Optional[PackedDocuments] = None,
                attn_implementation: str = "eager", position_ids=None):
        interface = ALL_ATTENTION_FUNCTIONS.get_interface(attn_implementation, eager_attention_forward)
        if documents is not None:
            return self._packed(interface, query, key, value, documents, attn_implementation)
        extra = {"position_ids": position_ids} if _is_flash(attn_implementation) else {}
        q, k, v = (t.transpose(1, 2) for t in (query, key, value))
        return interface(self, q, k, v, attention_mask, dropout=0.0, scaling=self.scaling, is_causal=False, **extra)

    def _packed(self, interface, query, key, value, documents: PackedDocuments, attn_implementation: str):
        batch, length, heads, dim = query.shape
        q, k, v = (t.reshape(batch * length, heads, dim) for t in (query, key, value))
        weights = None
        if _is_flash(attn_implementation):  # varlen kernel on the flat tokens
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
        q, k = apply_rotary(q, cos, sin), apply_rotary(k, cos, sin)
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
        # torch.nn.init is looked up at call time, so transformers' guard (skip loaded tensors) applies.
        if isinstance(module, nn.Linear):
            nn.init.uniform_(module.weight, -self.config.decoder_init_range, self.config.decoder_init_range)
            if module.bias is not None:
                nn.init.zeros_(module.bias)
        elif isinstance(module, nn.Embedding):
            nn.init.uniform_(module.weight, -self.config.embedding_init_range, self.config.embedding_init_range)
            if module.padding_idx is not None and not getattr(module.weight, "_is_hf_initialized", False):
                with torch.no_grad():
                    module.weight[module.padding_idx].zero_()
        elif isinstance(module, NeoBERTRMSNorm):
            nn.init.ones_(module.weight)


class NeoBERT(NeoBERTPreTrainedModel):
    """The encoder. `last_hidden_state` is taken after the final RMSNorm.

    `hidden_states` (when requested) follows the transformers convention for pre-norm models: the input of
    each block (embeddings first), then the final normalised output, i.e. num_hidden_layers + 1 tensors.
    """

    def __init__(self, config: NeoBERTConfig):
        super().__init__(config)
        self.encoder = nn.Embedding(config.vocab_size, config.hidden_size, padding_idx=config.pad_token_id)
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
        input_ids: Optional[torch.Tensor] = None,
        attention_mask: Optional[torch.Tensor] = None,
        position_ids: Optional[torch.Tensor] = None,
        inputs_embeds: Optional[torch.Tensor] = None,
        cu_seqlens: Optional[torch.Tensor] = None,
        max_seqlen: Optional[int] = None,
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
        attn_implementation = ("eager" if kwargs.get("output_attentions", self.config.output_attentions)
                               else self.config._attn_implementation)

        documents = PackedDocuments.of_inputs(attention_mask, position_ids, batch, length, x.device, cu_seqlens,
                                              max_seqlen, kwargs)
        mask = None
        if documents is not None:
            if position_ids is None:
                position_ids = documents.position_ids
        elif attention_mask is not None and attention_mask.dim() == 4:
            mask = additive_4d_mask(attention_mask.to(x.device), batch, length, self.config.num_attention_heads,
                                    x.dtype, attn_implementation)
        elif attention_mask is not None:
            if attention_mask.dim() != 2:
                raise ValueError(f"{MASK_FORMATS}; got shape {tuple(attention_mask.shape)}")
            keep = checked_padding_mask(attention_mask.to(x.device), batch, length)
            mask = create_bidirectional_mask(self._config_for(attn_implementation), x, keep)
            if position_ids is None:
                position_ids = (keep.long().cumsum(-1) - 1).clamp(min=0)
        elif position_ids is not None and not _is_flash(attn_implementation):
            # Traced (so no data-dependent documents): restarting positions become a dense per-row document mask.
            pos = position_ids.to(x.device).reshape(-1, length).expand(batch, length)
            starts = torch.cat([torch.ones_like(pos[:, :1], dtype=torch.bool), pos[:, 1:] <= pos[:, :-1]], dim=1)
            doc = starts.long().cumsum(-1)
            mask = _additive_mask(doc[:, :, None] == doc[:, None, :], x.dtype)[:, None]
            if attn_implementation == "flex_attention":
                mask = mask.expand(batch, 1, length, length)
        if position_ids is None:
            position_ids = torch.arange(length, device=x.device)
        position_ids = position_ids.to(x.device).reshape(-1, length).expand(batch, length)
        position_embeddings = rope_cos_sin(self.config, position_ids)

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


class _NeoBERTClassifierBase(NeoBERTPreTrainedModel):
    """Shared by the classification heads: dropout -> dense -> tanh -> dropout -> classifier."""

    def __init__(self, config: NeoBERTConfig, num_outputs: Optional[int] = None):
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
            nn.init.normal_(module.weight, mean=0.0, std=self.config.classifier_init_range)
            nn.init.zeros_(module.bias)
        else:
            super()._init_weights(module)

    def _head(self, states: torch.Tensor) -> torch.Tensor:
        x = self.dropout(states)
        x = torch.tanh(self.dense(x))
        return self.classifier(self.dropout(x))

    def _pool(self, states: torch.Tensor, attention_mask: Optional[torch.Tensor], kwargs: dict) -> torch.Tensor:
        """One vector per sequence: the first real token ("cls", the published head) or the mean over real tokens."""
        if any(kwargs.get(k) is not None for k in ("cu_seqlens", "cu_seq_lens_q", "cu_seq_lens_k")):
            raise ValueError(f"{type(self).__name__} pools one vector per row: it takes padded batches, not packed ones")
        if attention_mask is not None and attention_mask.dim() != 2:
            raise ValueError(f"{type(self).__name__} pools over a [batch, length] attention_mask, got a "
                             f"{attention_mask.dim()}D one")
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


class NeoBERTForSequenceClassification(_NeoBERTClassifierBase):
    """Classification / regression from the first ([CLS]) token, or the mean over tokens (`classifier_pooling`)."""

    @can_return_tuple
    def forward(self, input_ids=None, attention_mask=None, position_ids=None, inputs_embeds=None, labels=None,
                **kwargs: Unpack[NeoBERTKwargs]) -> SequenceClassifierOutput:
        out = self._encode(input_ids, attention_mask, position_ids, inputs_embeds, kwargs)
        logits = self._head(self._pool(out.last_hidden_state, attention_mask, kwargs))

        loss = None
        if labels is not None:
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

        return SequenceClassifierOutput(loss=loss, logits=logits, hidden_states=out.hidden_states,
                                        attentions=out.attentions)


class NeoBERTForTokenClassification(_NeoBERTClassifierBase):
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
        return TokenClassifierOutput(loss=loss, logits=logits, hidden_states=out.hidden_states,
                                     attentions=out.attentions)


class NeoBERTForQuestionAnswering(_NeoBERTClassifierBase):
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


class NeoBERTForMultipleChoice(_NeoBERTClassifierBase):
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
        num_choices = source.shape[1]

        def flat(t):
            return None if t is None else t.reshape(-1, *t.shape[2:])

        if attention_mask is not None and attention_mask.dim() == 3:
            attention_mask = flat(attention_mask)
        out = self._encode(flat(input_ids), attention_mask, flat(position_ids), flat(inputs_embeds), kwargs)
        logits = self._head(self._pool(out.last_hidden_state, attention_mask, kwargs)).view(-1, num_choices)
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
