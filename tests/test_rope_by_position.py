"""Packed input's RoPE in the local spec, from each token's position: the bits of megatron-core's unfused THD RoPE,
without its per-layer host read of the document lengths and per-document split of q and k."""

import pytest
import torch
from megatron.core.models.common.embeddings.rope_utils import _apply_rotary_pos_emb_thd
from megatron.core.models.common.embeddings.rotary_pos_embedding import RotaryEmbedding

from megatron_neobert.model.attention import LocalPackedSeqParams
from megatron_neobert.model.neobert_model import NeoBERTModel, packed_seq_params_from_cu_seqlens

CU_SEQLENS = [0, 5, 14, 40, 41, 64]  # documents of 5, 9, 26, 1 and 23 tokens
MAX_SEQLEN, HEADS, DIM = 32, 4, 16  # the sample length, as the trainer gives it: no document is longer


class OneContextParallelRank:
    def size(self):
        return 1

    def rank(self):
        return 0


def rotated_by_position(t, cu_seqlens, freqs, interleaved):
    params = packed_seq_params_from_cu_seqlens(cu_seqlens, MAX_SEQLEN)
    positions = NeoBERTModel._default_position_ids(torch.zeros(1, t.shape[0], device=t.device), params)[0]
    rotary = LocalPackedSeqParams.rotary_by_position(freqs, positions, t.dtype, interleaved)
    return LocalPackedSeqParams.of(params, t.shape[0], **rotary).rotate(t)


@pytest.mark.parametrize("interleaved", [False, True])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_rope_by_position_equals_megatron_cores_unfused_thd_rope_bit_for_bit(single_rank, dtype, interleaved):
    freqs = RotaryEmbedding(kv_channels=DIM, rotary_percent=1.0, rotary_interleaved=interleaved)(MAX_SEQLEN)
    t = torch.randn(CU_SEQLENS[-1], HEADS, DIM, generator=torch.Generator().manual_seed(0)).to(dtype)
    cu_seqlens = torch.tensor(CU_SEQLENS, dtype=torch.int32)
    theirs = _apply_rotary_pos_emb_thd(t, cu_seqlens, freqs, rotary_interleaved=interleaved,
                                       cp_group=OneContextParallelRank())
    ours = rotated_by_position(t, cu_seqlens, freqs, interleaved)
    assert ours.dtype == theirs.dtype and torch.equal(ours, theirs)
    assert not torch.equal(ours, t)


def test_rope_by_position_reads_nothing_back_to_the_host(single_rank):
    """On the meta device no tensor has values: a host read (.tolist(), .item(), a tensor's truth value) raises
    there, so a computation that runs through is free of host-device synchronisation."""
    freqs = RotaryEmbedding(kv_channels=DIM, rotary_percent=1.0)(MAX_SEQLEN).to("meta")
    t = torch.empty(CU_SEQLENS[-1], HEADS, DIM, device="meta")
    cu_seqlens = torch.empty(len(CU_SEQLENS), dtype=torch.int32, device="meta")
    out = rotated_by_position(t, cu_seqlens, freqs, interleaved=False)
    assert out.shape == t.shape and out.is_meta
    with pytest.raises((NotImplementedError, RuntimeError), match="meta"):  # megatron-core's reads the lengths
        _apply_rotary_pos_emb_thd(t, cu_seqlens, freqs, cp_group=OneContextParallelRank())


def test_the_local_spec_gives_packed_rope_to_its_attention_not_to_megatron_cores(single_rank, monkeypatch):
    import megatron.core.transformer.attention as mcore_attention

    from megatron_neobert.model import build_model, get_arch, transformer_config

    def thd_rope(t, freqs, config, cu_seqlens=None, **kwargs):
        raise AssertionError("megatron-core's THD RoPE ran")

    monkeypatch.setattr(mcore_attention, "apply_rotary_pos_emb", thd_rope)
    arch = get_arch("neobert-tiny", num_layers=2, hidden_size=64, num_attention_heads=4, ffn_hidden_size=96,
                    vocab_size=128)
    model = build_model(arch, transformer_config(arch), transformer_impl="local")
    params = packed_seq_params_from_cu_seqlens(torch.tensor(CU_SEQLENS, dtype=torch.int32), MAX_SEQLEN)
    with torch.no_grad():
        logits = model(torch.randint(5, 128, (1, CU_SEQLENS[-1])), packed_seq_params=params)
    assert logits.shape == (1, CU_SEQLENS[-1], 128) and torch.isfinite(logits).all()
