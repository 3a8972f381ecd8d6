"""CDE: contextual batching, the two-stage model, two-stage GradCache, export/load, training and MTEB."""

import json

import numpy as np
import pytest
import torch

from embed_fixtures import load_tool, make_model_folder, make_tokenizer, topic_pairs
from megatron_neobert.embeddings.cde import (CDEEncoder, ContextualNeoBERT, cde_grad_cache_step,
                                             contextual_batches, load_cde, save_cde)
from megatron_neobert.embeddings.contrastive import info_nce_loss
from megatron_neobert.embeddings.finetune import load_encoder

DOCS = ["pw1 pw2 red", "pw3 the dog", "pw4 with a cat and a bird", "pw5", "city river tree house road"]


@pytest.fixture(scope="module")
def folders(tmp_path_factory):
    root = tmp_path_factory.mktemp("cde")
    tok = make_tokenizer(root / "tok")
    return make_model_folder(root / "first", seed=0, tokenizer_dir=tok), make_model_folder(
        root / "second", seed=1, tokenizer_dir=tok, hidden_size=48, num_attention_heads=4, intermediate_size=96), tok


def cde_full_step(model, context_batch, batches, loss_fn):
    """The uncached reference: one graph over the context and the whole batch."""
    context = model.embed_context(**context_batch)
    loss = loss_fn(*[model(**b, context=context).float() for b in batches])
    loss.backward()
    return loss.detach()


def build(folders, context_size=4):
    first, _, _ = load_encoder(folders[0])
    second, _, _ = load_encoder(folders[1])
    torch.manual_seed(0)
    return ContextualNeoBERT(first, second, context_size)


def test_second_stage_reads_the_context_vectors(folders):
    model = build(folders).eval()
    docs = model.tokenize(["pw1 pw2", "qw3 the dog"])
    ctx_a = model.embed_context(**model.first.tokenize(DOCS[:4]))
    ctx_b = model.embed_context(**model.first.tokenize(DOCS[1:5]))
    assert ctx_a.shape == (4, 32)

    seen = {}
    hook = model.second.backbone.register_forward_pre_hook(lambda m, a, kw: seen.update(kw), with_kwargs=True)
    with torch.no_grad():
        emb_a = model(**docs, context=ctx_a)
    hook.remove()
    # the first J input positions are the projected context vectors, the rest the document's token embeddings
    torch.testing.assert_close(seen["inputs_embeds"][:, :4], model.projection(ctx_a).expand(2, 4, 48))
    torch.testing.assert_close(seen["inputs_embeds"][:, 4:], model.second.backbone.encoder(docs["input_ids"]))
    assert seen["position_ids"][0].tolist()[:4] == [0, 0, 0, 0] and seen["position_ids"][0, 4] == 1
    with torch.no_grad():
        emb_b = model(**docs, context=ctx_b)
        emb_a_again = model(**docs, context=ctx_a)
        emb_perm = model(**docs, context=ctx_a.flip(0))
    assert emb_a.shape == (2, 48)
    assert (emb_a - emb_b).abs().max() > 1e-3  # changing the context changes the embedding
    torch.testing.assert_close(emb_a, emb_a_again)
    torch.testing.assert_close(emb_a, emb_perm, atol=1e-5, rtol=1e-4)  # the context is a set (all at position 0)
    # pooling covers document tokens only: a padded copy of one document gives the same vector
    with torch.no_grad():
        alone = model(**model.tokenize(["pw1 pw2"]), context=ctx_a)
    torch.testing.assert_close(alone[0], emb_a[0], atol=1e-5, rtol=1e-4)


@pytest.mark.parametrize("chunk_size", [1, 3])
def test_two_stage_grad_cache_equals_uncached(folders, chunk_size):
    model = build(folders, context_size=5)
    q, p = topic_pairs([(0, 1), (2, 3), (4, 5), (6, 7)])
    ctx = model.first.tokenize(DOCS)
    batches = [model.tokenize(q), model.tokenize(p + ["the red car"])]

    def grads(fn, *args):
        model.zero_grad(set_to_none=True)
        loss = fn(model, ctx, batches, info_nce_loss, *args)
        return loss, {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}

    loss_ref, ref = grads(cde_full_step)
    loss_gc, gc = grads(cde_grad_cache_step, chunk_size)
    assert loss_gc.item() == pytest.approx(loss_ref.item(), rel=1e-6)
    assert ref.keys() == gc.keys()
    assert any(n.startswith("first.") for n in ref) and "projection.weight" in ref  # both stages get gradients
    assert ref["first.backbone.transformer_encoder.0.qkv.weight"].abs().max() > 0
    for name in ref:
        torch.testing.assert_close(gc[name], ref[name], atol=1e-5, rtol=1e-4, msg=lambda m: f"{name}: {m}")


def test_clustering_puts_near_duplicates_together():
    rng = np.random.default_rng(0)
    centers = rng.normal(size=(6, 16))
    groups = np.repeat(np.arange(6), 8)
    x = centers[groups] + 0.01 * rng.normal(size=(48, 16))
    order = rng.permutation(48)
    batches = contextual_batches(x[order], batch_size=8, seed=0)
    assert sorted(np.concatenate([b.indices for b in batches]).tolist()) == list(range(48))
    for b in batches:
        assert len(b.indices) == 8 and len(set(groups[order][b.indices])) == 1  # one near-duplicate group
        assert set(b.indices) <= set(b.cluster)
    # uneven clusters: remainders are still batched, partial last batch dropped by default
    batches = contextual_batches(x[order][:45], batch_size=8, seed=0)
    assert all(len(b.indices) == 8 for b in batches) and len(batches) == 5
    assert sum(len(b.indices) for b in contextual_batches(x[:45], 8, drop_last=False)) == 45
    with pytest.raises(ValueError, match="3 pairs cannot fill one batch of 8"):
        contextual_batches(x[:3], batch_size=8)


def test_export_load_training_tool_and_mteb(folders, tmp_path, monkeypatch, caplog):
    model = build(folders)
    with torch.no_grad():
        model.projection.weight.mul_(3.0)  # something the round trip must keep
    save_cde(model, ({}, {}), tmp_path / "cde", (folders[2], folders[2]))
    loaded = load_cde(tmp_path / "cde")
    ctx = model.embed_context(**model.first.tokenize(DOCS[:4])).detach()
    docs = model.tokenize(["pw1 pw2", "qw3 the dog"])
    with torch.no_grad():
        torch.testing.assert_close(loaded.eval()(**docs, context=ctx), model.eval()(**docs, context=ctx))
    cfg = json.loads((tmp_path / "cde" / "cde_config.json").read_text())
    assert cfg["context_size"] == 4 and cfg["second_stage_hidden_size"] == 48
    with pytest.raises(FileNotFoundError, match="not a CDE export"):
        load_cde(folders[0])

    q, p = topic_pairs([(a, b) for a in range(12) for b in range(a + 1, 12)][:40])
    data = tmp_path / "msmarco.jsonl"
    data.write_text("".join(json.dumps({"query": a, "positive": b}) + "\n" for a, b in zip(q, p)))
    caplog.set_level("INFO")
    out = load_tool("finetune_cde").main([
        "--model", str(folders[0]), "--second-stage-model", str(folders[1]), "--output", str(tmp_path / "trained"),
        "--dataset", str(data), "--steps", "4", "--batch-size", "8", "--context-size", "6", "--chunk-size", "4",
        "--warmup-steps", "1", "--lr", "1e-3", "--checkpoint-every", "2", "--log-every", "3"])
    # The loss as it trains, the last step's whatever --log-every, and where the model went.
    logged = [r.getMessage() for r in caplog.records]
    assert [m.split(" loss")[0] for m in logged if " loss " in m] == ["step 3/4", "step 4/4"], logged
    assert f"wrote {tmp_path / 'trained'}" in logged
    trained = load_cde(out)
    assert trained.context_size == 6 and (tmp_path / "trained-checkpoints" / "step_2" / "cde_config.json").is_file()
    assert (trained.projection.weight - build(folders).projection.weight).abs().max() > 1e-6  # it trained
    assert not [x for x in tmp_path.rglob("*") if ".tmp-" in x.name]

    from test_mteb_eval import LocalRetrieval

    task = LocalRetrieval()
    contexts = []
    real = CDEEncoder.embed_context
    monkeypatch.setattr(CDEEncoder, "embed_context", lambda self, texts: contexts.append(list(texts)) or real(self, texts))
    summary = load_tool("run_mteb").main(["--model", str(out), "--cde", "--output", str(tmp_path / "res"),
                                          "--dtype", "float32", "--batch-size", "4"], tasks=[task])
    assert 0 <= summary["tasks"]["NFCorpus"]["main_score"] <= 100 and summary["model"]["name"].endswith("trained")
    # one context per (task, subset, split), sampled from the task's corpus, not from the queries being encoded
    assert len(contexts) == 1 and sorted(contexts[0]) == sorted(topic_pairs(
        [(0, 1), (2, 3), (4, 5), (6, 7), (8, 9), (10, 11)])[1])
