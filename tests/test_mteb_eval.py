"""MTEB evaluation on local tasks (no download): scores, instructions, cache keys, summary, errors."""

import json
import math

import pytest
import torch
import torch.nn.functional as F

pytest.importorskip("mteb")

from datasets import Dataset, DatasetDict  # noqa: E402
from mteb.abstasks.retrieval import AbsTaskRetrieval  # noqa: E402
from mteb.abstasks.retrieval_dataset_loaders import RetrievalSplitData  # noqa: E402
from mteb.abstasks.sts import AbsTaskSTS  # noqa: E402
from mteb.abstasks.task_metadata import TaskMetadata  # noqa: E402

from embed_fixtures import load_tool, make_model_folder, make_tokenizer, topic_pairs  # noqa: E402
from megatron_neobert.embeddings.instructions import format_query, load_instructions  # noqa: E402
from megatron_neobert.embeddings.mteb_eval import (NeoBERTEncoder, checkpoint_revision, resolve_tasks,  # noqa: E402
                                                   run_mteb, summarize)

PAIRS = [(0, 1), (2, 3), (4, 5), (6, 7), (8, 9), (10, 11)]
LOCAL = dict(description="Local test task.", reference=None, dataset={"path": "local/none", "revision": "1"},
             category="t2t", eval_splits=["test"], eval_langs=["eng-Latn"], date=None, dialect=[], domains=[],
             task_subtypes=[], license="cc-by-4.0", annotations_creators="derived", modalities=["text"],
             sample_creation="found", bibtex_citation="")
RETRIEVAL_INSTRUCTION = "Given a question, retrieve relevant documents that best answer the question."


class LocalRetrieval(AbsTaskRetrieval):
    # Named like an MTEB task so that the paper's per-task instruction applies.
    metadata = TaskMetadata(type="Retrieval", name="NFCorpus", main_score="ndcg_at_10", **LOCAL)

    def load_data(self, **kwargs):
        q, p = topic_pairs(PAIRS)
        self.dataset = {"default": {"test": RetrievalSplitData(
            queries=Dataset.from_list([{"id": f"q{i}", "text": t} for i, t in enumerate(q)]),
            corpus=Dataset.from_list([{"id": f"d{i}", "text": t, "title": ""} for i, t in enumerate(p)]),
            relevant_docs={f"q{i}": {f"d{i}": 1} for i in range(len(q))}, top_ranked=None)}}
        self.data_loaded = True


class LocalSTS(AbsTaskSTS):
    metadata = TaskMetadata(type="STS", name="LocalTopicSTS", main_score="cosine_spearman", **LOCAL)
    min_score, max_score = 0, 1

    def load_data(self, **kwargs):
        self.dataset = DatasetDict({"test": Dataset.from_dict(
            {"sentence1": ["qw1 qw2", "qw3", "pw4 pw5", "red car"], "sentence2": ["pw1 pw2", "qw3 qw4", "pw4", "the dog"],
             "score": [1.0, 0.5, 0.2, 0.0]})})
        self.data_loaded = True


@pytest.fixture(scope="module")
def tok(tmp_path_factory):
    return make_tokenizer(tmp_path_factory.mktemp("tok") / "tok")


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory, tok):
    return make_model_folder(tmp_path_factory.mktemp("mteb") / "neobert", tokenizer_dir=tok)


def expected_ndcg_at_10(encoder):
    """ndcg@10 with one relevant document per query: mean of 1 / log2(1 + rank of that document)."""
    q, p = topic_pairs(PAIRS)
    qe = F.normalize(encoder.embed([format_query(RETRIEVAL_INSTRUCTION, t) for t in q]), dim=-1)
    de = F.normalize(encoder.embed(p), dim=-1)
    sims = qe @ de.T
    ranks = [(sims[i] > sims[i, i]).sum().item() + 1 for i in range(len(q))]
    return sum(1 / math.log2(1 + r) for r in ranks) / len(q)


def test_local_tasks_scores_summary_and_tool(model_dir, tmp_path):
    summary = load_tool("run_mteb").main(["--model", str(model_dir), "--output", str(tmp_path / "res"),
                                          "--dtype", "float32", "--batch-size", "4"],
                                         tasks=[LocalRetrieval(), LocalSTS()])
    encoder = NeoBERTEncoder(model_dir, dtype="float32")
    assert summary["tasks"]["NFCorpus"]["main_score"] == pytest.approx(100 * expected_ndcg_at_10(encoder), abs=1e-3)
    assert summary["tasks"]["LocalTopicSTS"]["type"] == "STS"
    assert set(summary["by_type"]) == {"Retrieval", "STS"}
    assert summary["by_type"]["Retrieval"]["paper"] == 31.6 and summary["average"]["paper"] == 51.3
    assert summary["average"]["ours"] == pytest.approx(
        (summary["tasks"]["NFCorpus"]["main_score"] + summary["tasks"]["LocalTopicSTS"]["main_score"]) / 2)
    assert json.loads((tmp_path / "res" / "summary.json").read_text()) == summary
    md = (tmp_path / "res" / "summary.md").read_text()
    assert "| Retrieval | 1 |" in md and "31.60" in md and summary["model"]["revision"] in md
    rev = summary["model"]["revision"]
    assert (tmp_path / "res" / "mteb_cache" / "results" / "megatron_neobert__neobert" / rev / "NFCorpus.json").is_file()


class _Meta:
    def __init__(self, name, type):
        self.name, self.type = name, type


def test_instructions_on_queries_and_symmetric_tasks_only(model_dir, monkeypatch):
    encoder = NeoBERTEncoder(model_dir, dtype="float32")
    seen = []
    monkeypatch.setattr(encoder, "embed", lambda texts: seen.append(list(texts)) or torch.zeros(len(texts), 32))
    batches = [{"text": ["qw1 qw2"]}]
    from mteb.types import PromptType

    kw = dict(hf_split="test", hf_subset="default")
    encoder.encode(batches, task_metadata=_Meta("NFCorpus", "Retrieval"), prompt_type=PromptType.query, **kw)
    encoder.encode(batches, task_metadata=_Meta("NFCorpus", "Retrieval"), prompt_type=PromptType.document, **kw)
    encoder.encode(batches, task_metadata=_Meta("Banking77Classification", "Classification"), **kw)
    encoder.encode(batches, task_metadata=_Meta("CQADupstackGamingRetrieval", "Retrieval"),
                   prompt_type=PromptType.query, **kw)
    assert seen[0] == [f"Instruct: {RETRIEVAL_INSTRUCTION}\nQuery: qw1 qw2"]
    assert seen[1] == ["qw1 qw2"]
    assert seen[2] == ["Instruct: Given a online banking query, find the corresponding intents.\nQuery: qw1 qw2"]
    assert "Stackexchange" in seen[3][0]


def test_revision_is_unique_per_checkpoint_and_cache_is_not_shared(tmp_path, tok):
    folder = tmp_path / "ckpt"
    make_model_folder(folder, seed=0, tokenizer_dir=tok)
    first = NeoBERTEncoder(folder, dtype="float32")
    s1 = run_mteb(first, [LocalRetrieval()], tmp_path / "out1", cache_dir=tmp_path / "cache")
    # same path, same name, new weights: a new revision, so mteb runs the model instead of serving cached scores
    from megatron_neobert.conversion.hf_format import read_hf_folder, write_hf_folder

    sd, cfg = read_hf_folder(folder)
    sd = {k: v + 0.05 * torch.randn_like(v) for k, v in sd.items()}
    write_hf_folder(folder, sd, cfg, tokenizer_path=tok, overwrite=True)
    second = NeoBERTEncoder(folder, dtype="float32")
    assert second.mteb_model_meta.name == first.mteb_model_meta.name
    assert second.mteb_model_meta.revision != first.mteb_model_meta.revision
    s2 = run_mteb(second, [LocalRetrieval()], tmp_path / "out2", cache_dir=tmp_path / "cache")
    assert s2["tasks"]["NFCorpus"]["main_score"] == pytest.approx(100 * expected_ndcg_at_10(second), abs=1e-3)
    assert s2["tasks"]["NFCorpus"]["main_score"] != s1["tasks"]["NFCorpus"]["main_score"]

    # the same checkpoint again is served from the cache without running the model
    again = NeoBERTEncoder(folder, dtype="float32")
    again.embed = lambda texts: pytest.fail("the cached result should have been used")
    s3 = run_mteb(again, [LocalRetrieval()], tmp_path / "out3", cache_dir=tmp_path / "cache")
    assert s3["tasks"] == s2["tasks"]
    # dtype and instructions are part of the revision too
    assert NeoBERTEncoder(folder, dtype="bf16").mteb_model_meta.revision != again.mteb_model_meta.revision
    assert NeoBERTEncoder(folder, dtype="float32", use_instructions=False).mteb_model_meta.revision != \
        again.mteb_model_meta.revision
    with pytest.raises(FileNotFoundError, match="no weight files"):
        checkpoint_revision(tmp_path / "out1")


def test_task_names_and_paper_instructions(model_dir):
    tasks = resolve_tasks(["MTEB(eng, v1)", "STS12"])
    assert len(tasks) == 56  # STS12 is already in the benchmark
    known = {k.lower() for k in load_instructions()["mteb"]}
    prefixes = tuple(p.lower() for p in load_instructions()["mteb_prefixes"])
    missing = [t.metadata.name for t in tasks if t.metadata.name.lower() not in known
               and not t.metadata.name.lower().startswith(prefixes)]
    assert not missing, f"MTEB(eng, v1) tasks without a paper-style instruction: {missing}"
    with pytest.raises(ValueError, match=r"unknown MTEB task or benchmark name\(s\): 'NoSuchTask', 'MTEB\(xx\)'"):
        resolve_tasks(["STS12", "NoSuchTask", "MTEB(xx)"])
    with pytest.raises(SystemExit, match="^error: unknown MTEB task or benchmark name.*NoSuchTask"):
        load_tool("run_mteb").main(["--model", str(model_dir), "--output", "unused", "--tasks", "NoSuchTask"])


def test_summary_groups_by_type():
    class R:
        def __init__(self, name, score):
            self.task_name, self.score = name, score

        def get_score(self):
            return self.score

    s = summarize([R("A", 0.5), R("B", 0.7), R("C", 0.2)], {"A": "STS", "B": "STS", "C": "Clustering"})
    assert s["by_type"]["STS"] == {"n_tasks": 2, "ours": pytest.approx(60.0), "paper": 74.8}
    assert list(s["by_type"]) == ["Clustering", "STS"]  # the paper's order of task types
    assert s["average"]["ours"] == pytest.approx(140 / 3) and s["average"]["n_tasks"] == 3


@pytest.mark.parametrize("dtype", ["fp16", "bf16"])
def test_half_precision_embeddings_match_float32(model_dir, dtype):
    texts = ["qw1 qw2", "pw3 the dog with a cat"]
    full = NeoBERTEncoder(model_dir, dtype="float32").embed(texts)
    half = NeoBERTEncoder(model_dir, dtype=dtype).embed(texts)
    assert half.dtype == torch.float32 and F.cosine_similarity(half, full).min() > 0.999
    with pytest.raises(ValueError, match="dtype 'int8'"):
        NeoBERTEncoder(model_dir, dtype="int8")


def _write_jsonl(path, rows):
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))


def test_local_task_files_score_as_the_same_tasks_in_python(model_dir, tmp_path):
    """--local-task folders (BEIR retrieval files, STS pairs, classification) give the scores of the same data
    defined through mteb's Python classes; the CLI runs without the Hub."""
    q, p = topic_pairs(PAIRS)
    nf = tmp_path / "tasks" / "NFCorpus"
    _write_jsonl(nf / "corpus.jsonl", [{"_id": f"d{i}", "title": "", "text": t} for i, t in enumerate(p)])
    _write_jsonl(nf / "queries.jsonl", [{"_id": f"q{i}", "text": t} for i, t in enumerate(q)])
    (nf / "qrels.tsv").write_text("query-id\tcorpus-id\tscore\n" + "".join(f"q{i}\td{i}\t1\n" for i in range(len(q))))
    sts = LocalSTS()
    sts.load_data()
    _write_jsonl(tmp_path / "tasks" / "LocalTopicSTS" / "test.jsonl", sts.dataset["test"].to_list())
    cls = tmp_path / "tasks" / "TopicClassification"
    for split, n in (("train", 16), ("test", 8)):
        _write_jsonl(cls / f"{split}.jsonl", [{"text": f"pw{i % 2} the cat", "label": i % 2} for i in range(n)])

    summary = load_tool("run_mteb").main(["--model", str(model_dir), "--output", str(tmp_path / "files"),
                                          "--dtype", "float32", "--batch-size", "4", "--local-task",
                                          *(str(tmp_path / "tasks" / n) for n in
                                            ("NFCorpus", "LocalTopicSTS", "TopicClassification"))])
    reference = run_mteb(NeoBERTEncoder(model_dir, dtype="float32"), [LocalRetrieval(), LocalSTS()], tmp_path / "py")
    for name in ("NFCorpus", "LocalTopicSTS"):
        assert summary["tasks"][name] == reference["tasks"][name]
    # the two classes differ by one word: a logistic regression on any non-degenerate embedding separates them
    assert summary["tasks"]["TopicClassification"] == {"type": "Classification", "main_score": 100.0}


def test_local_task_errors_name_the_file(tmp_path):
    from megatron_neobert.embeddings.mteb_local import local_task

    with pytest.raises(FileNotFoundError, match="no corpus.jsonl .*docs/mteb.md"):
        local_task(tmp_path)
    task = tmp_path / "Broken"
    _write_jsonl(task / "corpus.jsonl", [{"_id": "d0", "text": "a"}])
    _write_jsonl(task / "queries.jsonl", [{"_id": "q0", "text": "b"}])
    (task / "qrels.tsv").write_text("q0\td9\t1\n")
    with pytest.raises(ValueError, match=r"qrels.tsv names ids missing from corpus.jsonl / queries.jsonl: \['d9'\]"):
        local_task(task)
    _write_jsonl(task / "queries.jsonl", [{"_id": "q0", "query": "b"}])
    with pytest.raises(ValueError, match=r"queries.jsonl line 1: no field 'text'"):
        local_task(task)


def test_classification_labels_may_be_class_names(model_dir, tmp_path):
    """Before: "pos" / "neg" labels crashed in mteb's scoring (ValueError: pos_label=1 is not a valid label). Class
    names are numbered in sorted order: the same scores as the integer labels they stand for."""
    from megatron_neobert.embeddings.mteb_local import class_indices

    for name, labels in (("Names", ["neg", "pos"]), ("Integers", [0, 1])):
        for split, n in (("train", 16), ("test", 8)):
            _write_jsonl(tmp_path / "tasks" / name / f"{split}.jsonl",
                         [{"text": f"pw{i % 2} the cat", "label": labels[i % 2]} for i in range(n)])
    summary = load_tool("run_mteb").main(["--model", str(model_dir), "--output", str(tmp_path / "out"), "--dtype",
                                          "float32", "--batch-size", "4", "--local-task",
                                          str(tmp_path / "tasks" / "Names"), str(tmp_path / "tasks" / "Integers")])
    assert summary["tasks"]["Names"] == summary["tasks"]["Integers"] == {"type": "Classification", "main_score": 100.0}
    assert class_indices(["pos", "neg", "pos"], tmp_path) == {"neg": 0, "pos": 1}
    with pytest.raises(ValueError, match=r'the "label" fields of train.jsonl and test.jsonl are int and str: give '
                                         r'every label as an integer class, or every label as a class name'):
        class_indices([1, "pos"], tmp_path)


def test_a_failing_task_leaves_the_summary_of_those_that_finished(model_dir, tmp_path):
    """Before: the first failing task ended the run with a traceback and no summary.md. Now every task runs, the
    summary holds those that finished and names the failure, and the tool ends with one `error:` line."""
    one_class = tmp_path / "tasks" / "OneClass"  # a classifier cannot be fitted on a single class
    _write_jsonl(one_class / "train.jsonl", [{"text": f"pw{i} the cat", "label": "pos"} for i in range(8)])
    _write_jsonl(one_class / "test.jsonl", [{"text": f"pw{i} the cat", "label": ["pos", "neg"][i % 2]}
                                            for i in range(8)])
    sts = LocalSTS()
    sts.load_data()
    _write_jsonl(tmp_path / "tasks" / "LocalTopicSTS" / "test.jsonl", sts.dataset["test"].to_list())
    with pytest.raises(SystemExit) as stop:
        load_tool("run_mteb").main(["--model", str(model_dir), "--output", str(tmp_path / "out"), "--dtype",
                                    "float32", "--local-task", str(one_class),
                                    str(tmp_path / "tasks" / "LocalTopicSTS")])
    message = str(stop.value)
    assert message.startswith(f"error: 1 of 2 MTEB task(s) failed ({tmp_path}/out/summary.md holds the 1 that "
                              f"finished): OneClass: ") and "\n" not in message, message
    summary = json.loads((tmp_path / "out" / "summary.json").read_text())
    assert list(summary["tasks"]) == ["LocalTopicSTS"] and list(summary["failed"]) == ["OneClass"]
    assert "| LocalTopicSTS | STS |" in (tmp_path / "out" / "summary.md").read_text()
    assert "- OneClass: " in (tmp_path / "out" / "summary.md").read_text()
