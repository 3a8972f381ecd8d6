"""Packed (THD) attention kernels == attention computed one document at a time."""

import pytest
import torch
from megatron.core.transformer.enums import AttnMaskType
from megatron.core.transformer.transformer_config import TransformerConfig

from megatron_neobert.megatron_core_compat import whole_layer_cuda_graphs
from megatron_neobert.model.attention import (PACKED_ATTENTION_ENV, BidirectionalAttention, PackedLayout,
                                              packed_attention_backend)
from megatron_neobert.model.neobert_model import packed_seq_params_from_cu_seqlens

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"
HEAD_DIM = 8
# Lengths 1 to 200 (max_seqlen): the first three fill one segment exactly, the rest need three more.
LENGTHS = (1, 200, 7, 37, 1, 64, 5, 130, 2, 90)


def attention(heads, kv_groups):
    config = TransformerConfig(num_layers=1, hidden_size=heads * HEAD_DIM, num_attention_heads=heads,
                               num_query_groups=kv_groups, attention_dropout=0.0, **whole_layer_cuda_graphs())
    return BidirectionalAttention(config, 1, AttnMaskType.no_mask, "self")


def packed_inputs(heads, kv_groups, lengths=LENGTHS, requires_grad=True, seed=0):
    g = torch.Generator().manual_seed(seed)
    total = sum(lengths)
    q = torch.randn(total, heads, HEAD_DIM, generator=g)
    k, v = (torch.randn(total, kv_groups, HEAD_DIM, generator=g) for _ in range(2))
    cu_seqlens = torch.cumsum(torch.tensor((0,) + tuple(lengths)), 0).to(torch.int32)
    params = packed_seq_params_from_cu_seqlens(cu_seqlens.to(DEVICE), max(lengths))
    return [x.to(DEVICE).requires_grad_(requires_grad) for x in (q, k, v)], params


def per_document_attention(q, k, v, cu_seqlens):
    """Plain softmax attention in float64, one document at a time."""
    repeat = q.shape[1] // k.shape[1]
    bounds = cu_seqlens.tolist()
    outs = []
    for start, end in zip(bounds, bounds[1:]):
        qd, kd, vd = (x[start:end].double().transpose(0, 1) for x in (q, k, v))
        kd, vd = kd.repeat_interleave(repeat, 0), vd.repeat_interleave(repeat, 0)
        weights = torch.softmax(qd @ kd.transpose(1, 2) * HEAD_DIM ** -0.5, dim=-1)
        outs.append((weights @ vd).transpose(0, 1).reshape(end - start, -1))
    return torch.cat(outs)


def assert_equals_per_document_attention(heads, kv_groups, backward=True, tol=1e-5):
    (q, k, v), params = packed_inputs(heads, kv_groups, requires_grad=backward)
    ref_inputs = [x.detach().clone().requires_grad_(backward) for x in (q, k, v)]
    out = attention(heads, kv_groups)(q, k, v, None, packed_seq_params=params)
    ref = per_document_attention(*ref_inputs, params.cu_seqlens_q)
    torch.testing.assert_close(out.double(), ref, rtol=tol, atol=tol)
    if backward:
        grad_out = torch.randn_like(out)
        out.backward(grad_out)
        ref.backward(grad_out.double())
        for name, x, x_ref in zip("qkv", (q, k, v), ref_inputs):
            torch.testing.assert_close(x.grad, x_ref.grad, rtol=tol, atol=tol,
                                       msg=lambda m, name=name: f"d{name}: {m}")


@pytest.mark.parametrize("heads,kv_groups", [(4, 4), (4, 2)], ids=["mha", "gqa"])
def test_segmented_sdpa_equals_per_document_attention(single_rank, monkeypatch, heads, kv_groups):
    monkeypatch.setenv(PACKED_ATTENTION_ENV, "sdpa")
    _, params = packed_inputs(heads, kv_groups)
    assert PackedLayout(params.cu_seqlens_q, sum(LENGTHS), params.max_seqlen_q).segments()[2].shape[0] == 4  # as LENGTHS intends
    assert_equals_per_document_attention(heads, kv_groups)


def test_segmented_sdpa_follows_cu_seqlens_changed_in_place(single_rank, monkeypatch):
    monkeypatch.setenv(PACKED_ATTENTION_ENV, "sdpa")
    (q, k, v), params = packed_inputs(2, 2, lengths=(30, 40, 50), requires_grad=False)
    module = attention(2, 2)
    module(q, k, v, None, packed_seq_params=params)
    params.cu_seqlens_q.copy_(torch.tensor([0, 60, 70, 120]))
    torch.testing.assert_close(module(q, k, v, None, packed_seq_params=params).double(),
                               per_document_attention(q, k, v, params.cu_seqlens_q), rtol=1e-5, atol=1e-5)


@pytest.mark.filterwarnings("ignore:flex_attention called without torch.compile")  # CPU: uncompiled
@pytest.mark.parametrize("backward", [False, pytest.param(True, marks=pytest.mark.skipif(
    DEVICE == "cpu", reason="torch 2.13 has no FlexAttention backward on CPU"))], ids=["forward", "backward"])
@pytest.mark.parametrize("heads,kv_groups", [(4, 4), (4, 2)], ids=["mha", "gqa"])
def test_flex_attention_equals_per_document_attention(single_rank, monkeypatch, heads, kv_groups, backward):
    monkeypatch.setenv(PACKED_ATTENTION_ENV, "flex")
    assert_equals_per_document_attention(heads, kv_groups, backward=backward, tol=1e-4)


def test_packed_attention_backend_choice(monkeypatch):
    on_gpu = torch.cuda.is_available()
    monkeypatch.delenv(PACKED_ATTENTION_ENV, raising=False)
    if not on_gpu:
        assert packed_attention_backend(on_gpu) == "sdpa"
    monkeypatch.setenv(PACKED_ATTENTION_ENV, "sdpa")
    assert packed_attention_backend(on_gpu) == "sdpa"
    monkeypatch.setenv(PACKED_ATTENTION_ENV, "flex")
    with pytest.raises(RuntimeError, match="no attention dropout"):
        packed_attention_backend(on_gpu, dropout=True)
    monkeypatch.setenv(PACKED_ATTENTION_ENV, "dense")
    with pytest.raises(ValueError, match="flash, flex, sdpa"):
        packed_attention_backend(on_gpu)
