# coding=utf-8
"""NeoBERT for Hugging Face transformers (remote code, `trust_remote_code=True`).

Module names reproduce the published `chandar-lab/NeoBERT` checkpoint keys exactly
(`model.encoder`, `model.transformer_encoder.{i}.{attention_norm,qkv,wo,ffn_norm,ffn.w12,ffn.w3}`,
`model.layer_norm`, `decoder`), so this file is a drop-in replacement for the published `model.py`.

Differences from the published code:
- no xformers, runs on CPU; SDPA by default, an eager path for `output_attentions=True`;
- `attention_mask` is optional and is always applied as an additive bias (never multiplied into scores);
- RoPE cos/sin are computed from the config in each forward (no buffers), so loading on the meta device
  (transformers 5.x) can never leave stale or uninitialised tables behind;
- packed inputs (`cu_seqlens`, `max_seqlen`) work in any batch layout: flash-attn's varlen kernel when it
  is importable and the inputs are fp16/bf16 on CUDA, else SDPA with a block-diagonal mask;
- optional RoPE scaling (linear / NTK-aware / YaRN) to evaluate beyond the trained length.

This file must stay self-contained (torch + transformers only; flash_attn lazily): it is copied into
exported checkpoint folders.
"""

import math
from functools import lru_cache
from typing import Optional, Tuple

import torch
import torch.nn.functional as F
from torch import nn
from torch.nn import BCEWithLogitsLoss, CrossEntropyLoss, MSELoss
from transformers import PretrainedConfig, PreTrainedModel
from transformers.modeling_outputs import (
    BaseModelOutput,
    MaskedLMOutput,
    SequenceClassifierOutput,
    TokenClassifierOutput,
)

_ROPE_SCALING_TYPES = ("linear", "ntk", "yarn")


def swiglu_hidden_size(intermediate_size: int, multiple_of: int = 8) -> int:
    """Real SwiGLU width for a nominal `intermediate_size`: int(2/3 * I) rounded up to `multiple_of`."""
    width = int(2 * intermediate_size / 3)
    return multiple_of * ((width + multiple_of - 1) // multiple_of)


class NeoBERTConfig(PretrainedConfig):
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
    """

    model_type = "neobert"
    # Declared as a field: transformers 5.x refuses to save configs holding generation parameters
    # (`max_length` is one) unless the config class declares them itself.
    max_length: int = 4096
    # transformers 5.x turns `rope_scaling` into a deprecated alias of its own `rope_parameters` schema, which
    # knows nothing of our "ntk" type. A plain class attribute shadows that property so our field is stored
    # and serialised like any other one, identically in 4.x and 5.x.
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
        **kwargs,
    ):
        # The published config.json stores extra constructor kwargs under a literal "kwargs" key.
        legacy = kwargs.pop("kwargs", None)
        if isinstance(legacy, dict) and "classifier_dropout" in legacy:
            classifier_dropout = legacy["classifier_dropout"]
        # The MLM decoder is a separate matrix with its own bias: never tie it to the embedding (4.x ties
        # output/input embeddings whenever this flag is true).
        kwargs["tie_word_embeddings"] = False
        super().__init__(pad_token_id=pad_token_id, **kwargs)

        if hidden_size % num_attention_heads != 0:
            raise ValueError(f"hidden_size ({hidden_size}) must be divisible by num_attention_heads ({num_attention_heads})")
        if dim_head is None:
            dim_head = hidden_size // num_attention_heads
        if dim_head * num_attention_heads != hidden_size:
            raise ValueError(
                f"dim_head ({dim_head}) * num_attention_heads ({num_attention_heads}) must equal hidden_size ({hidden_size})"
            )
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
# Attention helpers
# --------------------------------------------------------------------------------------------------------


@lru_cache(maxsize=None)
def _flash_attn_varlen_func():
    try:
        from flash_attn import flash_attn_varlen_func
    except Exception:  # not installed, or built against another torch/CUDA
        return None
    return flash_attn_varlen_func


def _additive_mask(keep: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    # A large finite negative instead of -inf: a row with no visible key gives uniform weights, not NaN.
    zero = torch.zeros((), dtype=dtype, device=keep.device)
    return torch.where(keep, zero, torch.finfo(dtype).min)


class _PackedBatch:
    """Document boundaries of packed inputs, flattened to one row of T tokens."""

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
        lengths = cu_seqlens[1:] - cu_seqlens[:-1]
        self.max_seqlen = int(max_seqlen) if max_seqlen is not None else int(lengths.max())
        tokens = torch.arange(total, device=cu_seqlens.device, dtype=torch.int32)
        self.segment_ids = torch.searchsorted(cu_seqlens[1:], tokens, right=True)
        self.position_ids = (tokens - cu_seqlens[self.segment_ids]).long()[None, :]

    def block_diagonal_mask(self, dtype: torch.dtype) -> torch.Tensor:
        # O(T^2) memory: the fallback for CPU and tests; long packs want flash-attn's varlen kernel.
        same = self.segment_ids[:, None] == self.segment_ids[None, :]
        return _additive_mask(same, dtype)[None, None]  # [1, 1, T, T]


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


class NeoBERTEncoderBlock(nn.Module):
    """Pre-norm block: x + attn(norm(x)), then x + ffn(norm(x))."""

    def __init__(self, config: NeoBERTConfig):
        super().__init__()
        self.config = config
        self.num_heads = config.num_attention_heads
        self.dim_head = config.dim_head
        self.attention_norm = NeoBERTRMSNorm(config.hidden_size, config.norm_eps)
        self.qkv = nn.Linear(config.hidden_size, 3 * config.hidden_size, bias=False)
        self.wo = nn.Linear(config.hidden_size, config.hidden_size, bias=False)
        self.ffn_norm = NeoBERTRMSNorm(config.hidden_size, config.norm_eps)
        self.ffn = NeoBERTSwiGLU(config.hidden_size, config.ffn_hidden_size)

    def forward(self, x, cos, sin, attention_bias, packed, output_attentions):
        attn, weights = self._attention(self.attention_norm(x), cos, sin, attention_bias, packed, output_attentions)
        x = x + attn
        x = x + self.ffn(self.ffn_norm(x))
        return x, weights

    def _attention(self, x, cos, sin, attention_bias, packed, output_attentions):
        batch, length, hidden = x.shape
        # qkv rows are grouped per head ([q_h; k_h; v_h] for each head h), as in the published weights.
        q, k, v = self.qkv(x).view(batch, length, self.num_heads, 3 * self.dim_head).chunk(3, dim=-1)
        q, k = apply_rotary(q, cos, sin), apply_rotary(k, cos, sin)

        weights = None
        flash = _flash_attn_varlen_func() if packed is not None else None
        use_flash = (
            flash is not None
            and not output_attentions
            and q.is_cuda
            and q.dtype in (torch.float16, torch.bfloat16)
            and self.config._attn_implementation != "eager"
        )
        if use_flash:
            out = flash(
                q.reshape(-1, self.num_heads, self.dim_head),
                k.reshape(-1, self.num_heads, self.dim_head),
                v.reshape(-1, self.num_heads, self.dim_head),
                cu_seqlens_q=packed.cu_seqlens,
                cu_seqlens_k=packed.cu_seqlens,
                max_seqlen_q=packed.max_seqlen,
                max_seqlen_k=packed.max_seqlen,
                dropout_p=0.0,
                causal=False,
            ).view(batch, length, self.num_heads, self.dim_head)
        else:
            if packed is not None:
                attention_bias = packed.block_diagonal_mask(q.dtype)
            q, k, v = q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2)  # [B, heads, L, D]
            if output_attentions or self.config._attn_implementation == "eager":
                scores = torch.matmul(q, k.transpose(-1, -2)) / math.sqrt(self.dim_head)
                if attention_bias is not None:
                    scores = scores + attention_bias
                weights = scores.float().softmax(dim=-1).to(q.dtype)
                out = torch.matmul(weights, v)
            else:
                out = F.scaled_dot_product_attention(q, k, v, attn_mask=attention_bias, dropout_p=0.0)
            out = out.transpose(1, 2)
        return self.wo(out.reshape(batch, length, hidden)), (weights if output_attentions else None)


class NeoBERTPreTrainedModel(PreTrainedModel):
    config_class = NeoBERTConfig
    base_model_prefix = "model"
    supports_gradient_checkpointing = True
    _no_split_modules = ["NeoBERTEncoderBlock"]
    _supports_sdpa = True
    # Loading an MLM checkpoint into the bare encoder or a classifier leaves the decoder out, by design.
    _keys_to_ignore_on_load_unexpected = [r"^decoder\."]

    def _init_weights(self, module):
        # torch.nn.init is looked up at call time, so transformers 5.x's guard (skip loaded tensors) applies.
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

    def _return_dict(self, return_dict: Optional[bool]) -> bool:
        return return_dict if return_dict is not None else getattr(self.config, "return_dict", True)


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

    def forward(
        self,
        input_ids: Optional[torch.Tensor] = None,
        attention_mask: Optional[torch.Tensor] = None,
        position_ids: Optional[torch.Tensor] = None,
        inputs_embeds: Optional[torch.Tensor] = None,
        cu_seqlens: Optional[torch.Tensor] = None,
        max_seqlen: Optional[int] = None,
        token_type_ids: Optional[torch.Tensor] = None,  # accepted for BERT tokenizers' output, unused
        output_hidden_states: Optional[bool] = None,
        output_attentions: Optional[bool] = None,
        return_dict: Optional[bool] = None,
    ):
        """
        Args:
            attention_mask: [batch, length], 1 (or True) for real tokens, 0 for padding. Optional.
            position_ids: RoPE positions; by default 0.. per sequence, counting real tokens only (so left
                and right padding give the same result), or restarting at each document when packed.
            cu_seqlens / max_seqlen: packed documents. `cu_seqlens` holds the cumulative document lengths over
                the flattened `batch * length` tokens; tokens never attend across documents. Tokens after
                `cu_seqlens[-1]` are treated as one more document.
        """
        output_attentions = output_attentions if output_attentions is not None else self.config.output_attentions
        output_hidden_states = (
            output_hidden_states if output_hidden_states is not None else self.config.output_hidden_states
        )
        if (input_ids is None) == (inputs_embeds is None):
            raise ValueError("Specify exactly one of input_ids or inputs_embeds")
        x = self.encoder(input_ids) if input_ids is not None else inputs_embeds
        if x.dim() == 2:  # a single unbatched sequence
            x = x[None]
        batch, length, hidden = x.shape

        packed, attention_bias = None, None
        if cu_seqlens is not None:
            if attention_mask is not None and not bool(attention_mask.bool().all()):
                raise ValueError(
                    "Packed inputs (cu_seqlens) take no padding mask: leave padding out of the pack, or put it "
                    "after cu_seqlens[-1] where it forms its own document."
                )
            packed = _PackedBatch(cu_seqlens.to(x.device), max_seqlen, batch * length)
            if position_ids is None:
                position_ids = packed.position_ids
            x = x.reshape(1, batch * length, hidden)
            position_ids = position_ids.reshape(1, batch * length)
        else:
            if attention_mask is not None:
                if attention_mask.dim() != 2 or attention_mask.shape[-1] != length:
                    raise ValueError(
                        f"attention_mask must have shape [batch, {length}], got {tuple(attention_mask.shape)}"
                    )
                keep = attention_mask.to(x.device).bool()
                if not bool(keep.all()):
                    attention_bias = _additive_mask(keep, x.dtype)[:, None, None, :]  # [B, 1, 1, L]
                if position_ids is None:
                    position_ids = (keep.long().cumsum(-1) - 1).clamp(min=0)
            if position_ids is None:
                position_ids = torch.arange(length, device=x.device)
            position_ids = position_ids.to(x.device).reshape(-1, length).expand(batch, length)

        cos, sin = rope_cos_sin(self.config, position_ids)

        all_hidden_states = () if output_hidden_states else None
        all_attentions = () if output_attentions else None
        for layer in self.transformer_encoder:
            if output_hidden_states:
                all_hidden_states += (x.reshape(batch, length, hidden),)
            if self.gradient_checkpointing and self.training:
                x, weights = self._gradient_checkpointing_func(
                    layer.__call__, x, cos, sin, attention_bias, packed, output_attentions
                )
            else:
                x, weights = layer(x, cos, sin, attention_bias, packed, output_attentions)
            if output_attentions:
                all_attentions += (weights,)

        x = self.layer_norm(x).reshape(batch, length, hidden)
        if output_hidden_states:
            all_hidden_states += (x,)

        if not self._return_dict(return_dict):
            return tuple(v for v in (x, all_hidden_states, all_attentions) if v is not None)
        return BaseModelOutput(last_hidden_state=x, hidden_states=all_hidden_states, attentions=all_attentions)


class NeoBERTLMHead(NeoBERTPreTrainedModel):
    """NeoBERT with its MLM decoder: a single Linear (with bias) on the final-normed states, untied."""

    def __init__(self, config: NeoBERTConfig):
        super().__init__(config)
        self.model = NeoBERT(config)
        self.decoder = nn.Linear(config.hidden_size, config.vocab_size)
        self.post_init()

    def get_output_embeddings(self):
        return self.decoder

    def set_output_embeddings(self, value):
        self.decoder = value

    def forward(
        self,
        input_ids: Optional[torch.Tensor] = None,
        attention_mask: Optional[torch.Tensor] = None,
        position_ids: Optional[torch.Tensor] = None,
        inputs_embeds: Optional[torch.Tensor] = None,
        cu_seqlens: Optional[torch.Tensor] = None,
        max_seqlen: Optional[int] = None,
        token_type_ids: Optional[torch.Tensor] = None,
        labels: Optional[torch.Tensor] = None,
        output_hidden_states: Optional[bool] = None,
        output_attentions: Optional[bool] = None,
        return_dict: Optional[bool] = None,
    ):
        """`labels`: token ids to predict, -100 where no prediction is scored."""
        out = self.model(
            input_ids=input_ids,
            attention_mask=attention_mask,
            position_ids=position_ids,
            inputs_embeds=inputs_embeds,
            cu_seqlens=cu_seqlens,
            max_seqlen=max_seqlen,
            output_hidden_states=output_hidden_states,
            output_attentions=output_attentions,
            return_dict=True,
        )
        logits = self.decoder(out.last_hidden_state)
        loss = None
        if labels is not None:
            loss = CrossEntropyLoss(ignore_index=-100)(
                logits.float().view(-1, logits.shape[-1]), labels.to(logits.device).view(-1)
            )
        if not self._return_dict(return_dict):
            rest = tuple(v for v in (out.hidden_states, out.attentions) if v is not None)
            return ((loss,) if loss is not None else ()) + (logits,) + rest
        return MaskedLMOutput(loss=loss, logits=logits, hidden_states=out.hidden_states, attentions=out.attentions)


class _NeoBERTClassifierBase(NeoBERTPreTrainedModel):
    """Shared by the classification heads: dropout -> dense -> tanh -> dropout -> classifier."""

    def __init__(self, config: NeoBERTConfig):
        super().__init__(config)
        self.num_labels = config.num_labels
        self.model = NeoBERT(config)
        self.dense = nn.Linear(config.hidden_size, config.hidden_size)
        self.dropout = nn.Dropout(config.classifier_dropout or 0.0)
        self.classifier = nn.Linear(config.hidden_size, config.num_labels)
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

    def _encode(self, **kwargs):
        return self.model(**kwargs, return_dict=True)


class NeoBERTForSequenceClassification(_NeoBERTClassifierBase):
    """Classification / regression from the first ([CLS]) token."""

    def forward(
        self,
        input_ids: Optional[torch.Tensor] = None,
        attention_mask: Optional[torch.Tensor] = None,
        position_ids: Optional[torch.Tensor] = None,
        inputs_embeds: Optional[torch.Tensor] = None,
        token_type_ids: Optional[torch.Tensor] = None,
        labels: Optional[torch.Tensor] = None,
        output_hidden_states: Optional[bool] = None,
        output_attentions: Optional[bool] = None,
        return_dict: Optional[bool] = None,
    ):
        out = self._encode(
            input_ids=input_ids,
            attention_mask=attention_mask,
            position_ids=position_ids,
            inputs_embeds=inputs_embeds,
            output_hidden_states=output_hidden_states,
            output_attentions=output_attentions,
        )
        logits = self._head(out.last_hidden_state[:, 0])

        loss = None
        if labels is not None:
            labels = labels.to(logits.device)
            problem_type = self.config.problem_type
            if problem_type is None:
                if self.num_labels == 1:
                    problem_type = "regression"
                elif labels.dtype in (torch.long, torch.int):
                    problem_type = "single_label_classification"
                else:
                    problem_type = "multi_label_classification"
                self.config.problem_type = problem_type
            if problem_type == "regression":
                if self.num_labels == 1:
                    loss = MSELoss()(logits.squeeze(-1).float(), labels.view(-1).float())
                else:
                    loss = MSELoss()(logits.float(), labels.float())
            elif problem_type == "single_label_classification":
                loss = CrossEntropyLoss()(logits.float().view(-1, self.num_labels), labels.view(-1))
            else:
                loss = BCEWithLogitsLoss()(logits.float(), labels.float())

        if not self._return_dict(return_dict):
            rest = tuple(v for v in (out.hidden_states, out.attentions) if v is not None)
            return ((loss,) if loss is not None else ()) + (logits,) + rest
        return SequenceClassifierOutput(
            loss=loss, logits=logits, hidden_states=out.hidden_states, attentions=out.attentions
        )


class NeoBERTForTokenClassification(_NeoBERTClassifierBase):
    """Per-token classification; `labels` of -100 (e.g. padding, sub-word continuations) are not scored."""

    def forward(
        self,
        input_ids: Optional[torch.Tensor] = None,
        attention_mask: Optional[torch.Tensor] = None,
        position_ids: Optional[torch.Tensor] = None,
        inputs_embeds: Optional[torch.Tensor] = None,
        cu_seqlens: Optional[torch.Tensor] = None,
        max_seqlen: Optional[int] = None,
        token_type_ids: Optional[torch.Tensor] = None,
        labels: Optional[torch.Tensor] = None,
        output_hidden_states: Optional[bool] = None,
        output_attentions: Optional[bool] = None,
        return_dict: Optional[bool] = None,
    ):
        out = self._encode(
            input_ids=input_ids,
            attention_mask=attention_mask,
            position_ids=position_ids,
            inputs_embeds=inputs_embeds,
            cu_seqlens=cu_seqlens,
            max_seqlen=max_seqlen,
            output_hidden_states=output_hidden_states,
            output_attentions=output_attentions,
        )
        logits = self._head(out.last_hidden_state)
        loss = None
        if labels is not None:
            labels = labels.to(logits.device)
            if attention_mask is not None:
                # Padding never counts, whatever label the collator left there.
                labels = labels.masked_fill(~attention_mask.to(labels.device).bool(), -100)
            loss = CrossEntropyLoss(ignore_index=-100)(logits.float().view(-1, self.num_labels), labels.view(-1))
        if not self._return_dict(return_dict):
            rest = tuple(v for v in (out.hidden_states, out.attentions) if v is not None)
            return ((loss,) if loss is not None else ()) + (logits,) + rest
        return TokenClassifierOutput(loss=loss, logits=logits, hidden_states=out.hidden_states, attentions=out.attentions)


__all__ = [
    "NeoBERTConfig",
    "NeoBERTPreTrainedModel",
    "NeoBERT",
    "NeoBERTLMHead",
    "NeoBERTForSequenceClassification",
    "NeoBERTForTokenClassification",
]
