"""The complete mapping between megatron-core and Hugging Face state dicts of NeoBERT, both ways.

The HF side uses the published `chandar-lab/NeoBERT` key names (see `hf_format.expected_hf_shapes`); the
megatron-core side is the TP=1/PP=1 `state_dict()` of our model with the local layer spec (Transformer Engine
layer-norm names are accepted on input). Tensors map one to one, renamed, with two changes:
- the vocabulary rows: megatron-core pads them (to a multiple of 128 x TP), the published layout does not;
- each head's q and k rows: NeoBERT rotates interleaved pairs (2i, 2i+1), megatron-core's fused RoPE rotates
  halves (i, i + d/2), so its rows are stored in rotate-half order (see `rotate_half_order`). A pure
  permutation: q.k is unchanged and round trips are bit-exact.
"""

from typing import Dict, Optional

import torch

from .hf_format import validate_hf_state_dict
from ..hf import NeoBERTConfig

StateDict = Dict[str, torch.Tensor]

# Per-layer names: (megatron local spec, Transformer Engine alias or None) -> HF suffix. The layouts agree:
# - linear_qkv rows are grouped per query group ([q_g; k_g; v_g], each dim_head rows); with one head per
#   group (no GQA) that is the published `qkv.view(heads, 3, dim_head, H)` layout (q and k rows aside: above);
# - linear_fc1 of a gated MLP is [gate; up], with silu applied to the first half, like `ffn.w12`.
_LAYER_MAP = (
    ("input_layernorm.weight", "self_attention.linear_qkv.layer_norm_weight", "attention_norm.weight"),
    ("self_attention.linear_qkv.weight", None, "qkv.weight"),
    ("self_attention.linear_proj.weight", None, "wo.weight"),
    ("pre_mlp_layernorm.weight", "mlp.linear_fc1.layer_norm_weight", "ffn_norm.weight"),
    ("mlp.linear_fc1.weight", None, "ffn.w12.weight"),
    ("mlp.linear_fc2.weight", None, "ffn.w3.weight"),
)


def rotate_half_order(dim_head: int) -> torch.Tensor:
    """Rows of one head's q (or k) in megatron-core's rotate-half order, as indices into NeoBERT's
    interleaved order: RoPE turns HF's pair (2i, 2i+1) and megatron-core's (i, i + d/2) by the same
    angle, so row i is HF row 2i and row i + d/2 is HF row 2i + 1."""
    return torch.cat([torch.arange(0, dim_head, 2), torch.arange(1, dim_head, 2)])


def hf_state_dict_from_mcore(mcore_sd: StateDict, config: NeoBERTConfig, vocab_size: Optional[int] = None) -> StateDict:
    """The published HF tensors of a TP=1/PP=1 megatron-core state dict: vocabulary cut to `vocab_size` (default
    `config.vocab_size`), q and k rows back in NeoBERT's interleaved RoPE order."""
    hf = _renamed_to_hf(mcore_sd, config, config.vocab_size if vocab_size is None else vocab_size)
    to_interleaved = torch.argsort(rotate_half_order(config.dim_head))
    return _permute_qk_rows(hf, "model.transformer_encoder.{}.qkv.weight", config, to_interleaved)


def mcore_state_dict_from_hf(hf_sd: StateDict, config: NeoBERTConfig,
                             padded_vocab_size: Optional[int] = None) -> StateDict:
    """The TP=1/PP=1 megatron-core state dict (local-spec names) of published HF tensors: vocabulary rows
    zero-padded to `padded_vocab_size` (default: no padding), q and k rows in megatron-core's rotate-half order."""
    mcore = _renamed_to_mcore(hf_sd, config, config.vocab_size if padded_vocab_size is None else padded_vocab_size)
    return _permute_qk_rows(mcore, "decoder.layers.{}.self_attention.linear_qkv.weight", config,
                            rotate_half_order(config.dim_head))


def _permute_qk_rows(state_dict: StateDict, key_format: str, config: NeoBERTConfig, order: torch.Tensor) -> StateDict:
    """A copy of `state_dict` whose fused QKV weights (rows [q; k; v] per head) have each head's q
    and k rows reordered by `order`; v and every other tensor are kept as they are."""
    out = dict(state_dict)
    for i in range(config.num_hidden_layers):
        key = key_format.format(i)
        qkv = state_dict[key]
        per_head = qkv.reshape(config.num_attention_heads, 3, -1, *qkv.shape[1:])
        permuted = per_head.clone()
        permuted[:, :2] = per_head[:, :2, order]
        out[key] = permuted.reshape(qkv.shape)
    return out


def _renamed_to_hf(mcore_sd: StateDict, config: NeoBERTConfig, vocab_size: int) -> StateDict:
    """megatron-core names -> published HF names, the padded vocabulary cut to `vocab_size`; q and k rows as they
    are. Returned tensors may be views of the inputs."""
    src = {k: v for k, v in mcore_sd.items() if not k.endswith("_extra_state")}
    used = set()

    def take(*names):
        present = [n for n in names if n is not None and n in src]
        if len(present) > 1:
            raise ValueError(f"megatron-core state dict holds both {present[0]} and {present[1]}")
        if not present:
            raise KeyError(f"megatron-core state dict lacks {' / '.join(n for n in names if n)}")
        used.add(present[0])
        return src[present[0]]

    def cut_vocab(t, name):
        if t.shape[0] < vocab_size:
            raise ValueError(f"{name} has {t.shape[0]} rows, fewer than vocab_size={vocab_size}")
        return t[:vocab_size]

    hf = {"model.encoder.weight": cut_vocab(take("embedding.word_embeddings.weight"), "embedding.word_embeddings.weight")}
    for i in range(config.num_hidden_layers):
        for local, te, hf_name in _LAYER_MAP:
            p = f"decoder.layers.{i}."
            hf[f"model.transformer_encoder.{i}.{hf_name}"] = take(p + local, p + te if te else None)
    hf["model.layer_norm.weight"] = take("decoder.final_layernorm.weight")
    hf["decoder.weight"] = cut_vocab(take("output_layer.weight"), "output_layer.weight")
    hf["decoder.bias"] = cut_vocab(take("output_layer.bias"), "output_layer.bias")

    leftover = sorted(set(src) - used)
    if leftover:
        raise ValueError(f"unexpected megatron-core keys {leftover[:6]}{' ...' if len(leftover) > 6 else ''} "
                         f"(is num_hidden_layers={config.num_hidden_layers} right?)")
    validate_hf_state_dict(hf, config, where="converted megatron-core state dict")
    return hf


def _renamed_to_mcore(hf_sd: StateDict, config: NeoBERTConfig, padded_vocab_size: int) -> StateDict:
    """Published HF names -> megatron-core local-spec names, vocabulary rows zero-padded to `padded_vocab_size`;
    q and k rows as they are."""
    if "decoder.weight" not in hf_sd or "decoder.bias" not in hf_sd:
        raise KeyError("the HF state dict has no MLM head (decoder.weight / decoder.bias); megatron needs its output_layer")
    validate_hf_state_dict(hf_sd, config)
    if padded_vocab_size < config.vocab_size:
        raise ValueError(f"padded_vocab_size={padded_vocab_size} is smaller than vocab_size={config.vocab_size}")

    def pad_vocab(t):
        if padded_vocab_size == t.shape[0]:
            return t
        return torch.cat([t, t.new_zeros((padded_vocab_size - t.shape[0],) + tuple(t.shape[1:]))], dim=0)

    out = {"embedding.word_embeddings.weight": pad_vocab(hf_sd["model.encoder.weight"])}
    for i in range(config.num_hidden_layers):
        for local, _, hf_name in _LAYER_MAP:
            out[f"decoder.layers.{i}.{local}"] = hf_sd[f"model.transformer_encoder.{i}.{hf_name}"]
    out["decoder.final_layernorm.weight"] = hf_sd["model.layer_norm.weight"]
    out["output_layer.weight"] = pad_vocab(hf_sd["decoder.weight"])
    out["output_layer.bias"] = pad_vocab(hf_sd["decoder.bias"])
    return out
