"""The HF NeoBERT file's attention paths: export / compile of padded batches, attention implementations,
mask formats, padding-free batches and their memory, recorded outputs on the graph, gradient checkpointing,
losses with num_items_in_batch, and the question-answering / multiple-choice heads."""

import pytest
import torch
import torch.nn.functional as F
from transformers import DataCollatorWithFlattening, PreTrainedModel

from megatron_neobert.hf import (
    NeoBERT,
    NeoBERTForMultipleChoice,
    NeoBERTForQuestionAnswering,
    NeoBERTForSequenceClassification,
    NeoBERTLMHead,
)

from test_hf_model import ATOL, VOCAB, load_model, pad, random_official_state_dict, sentences, tiny_config


@pytest.fixture(scope="module")
def sd():
    return random_official_state_dict(tiny_config())


def model_with(sd, cls=NeoBERT, **config):
    return load_model(cls, tiny_config(**config), sd)


def batch():
    return pad(sentences([9, 4, 7, 9]))


# ------------------------------------------------------------------------------------------------
# Export and compile of a padded batch
# ------------------------------------------------------------------------------------------------


def test_padded_batch_exports_and_equals_eager(sd):
    model = model_with(sd, NeoBERTLMHead, attn_implementation="sdpa")
    ids, mask = batch()
    exported = torch.export.export(model, (), {"input_ids": ids, "attention_mask": mask}).module()
    with torch.no_grad():
        torch.testing.assert_close(exported(input_ids=ids, attention_mask=mask).logits,
                                   model(input_ids=ids, attention_mask=mask).logits, atol=ATOL, rtol=1e-5)
        # the padding is an input, not a constant of the graph: another padding pattern, and none at all
        for other in (mask.flip(0), torch.ones_like(mask)):
            torch.testing.assert_close(exported(input_ids=ids, attention_mask=other).logits,
                                       model(input_ids=ids, attention_mask=other).logits, atol=ATOL, rtol=1e-5)


def test_jit_trace_of_an_unpadded_batch_still_applies_padding(sd):
    model = model_with(sd, attn_implementation="sdpa")
    ids, mask = batch()
    with torch.no_grad():
        traced = torch.jit.trace(model, (ids, torch.ones_like(mask)), strict=False)
        torch.testing.assert_close(traced(ids, mask)["last_hidden_state"],
                                   model(ids, attention_mask=mask).last_hidden_state, atol=ATOL, rtol=1e-5)


def test_padded_batch_compiles_fullgraph_without_recompiling(sd):
    import torch._dynamo

    model = model_with(sd, NeoBERTLMHead, attn_implementation="sdpa")
    ids, mask = batch()
    torch._dynamo.reset()
    compiled = torch.compile(model, fullgraph=True, backend="aot_eager")
    with torch.no_grad():
        torch.testing.assert_close(compiled(input_ids=ids, attention_mask=mask).logits,
                                   model(input_ids=ids, attention_mask=mask).logits, atol=ATOL, rtol=1e-5)
        with torch._dynamo.config.patch(error_on_recompile=True):  # padding that comes and goes: one graph
            full = torch.ones_like(mask)
            torch.testing.assert_close(compiled(input_ids=ids, attention_mask=full).logits,
                                       model(input_ids=ids, attention_mask=full).logits, atol=ATOL, rtol=1e-5)
    torch._dynamo.reset()


# ------------------------------------------------------------------------------------------------
# Attention implementations and mask formats
# ------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("impl", ["sdpa", "flex_attention"])
def test_cpu_attention_implementations_equal_eager(sd, impl):
    """Padded, padding-free and packed (cu_seqlens) batches. Flex attention runs on CPU for inference only."""
    eager, other = model_with(sd, attn_implementation="eager"), model_with(sd, attn_implementation=impl)
    ids, mask = batch()
    # the documents regroup to the padded batch's [4, 9]: flex attention (compiled per shape) compiles once
    flat = ids[mask.bool()][None]
    cu = F.pad(mask.sum(1).cumsum(0), (1, 0)).to(torch.int32)
    with torch.no_grad():
        real = mask.bool()
        torch.testing.assert_close(other(ids, attention_mask=mask).last_hidden_state[real],
                                   eager(ids, attention_mask=mask).last_hidden_state[real], atol=ATOL, rtol=1e-5)
        torch.testing.assert_close(other(flat, cu_seqlens=cu).last_hidden_state,
                                   eager(flat, cu_seqlens=cu).last_hidden_state, atol=ATOL, rtol=1e-5)


def mask_formats(mask, dtype=torch.float32):
    """The same padding in every format transformers accepts."""
    keep = mask.bool()
    additive = torch.zeros(keep.shape, dtype=dtype).masked_fill(~keep, float("-inf"))
    L = mask.shape[1]
    return {
        "2D long 0/1": mask,
        "2D bool": keep,
        "2D float 0/1": mask.float(),
        "4D additive -inf [B,1,1,L]": additive[:, None, None, :],
        "4D additive finfo.min [B,1,L,L]": torch.zeros(keep.shape[0], 1, L, L).masked_fill(
            ~keep[:, None, None, :], torch.finfo(dtype).min),
        "4D bool [B,1,L,L]": keep[:, None, None, :].expand(-1, 1, L, L),
    }


@pytest.mark.parametrize("impl", ["eager", "sdpa"])
def test_every_mask_format_gives_the_same_output(sd, impl):
    model = model_with(sd, attn_implementation=impl)
    ids, mask = batch()
    real = mask.bool()
    with torch.no_grad():
        # 4D masks carry no positions: give the ones a 2D mask implies (right padding: 0.. per sequence)
        expected = model(ids, attention_mask=mask).last_hidden_state[real]
        for name, m in mask_formats(mask).items():
            got = model(ids, attention_mask=m).last_hidden_state
            assert torch.isfinite(got).all(), name
            torch.testing.assert_close(got[real], expected, atol=ATOL, rtol=1e-5, msg=name)


def test_wrong_masks_are_refused(sd):
    model = model_with(sd)
    ids, mask = batch()
    B, L = ids.shape
    additive_2d = torch.zeros(B, L).masked_fill(mask == 0, float("-inf"))  # NeoBERT's own training format
    cases = {
        "additive 0/-inf": (additive_2d, "values other than 0 and 1"),
        "3D": (mask[:, None, :], "got shape"),
        "wrong length": (mask[:, :-1], "does not match|has shape"),
        "4D wrong length": (torch.zeros(B, 1, 1, L + 1), "does not broadcast"),
        "4D long": (mask[:, None, None, :], "4D torch.int64"),
        "4D 0/1 float": (mask[:, None, None, :].float(), "positive values"),
    }
    for name, (bad, message) in cases.items():
        with pytest.raises(ValueError, match=message):
            model(ids, attention_mask=bad)


# ------------------------------------------------------------------------------------------------
# Padding-free batches
# ------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("flash_kwargs", [False, True])
@pytest.mark.parametrize("impl", ["eager", "sdpa"])
def test_padding_free_batch_equals_padded(sd, impl, flash_kwargs):
    """DataCollatorWithFlattening's batches (position_ids restarting, or cu_seq_lens_q/k) equal the padded batch."""
    model = model_with(sd, NeoBERTLMHead, attn_implementation=impl)
    seqs = sentences([9, 4, 7, 1, 12], seed=5)
    ids, mask = pad(seqs)
    flat = DataCollatorWithFlattening(**({"return_flash_attn_kwargs": True} if flash_kwargs else {}))(
        [{"input_ids": s.tolist(), "labels": s.tolist()} for s in seqs])
    if flash_kwargs:
        assert "cu_seq_lens_q" in flat
    flat = {k: v for k, v in flat.items() if k != "seq_idx"}
    with torch.no_grad():
        padded = model(input_ids=ids, attention_mask=mask).logits[mask.bool()]
        out = model(**flat)
    torch.testing.assert_close(out.logits[0], padded, atol=ATOL, rtol=1e-5)
    assert out.loss is not None and torch.isfinite(out.loss)


class RecordedAttention:
    """Records the query and mask shapes every attention call gets, through transformers' attention interface."""

    def __init__(self):
        self.calls = []

    def __call__(self, module, query, key, value, attention_mask, **kwargs):
        from transformers.integrations.sdpa_attention import sdpa_attention_forward

        self.calls.append((tuple(query.shape), None if attention_mask is None else attention_mask.numel()))
        return sdpa_attention_forward(module, query, key, value, attention_mask, **kwargs)


def test_packed_attention_memory_grows_with_documents_not_batch_squared(sd):
    from transformers import AttentionInterface

    recorder = RecordedAttention()
    AttentionInterface.register("neobert_recorded_sdpa", recorder)
    model = model_with(sd, attn_implementation="neobert_recorded_sdpa")
    doc_length = 16
    sizes = {}
    for num_docs in (4, 16):
        tokens = num_docs * doc_length
        ids = torch.randint(1, VOCAB, (1, tokens), generator=torch.Generator().manual_seed(num_docs))
        cu = torch.arange(0, tokens + 1, doc_length, dtype=torch.int32)
        recorder.calls.clear()
        with torch.no_grad():
            model(ids, cu_seqlens=cu)
        (query_shape, mask_size), = set(recorder.calls)  # the same for every layer
        # [documents and the (here empty) pack-padding one after cu_seqlens[-1], heads, longest document, head dim]
        assert query_shape == (num_docs + 1, 4, doc_length, 8)
        sizes[num_docs] = mask_size
        assert mask_size == (num_docs + 1) * doc_length < tokens * tokens
    assert sizes[16] - sizes[4] == 12 * doc_length  # linear in the documents; a dense [T, T] mask would be 16x


# ------------------------------------------------------------------------------------------------
# Recorded outputs, gradient checkpointing
# ------------------------------------------------------------------------------------------------


def test_returned_hidden_states_and_attentions_are_on_the_graph(sd):
    model = model_with(sd).train()
    ids, mask = batch()
    out = model(ids, attention_mask=mask, output_hidden_states=True, output_attentions=True)
    for i, h in enumerate(out.hidden_states[:-1]):
        grad, = torch.autograd.grad(out.last_hidden_state.sum(), h, retain_graph=True)
        assert grad.abs().sum() > 0, i
    grad, = torch.autograd.grad(out.last_hidden_state.sum(), out.attentions[0], retain_graph=True)
    assert grad.abs().sum() > 0
    assert out.hidden_states[-1] is out.last_hidden_state


@pytest.mark.skipif(not hasattr(PreTrainedModel, "activation_checkpointing_enable"),
                    reason="every_n_layers came with activation_checkpointing_enable, after transformers 5.12")
def test_gradient_checkpointing_every_n_layers(sd):
    cfg = dict(num_hidden_layers=4)
    sd4 = random_official_state_dict(tiny_config(**cfg))
    ids, mask = batch()
    grads, recomputed = [], None
    for every in (None, 2):
        model = load_model(NeoBERTLMHead, tiny_config(**cfg), sd4).train()
        if every:
            model.activation_checkpointing_enable(every_n_layers=every)
        calls = [0] * 4
        for i, layer in enumerate(model.model.transformer_encoder):
            layer.qkv.register_forward_hook(lambda *_, i=i: calls.__setitem__(i, calls[i] + 1))
        model(ids, attention_mask=mask, labels=ids).loss.backward()
        grads.append([p.grad.clone() for p in model.parameters()])
        recomputed = calls
    assert [layer.gradient_checkpointing for layer in model.model.transformer_encoder] == [True, False, True, False]
    assert recomputed == [2, 1, 2, 1]  # checkpointed layers run again in the backward pass
    for a, b in zip(*grads):
        torch.testing.assert_close(a, b)


# ------------------------------------------------------------------------------------------------
# Losses and heads
# ------------------------------------------------------------------------------------------------


def test_num_items_in_batch_gives_the_full_batch_loss_over_micro_batches(sd):
    model = model_with(sd, NeoBERTLMHead)
    ids, mask = batch()
    labels = ids.masked_fill(mask == 0, -100)
    labels[:, ::3] = -100
    full = model(ids, attention_mask=mask, labels=labels).loss
    items = (labels != -100).sum()
    halves = [model(ids[s], attention_mask=mask[s], labels=labels[s], num_items_in_batch=items).loss
              for s in (slice(0, 1), slice(1, None))]
    torch.testing.assert_close(halves[0] + halves[1], full)


def test_mean_pooling_and_left_padding(sd):
    ids, mask = pad(sentences([9, 4, 7]))
    left_ids, left_mask = pad(sentences([9, 4, 7]), left=True)
    for pooling in ("cls", "mean"):
        clf = model_with(sd, NeoBERTForSequenceClassification, num_labels=3, classifier_pooling=pooling)
        states = clf.model(ids, attention_mask=mask).last_hidden_state
        keep = mask[..., None].float()
        pooled = states[:, 0] if pooling == "cls" else (states * keep).sum(1) / keep.sum(1)
        logits = clf(ids, attention_mask=mask).logits
        torch.testing.assert_close(logits, clf._head(pooled))
        # left padding: the same sequences, the same logits
        torch.testing.assert_close(clf(left_ids, attention_mask=left_mask).logits, logits, atol=ATOL, rtol=1e-5)
    from huggingface_hub.errors import StrictDataclassError

    with pytest.raises(StrictDataclassError, match="classifier_pooling"):
        tiny_config(classifier_pooling="max")


def test_question_answering_head(sd):
    qa = model_with(sd, NeoBERTForQuestionAnswering).train()
    ids, mask = batch()
    start, end = torch.tensor([0, 2, 1, 30]), torch.tensor([3, 3, 5, 30])  # 30: outside, not scored
    out = qa(ids, attention_mask=mask, start_positions=start, end_positions=end)
    assert out.start_logits.shape == out.end_logits.shape == ids.shape
    L = ids.shape[1]
    expected = (F.cross_entropy(out.start_logits, start.clamp(0, L), ignore_index=L)
                + F.cross_entropy(out.end_logits, end.clamp(0, L), ignore_index=L)) / 2
    torch.testing.assert_close(out.loss, expected)
    out.loss.backward()
    assert qa.classifier.weight.grad.abs().sum() > 0


def test_multiple_choice_head(sd):
    mc = model_with(sd, NeoBERTForMultipleChoice)
    ids, mask = batch()  # 4 sequences = 2 questions x 2 choices
    out = mc(ids.view(2, 2, -1), attention_mask=mask.view(2, 2, -1), labels=torch.tensor([1, 0]))
    assert out.logits.shape == (2, 2)
    each = torch.stack([mc._head(mc.model(ids[i:i + 1], attention_mask=mask[i:i + 1]).last_hidden_state[:, 0])[0, 0]
                        for i in range(4)])
    torch.testing.assert_close(out.logits, each.view(2, 2), atol=ATOL, rtol=1e-5)
    torch.testing.assert_close(out.loss, F.cross_entropy(out.logits, torch.tensor([1, 0])))
