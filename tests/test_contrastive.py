"""Contrastive fine-tuning: InfoNCE, GradCache, the n^alpha mixture, data loading errors, end-to-end training."""

import itertools
import json
import math
import random

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from embed_fixtures import N_TOPICS, load_tool, make_model_folder, make_tokenizer, topic_pairs
from megatron_neobert.embeddings.contrastive import grad_cache_step, info_nce_loss
from megatron_neobert.embeddings.data import (MixtureBatchSampler, load_pair_dataset, mixture_probabilities,
                                              parse_dataset_spec)
from megatron_neobert.embeddings.finetune import load_encoder, lr_lambda, lr_reached
from megatron_neobert.embeddings.instructions import finetune_instruction, format_query, load_instructions

INSTRUCTION = "Retrieve semantically similar text."


def full_batch_step(encode, batches, loss_fn):
    """The uncached reference: one graph over the whole batch."""
    loss = loss_fn(*[encode(b).float() for b in batches])
    loss.backward()
    return loss.detach()


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    root = tmp_path_factory.mktemp("contrastive")
    return make_model_folder(root / "neobert", tokenizer_dir=make_tokenizer(root / "tok"))


def test_info_nce_equals_direct_computation():
    g = torch.Generator().manual_seed(0)
    q, d = torch.randn(3, 5, generator=g), torch.randn(5, 5, generator=g)  # 3 positives + 2 hard negatives
    expected = 0.0
    for i in range(3):
        sims = [float(q[i] @ d[j] / (q[i].norm() * d[j].norm())) / 0.07 for j in range(5)]
        expected += -(sims[i] - math.log(sum(math.exp(s) for s in sims))) / 3
    assert info_nce_loss(q, d, 0.07).item() == pytest.approx(expected, rel=1e-5)
    # scale-invariant (cosine), and the positive being the most similar lowers the loss
    assert info_nce_loss(3 * q, d).item() == pytest.approx(info_nce_loss(q, d).item(), rel=1e-5)
    assert info_nce_loss(d[:3], d).item() < info_nce_loss(q, d).item()
    with pytest.raises(ValueError, match="one document per query"):
        info_nce_loss(q, d[:2])


@pytest.mark.parametrize("chunk_size", [1, 3, 16])
def test_grad_cache_equals_uncached_gradients(model_dir, chunk_size):
    encoder, _, _ = load_encoder(model_dir)
    queries, passages = topic_pairs([(0, 1), (2, 3), (4, 5), (6, 7), (1, 9)])
    queries = [format_query(INSTRUCTION, q) for q in queries]
    docs = passages + ["the red car", "a dog with a cat and a bird"]  # hard negatives of other lengths
    batches = [encoder.tokenize(queries), encoder.tokenize(docs)]

    def grads(step, **kw):
        encoder.zero_grad(set_to_none=True)
        loss = step(lambda b: encoder(**b), batches, info_nce_loss, **kw)
        return loss, {n: p.grad.clone() for n, p in encoder.named_parameters()}

    loss_ref, ref = grads(full_batch_step)
    loss_gc, gc = grads(grad_cache_step, chunk_size=chunk_size)
    assert loss_gc.item() == pytest.approx(loss_ref.item(), rel=1e-6)
    assert ref.keys() == gc.keys()
    for name in ref:
        assert ref[name].abs().max() > 0 or name.endswith("encoder.weight"), name
        torch.testing.assert_close(gc[name], ref[name], atol=1e-6, rtol=1e-4, msg=lambda m: f"{name}: {m}")


def test_mixture_follows_n_to_the_alpha():
    sizes = [100, 400, 1600]
    np.testing.assert_allclose(mixture_probabilities(sizes, 0.5), [1 / 7, 2 / 7, 4 / 7])
    np.testing.assert_allclose(mixture_probabilities(sizes, 1.0), np.array(sizes) / 2100)
    np.testing.assert_allclose(mixture_probabilities(sizes, 0.0), [1 / 3] * 3)

    sampler = iter(MixtureBatchSampler(sizes, batch_size=50, alpha=0.5, seed=1))
    counts = np.zeros(3)
    seen = [set() for _ in sizes]
    for _ in range(7000):
        d, idx = next(sampler)
        counts[d] += 1
        assert len(idx) == 50 and len(set(idx.tolist())) == 50 and idx.max() < sizes[d]  # one dataset per batch
        seen[d].update(idx.tolist())
    np.testing.assert_allclose(counts / counts.sum(), [1 / 7, 2 / 7, 4 / 7], atol=0.015)
    assert all(len(s) == n for s, n in zip(seen, sizes))  # every example gets visited


def test_batch_larger_than_a_dataset_is_an_error():
    with pytest.raises(ValueError, match="dataset tiny.jsonl has 3 examples, fewer than the batch size 8"):
        MixtureBatchSampler([100, 3], batch_size=8, names=["dataset big", "dataset tiny.jsonl"])
    with pytest.raises(ValueError, match="positive"):
        mixture_probabilities([10, 0])


def test_load_local_files_and_aliases(tmp_path):
    rows = [{"query": "q one", "positive": "p one", "negatives": ["n1", "n2", "n3"]},
            {"anchor": "q two", "pos": "p two", "negative": "n4"},
            {"question": "q three", "document": "p three"}]
    jsonl = tmp_path / "msmarco.jsonl"
    jsonl.write_text("\n".join(json.dumps(r) for r in rows) + "\n\n")
    ds = load_pair_dataset(str(jsonl), max_negatives=2)
    assert ds.name == "msmarco" and ds.instruction == finetune_instruction("MSMARCO")
    assert ds.instruction == "Given a web search query, retrieve relevant passages that answer the query."
    assert ds.queries == ["q one", "q two", "q three"] and ds.positives == ["p one", "p two", "p three"]
    assert ds.negatives == [["n1", "n2"], ["n4"], []]

    import pyarrow as pa
    import pyarrow.parquet as pq

    pq.write_table(pa.Table.from_pylist([{"anchor": "a", "positive": "b", "negative_1": "c", "negative_2": "d"}]),
                   tmp_path / "x.parquet")
    ds = load_pair_dataset(str(tmp_path / "x.parquet"), name="allnli")
    assert ds.negatives == [["c", "d"]] and ds.instruction.startswith("Given a premise")
    assert load_pair_dataset(str(jsonl), name="unknown").instruction is None
    assert parse_dataset_spec("nq=/data/nq.jsonl") == ("nq", "/data/nq.jsonl") and parse_dataset_spec("a/b") == (None, "a/b")


@pytest.mark.parametrize("content, message", [
    ('{"query": "q", "positive": "p"}\n{"query": "q2", "positive": \n', r"bad.jsonl: line 2 is not valid JSON"),
    ('{"query": "q", "positive": "p"}\n{"query": "q2", "text": "p2"}\n', r"bad.jsonl: record 1 has fields \['query', 'text'\]"),
    ('{"query": "", "positive": "p"}\n', r"bad.jsonl: record 0: query must be a non-empty string"),
    ('{"query": "q", "positive": "p", "negatives": 3}\n', r"record 0: negatives must be a string or a list"),
    ('[1, 2]\n', r"record 0 is a list"),
    ('\n', r"bad.jsonl: the dataset is empty"),
])
def test_malformed_data_errors_name_file_and_record(tmp_path, content, message):
    (tmp_path / "bad.jsonl").write_text(content)
    with pytest.raises(ValueError, match=message):
        load_pair_dataset(str(tmp_path / "bad.jsonl"))


def test_missing_or_unsupported_files(tmp_path):
    with pytest.raises(FileNotFoundError, match="nope.jsonl"):
        load_pair_dataset(str(tmp_path / "nope.jsonl"))
    (tmp_path / "data.csv").write_text("query,positive\n")
    with pytest.raises(ValueError, match="unsupported file type '.csv'"):
        load_pair_dataset(str(tmp_path / "data.csv"))


def test_instruction_set_and_template():
    data = load_instructions()
    assert data["finetune"]["stsbenchmark"] == data["finetune"]["sts12"] == INSTRUCTION
    assert format_query(INSTRUCTION, "cats") == f"Instruct: {INSTRUCTION}\nQuery: cats"
    assert format_query(None, "cats") == "cats"


def _retrieval_accuracy(folder, pairs):
    encoder, _, _ = load_encoder(folder)
    queries, passages = topic_pairs(pairs)
    q = F.normalize(encoder.eval().encode([format_query(INSTRUCTION, t) for t in queries]), dim=-1)
    p = F.normalize(encoder.encode(passages), dim=-1)
    return ((q @ p.T).argmax(1) == torch.arange(len(pairs))).float().mean().item()


def test_finetuning_learns_retrieval_and_exports(model_dir, tmp_path):
    from sentence_transformers import SentenceTransformer

    pairs = list(itertools.combinations(range(N_TOPICS), 2))
    random.Random(0).shuffle(pairs)
    train, held_out = pairs[:200], pairs[200:260]  # held-out topic combinations
    q, p = topic_pairs(train)
    data = tmp_path / "sts12.jsonl"
    data.write_text("".join(json.dumps({"query": a, "positive": b}) + "\n" for a, b in zip(q, p)))

    before = _retrieval_accuracy(model_dir, held_out)
    out = load_tool("finetune_contrastive").main(["--model", str(model_dir), "--output", str(tmp_path / "embed"), "--dataset", str(data),
                "--steps", "60", "--batch-size", "32", "--chunk-size", "8", "--lr", "1e-3", "--warmup-steps", "10",
                "--checkpoint-every", "30", "--log-every", "0"])
    after = _retrieval_accuracy(out, held_out)
    print(f"held-out retrieval accuracy: before {before:.3f}, after {after:.3f}")
    assert before < 0.15 and after > 0.9

    assert (tmp_path / "embed-checkpoints" / "step_30" / "model.safetensors").is_file()
    assert not [x for x in tmp_path.rglob("*") if ".tmp-" in x.name or ".old-" in x.name]  # atomic writes
    # the folder is sentence-transformers ready and gives the same embeddings as our encoder
    st = SentenceTransformer(str(out), trust_remote_code=True, device="cpu")
    texts = [format_query(INSTRUCTION, "qw1 qw2"), "pw1 pw2"]
    ours, _, _ = load_encoder(out)
    torch.testing.assert_close(st.encode(texts, convert_to_tensor=True), ours.eval().encode(texts), atol=1e-5, rtol=1e-4)


@pytest.mark.parametrize("warmup, steps", [(1000, 20), (10, 20), (0, 5)])
def test_warmup_longer_than_the_run_is_reported_with_the_peak_it_reaches(warmup, steps, caplog):
    """CDE's default of 1000 warmup steps in a 20-step run peaks at 2% of --lr: say so, with the real peak."""
    lr = 1e-3
    optimizer = torch.optim.SGD([torch.nn.Parameter(torch.zeros(1))], lr=lr)
    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lr_lambda(warmup, steps))
    used = []
    for _ in range(steps):
        used.append(optimizer.param_groups[0]["lr"])
        optimizer.step()
        scheduler.step()
    with caplog.at_level("WARNING"):
        peak = lr_reached(warmup, steps, lr, "CDE")
    assert peak == pytest.approx(max(used))
    warned = [r.getMessage() for r in caplog.records if r.levelname == "WARNING"]
    if warmup > steps:
        assert warned == [f"CDE: --warmup-steps {warmup} is longer than the run's {steps} steps: the learning rate "
                          f"peaks at 2e-05, 2% of --lr 0.001; pass a shorter --warmup-steps (e.g. 2, a tenth of the run)"]
    else:
        assert warned == []


def test_the_last_step_is_logged(model_dir, tmp_path, caplog):
    """Before: a run shorter than --log-every (50) printed no loss at all."""
    q, p = topic_pairs([(0, 1), (2, 3), (4, 5), (6, 7)])
    data = tmp_path / "pairs.jsonl"
    data.write_text("".join(json.dumps({"query": a, "positive": b}) + "\n" for a, b in zip(q, p)))
    with caplog.at_level("INFO", logger="megatron_neobert.embeddings.finetune"):
        load_tool("finetune_contrastive").main(["--model", str(model_dir), "--output", str(tmp_path / "embed"),
                                                "--dataset", str(data), "--steps", "3", "--batch-size", "4",
                                                "--warmup-steps", "0", "--log-every", "2"])
    logged = [r.getMessage().split(" dataset")[0] for r in caplog.records if r.getMessage().startswith("step ")]
    assert logged == ["step 2/3", "step 3/3"]
