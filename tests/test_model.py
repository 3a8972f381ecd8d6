"""NeoBERTModel on one rank: the published shapes, packed == padded, RoPE, bidirectionality."""

import dataclasses

import pytest
import torch

from megatron_neobert.model import PRESETS, build_model, get_arch, transformer_config
from megatron_neobert.model.neobert_model import packed_seq_params_from_cu_seqlens

SMALL = dict(num_layers=2, hidden_size=32, num_attention_heads=4, ffn_hidden_size=48, vocab_size=128)


def small_model(preset="neobert-tiny", seed=0, **overrides):
    arch = get_arch(preset, **{**SMALL, **overrides})
    torch.manual_seed(seed)
    model = build_model(arch, transformer_config(arch), transformer_impl="local")
    return model.eval()


def test_neobert_250m_matches_the_published_parameter_count_and_shapes(single_rank):
    arch = get_arch("neobert-250m")
    model = build_model(arch, transformer_config(arch, perform_initialization=False),
                        transformer_impl="local", vocab_size=arch.vocab_size)
    shapes = {k: tuple(v.shape) for k, v in model.state_dict().items() if "_extra_state" not in k}
    head = sum(torch.Size(s).numel() for k, s in shapes.items() if k.startswith("output_layer."))
    total = sum(torch.Size(s).numel() for s in shapes.values())
    assert total - head == 221_665_536
    assert total == 245_136_954
    assert shapes["embedding.word_embeddings.weight"] == (30522, 768)
    assert shapes["output_layer.weight"] == (30522, 768) and shapes["output_layer.bias"] == (30522,)
    assert shapes["decoder.final_layernorm.weight"] == (768,)
    per_layer = {
        "input_layernorm.weight": (768,),
        "self_attention.linear_qkv.weight": (2304, 768),
        "self_attention.linear_proj.weight": (768, 768),
        "pre_mlp_layernorm.weight": (768,),
        "mlp.linear_fc1.weight": (4096, 768),
        "mlp.linear_fc2.weight": (768, 2048),
    }
    for i in range(28):
        assert {k.split(f"decoder.layers.{i}.")[1]: s for k, s in shapes.items()
                if k.startswith(f"decoder.layers.{i}.")} == per_layer
    assert len(shapes) == 3 + 1 + 28 * 6  # no biases anywhere but the MLM head


def documents(seed=0):
    g = torch.Generator().manual_seed(seed)
    return [torch.randint(5, 128, (n,), generator=g) for n in (5, 9, 14)]


def packed_logits(model, docs):
    lengths = torch.tensor([0] + [len(d) for d in docs])
    cu_seqlens = torch.cumsum(lengths, 0).to(torch.int32)
    params = packed_seq_params_from_cu_seqlens(cu_seqlens, max(len(d) for d in docs))
    with torch.no_grad():
        logits = model(torch.cat(docs).unsqueeze(0), packed_seq_params=params)[0]
    return list(torch.split(logits, [len(d) for d in docs]))


def padded_logits(model, doc, length=16):
    ids = torch.zeros(1, length, dtype=torch.long)
    ids[0, :len(doc)] = doc
    mask = torch.zeros(1, length, dtype=torch.bool)
    mask[0, :len(doc)] = True
    with torch.no_grad():
        return model(ids, attention_mask=mask)[0, :len(doc)]


@pytest.mark.filterwarnings("ignore:flex_attention called without torch.compile")
@pytest.mark.parametrize("packed_attention", ["sdpa", "flex"])
def test_packed_documents_equal_each_document_alone_padded(single_rank, monkeypatch, packed_attention):
    monkeypatch.setenv("NEOBERT_PACKED_ATTENTION", packed_attention)
    model, docs = small_model(), documents()
    for packed, doc in zip(packed_logits(model, docs), docs):
        torch.testing.assert_close(packed, padded_logits(model, doc), rtol=1e-5, atol=1e-5)


def test_changing_one_packed_document_leaves_the_others_unchanged(single_rank):
    model, docs = small_model(), documents()
    before = packed_logits(model, docs)
    changed = [docs[0], torch.flip(docs[1], [0]) + 1, docs[2]]
    after = packed_logits(model, changed)
    torch.testing.assert_close(after[0], before[0], rtol=0, atol=1e-6)
    torch.testing.assert_close(after[2], before[2], rtol=0, atol=1e-6)
    assert not torch.allclose(after[1], before[1])


def test_attention_is_bidirectional(single_rank):
    model = small_model()
    ids = torch.randint(5, 128, (1, 12))
    with torch.no_grad():
        first = model(ids)[0, 0]
        ids[0, -1] = (ids[0, -1] + 7) % 128
        assert not torch.allclose(model(ids)[0, 0], first), "a later token must change token 0"


def test_rope_on_rotate_half_rows_matches_the_interleaved_complex_rotation(single_rank):
    """q and k rows are stored in rotate-half order (conversion permutes them): megatron-core's RoPE
    on them is NeoBERT's interleaved rotation of the rows in HF order."""
    from megatron.core.models.common.embeddings.rope_utils import apply_rotary_pos_emb

    from megatron_neobert.conversion.state_dict_mapping import rotate_half_order

    model = small_model()
    assert not model.config.rotary_interleaved
    seq, heads, dim = 10, 2, SMALL["hidden_size"] // SMALL["num_attention_heads"]
    x = torch.randn(seq, 1, heads, dim)  # HF order
    order = rotate_half_order(dim)
    rotated = apply_rotary_pos_emb(x[..., order], model.rotary_pos_emb(seq), config=model.config)
    rotated = rotated[..., torch.argsort(order)]  # back to HF order

    # Independent formula: pairs (2i, 2i+1) as complex numbers, times e^{i * pos * theta_i}.
    theta = 10000.0 ** (-torch.arange(0, dim, 2, dtype=torch.float64) / dim)
    angles = torch.arange(seq, dtype=torch.float64)[:, None] * theta[None, :]
    pairs = torch.view_as_complex(x.double().reshape(seq, 1, heads, dim // 2, 2).contiguous())
    expected = torch.view_as_real(pairs * torch.polar(torch.ones_like(angles), angles)[:, None, None, :])
    torch.testing.assert_close(rotated.double(), expected.reshape(seq, 1, heads, dim), rtol=1e-5, atol=1e-5)


def test_mlm_loss_runs_only_on_labelled_positions(single_rank):
    model = small_model()
    ids = torch.randint(5, 128, (2, 8))
    labels = torch.full((2, 8), -100)
    labels[0, 3], labels[1, 6] = 17, 42
    loss, correct = model(ids, labels=labels)
    with torch.no_grad():
        logits = model(ids)
    expected = torch.nn.functional.cross_entropy(logits[[0, 1], [3, 6]], torch.tensor([17, 42]),
                                                 reduction="none")
    # [s, b] order: position 3 of row 0 comes before position 6 of row 1.
    torch.testing.assert_close(loss, expected, rtol=1e-5, atol=1e-5)
    assert correct.tolist() == (logits[[0, 1], [3, 6]].argmax(-1) == torch.tensor([17, 42])).tolist()


def hf_logits(model, arch, ids, mask):
    """The same weights in our Hugging Face modeling file: an implementation written independently of
    megatron-core's layers."""
    from megatron_neobert.conversion.shape_bridge import hf_config_for_arch
    from megatron_neobert.hf import NeoBERTLMHead
    from megatron_neobert.conversion.state_dict_mapping import hf_state_dict_from_mcore

    state = {k: v for k, v in model.state_dict().items() if "_extra_state" not in k}
    config = hf_config_for_arch(arch)
    hf = NeoBERTLMHead(config).eval()
    hf.load_state_dict(hf_state_dict_from_mcore(state, config))
    with torch.no_grad():
        return hf(input_ids=ids, attention_mask=mask).logits


@pytest.mark.parametrize("preset", sorted(PRESETS))
def test_every_preset_builds_and_runs_reduced(single_rank, preset):
    """Each preset, cut to a small size: its block is the one it names (biases, positions), padding changes
    nothing at the real positions, and a NeoBERT-block preset gives the HF model's logits."""
    arch = dataclasses.replace(PRESETS[preset], **SMALL)
    model = small_model(preset)
    assert model.position_embedding_type == arch.position_embedding_type
    has_bias = any(n.endswith("linear_qkv.bias") for n, _ in model.named_parameters())
    assert has_bias == arch.add_bias_linear
    ids = torch.randint(5, 128, (2, 8), generator=torch.Generator().manual_seed(1))
    mask = torch.ones(2, 8, dtype=torch.bool)
    mask[1, 5:] = False
    with torch.no_grad():
        logits = model(ids, attention_mask=mask)
        alone = model(ids[1:, :5], attention_mask=mask[1:, :5])
        other_padding = ids.clone()
        other_padding[1, 5:] = 7
        repadded = model(other_padding, attention_mask=mask)
    assert logits.shape == (2, 8, 128)
    torch.testing.assert_close(logits[1, :5], alone[0], rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(repadded[:, :5], logits[:, :5], rtol=1e-5, atol=1e-5)
    assert not torch.allclose(logits[0, 0], logits[0, 1], rtol=0, atol=1e-3)  # positions differ: not degenerate
    if arch.position_embedding_type == "rope" and not arch.add_bias_linear:
        hf = hf_logits(model, arch, ids, mask)
        torch.testing.assert_close(logits[mask], hf[mask], rtol=1e-4, atol=1e-5)


def test_ablation_m0_is_bert_like_and_m1_is_neobert_block():
    m0, m1 = get_arch("ablation-m0"), get_arch("ablation-m1")
    assert (m0.normalization, m0.activation, m0.position_embedding_type) == ("LayerNorm", "gelu", "learned_absolute")
    assert (m1.normalization, m1.activation, m1.position_embedding_type) == ("RMSNorm", "swiglu", "rope")
    assert dataclasses.replace(get_arch("ablation-m8"), max_sequence_length=4096) == get_arch("neobert-250m")
    with pytest.raises(ValueError, match="unknown model preset"):
        get_arch("neobert-huge")


def test_the_layer_implementation_is_decided_in_one_place():
    from megatron_neobert.kernels import choose_transformer_impl

    assert [choose_transformer_impl("auto", gpu, te) for gpu in (False, True) for te in (False, True)] == [
        "local", "local", "local", "transformer_engine"]
    assert choose_transformer_impl("local", True, True) == "local"
    assert choose_transformer_impl("transformer_engine", False, True) == "transformer_engine"
    with pytest.raises(ValueError, match="--transformer-impl"):
        choose_transformer_impl("fast", False, False)
    with pytest.raises(ValueError, match="Transformer Engine does not import"):
        choose_transformer_impl("transformer_engine", True, False)


def test_packed_documents_with_the_whole_pack_as_max_seqlen_equal_each_document_alone(single_rank):
    """The trainer passes the sample length as max_seqlen; with one sample per micro-batch that is
    every packed token, and megatron-core's unfused THD RoPE then counts positions from the start of
    the pack, not of each document: a shift within a document, which RoPE's scores do not see."""
    model, docs = small_model(), documents()
    total = sum(len(d) for d in docs)
    cu_seqlens = torch.tensor([0, 5, 14, 28], dtype=torch.int32)
    with torch.no_grad():
        logits = model(torch.cat(docs)[None], packed_seq_params=packed_seq_params_from_cu_seqlens(cu_seqlens, total))[0]
    for packed, doc in zip(torch.split(logits, [len(d) for d in docs]), docs):
        torch.testing.assert_close(packed, padded_logits(model, doc, length=32), rtol=1e-5, atol=1e-5)


def _masked_lm_batch(packed: bool, seed=0):
    g = torch.Generator().manual_seed(seed)
    tokens = torch.randint(5, 128, (2, 16), generator=g)
    labels = torch.where(torch.rand(2, 16, generator=g) < 0.3, tokens, -100)
    batch = {"tokens": tokens, "labels": labels}
    if packed:
        batch["cu_seqlens"] = torch.tensor([0, 7, 16, 21, 32], dtype=torch.int32)
    else:
        batch["attention_mask"] = torch.arange(16)[None] < torch.tensor([[16], [11]])
        batch["labels"] = torch.where(batch["attention_mask"], labels, -100)
    return batch


@pytest.mark.parametrize("packed", [False, True])
def test_fixed_size_masked_list_gives_the_loss_and_gradients_of_the_labelled_positions(single_rank, packed):
    """The head on the loader's padded list of masked positions (index_select) against the
    cross-entropy of the full logits at the labelled positions: same per-token losses, same
    gradients; the padding of the list adds nothing."""
    from megatron_neobert.data.datasets.batches import masked_position_list
    from megatron_neobert.training.engine.forward_step import model_inputs

    model = small_model().train()
    batch = _masked_lm_batch(packed)
    batch["masked_positions"], batch["num_masked"] = masked_position_list(batch["labels"], mask_rate=0.3)
    count = int(batch["num_masked"])
    assert batch["masked_positions"].shape[0] > count  # padded to the fixed length

    inputs = model_inputs(batch)
    loss, correct = model(**inputs)
    loss.sum().backward()
    grads = {n: p.grad.clone() for n, p in model.named_parameters()}
    model.zero_grad()

    reference_inputs = {k: v for k, v in inputs.items() if k not in ("labels", "masked_positions", "num_masked")}
    logits = model(**reference_inputs).reshape(-1, 128)
    labels = batch["labels"].reshape(-1)
    selected = labels != -100
    reference = torch.nn.functional.cross_entropy(logits[selected], labels[selected], reduction="none")
    reference.sum().backward()

    torch.testing.assert_close(loss[:count], reference, rtol=1e-5, atol=1e-6)
    assert (loss[count:] == 0).all() and not correct[count:].any()
    assert correct[:count].tolist() == (logits[selected].argmax(-1) == labels[selected]).tolist()
    for name, param in model.named_parameters():
        torch.testing.assert_close(grads[name], param.grad, rtol=1e-5, atol=1e-6, msg=name)
