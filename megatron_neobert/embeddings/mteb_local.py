"""MTEB tasks from local files, for machines without the Hub (or data of one's own); docs/mteb.md shows them.

A task is a folder, named as the task (an MTEB task's name, e.g. NFCorpus, also picks the paper's instruction):

    Retrieval       corpus.jsonl ({"_id", "text", "title"?}), queries.jsonl ({"_id", "text"}),
                    qrels.tsv (query-id, corpus-id, score; a header row is allowed) - BEIR's layout
    STS             test.jsonl ({"sentence1", "sentence2", "score"})
    Classification  train.jsonl and test.jsonl ({"text", "label"}; labels are integer classes or class names)

The files decide the type; every task is scored on its "test" split with mteb's own evaluators.
"""

import csv
import json
from pathlib import Path
from typing import Dict, List

_METADATA = dict(reference=None, eval_splits=["test"], eval_langs=["eng-Latn"], date=None, dialect=[], domains=[],
                 task_subtypes=[], license="not specified", annotations_creators="derived", modalities=["text"],
                 sample_creation="found", bibtex_citation="", category="t2t")
MAIN_SCORES = {"Retrieval": "ndcg_at_10", "STS": "cosine_spearman", "Classification": "accuracy"}


def read_jsonl(path: Path, fields) -> List[dict]:
    """The records of a JSON-lines file; an error names the file, the line and the missing field."""
    if not path.is_file():
        raise FileNotFoundError(f"{path} does not exist")
    rows = []
    with open(path, encoding="utf-8") as f:
        for line_no, line in enumerate(f, start=1):
            if not line.strip():
                continue
            try:
                row = json.loads(line)
            except json.JSONDecodeError as err:
                raise ValueError(f"{path} line {line_no}: not JSON ({err})") from None
            missing = [k for k in fields if k not in row]
            if missing:
                raise ValueError(f"{path} line {line_no}: no field {missing[0]!r} (fields: {sorted(row)})")
            rows.append(row)
    if not rows:
        raise ValueError(f"{path} holds no records")
    return rows


def _ids(rows: List[dict], path: Path) -> List[str]:
    """BEIR writes "_id"; "id" is accepted too."""
    try:
        return [str(r["_id"] if "_id" in r else r["id"]) for r in rows]
    except KeyError:
        raise ValueError(f"{path}: every record needs an \"_id\" (or \"id\") field") from None


def read_qrels(path: Path) -> Dict[str, Dict[str, int]]:
    if not path.is_file():
        raise FileNotFoundError(f"{path} does not exist")
    qrels: Dict[str, Dict[str, int]] = {}
    with open(path, encoding="utf-8", newline="") as f:
        for line_no, row in enumerate(csv.reader(f, delimiter="\t"), start=1):
            if not row or (line_no == 1 and not row[-1].strip().lstrip("-").isdigit()):
                continue  # blank line, or the header row
            if len(row) < 3:
                raise ValueError(f"{path} line {line_no}: expected query-id, corpus-id, score; got {row}")
            qrels.setdefault(row[0], {})[row[1]] = int(row[2])
    if not qrels:
        raise ValueError(f"{path} holds no relevance judgements")
    return qrels


def class_indices(labels: List, folder: Path) -> Dict:
    """label -> class index: integers stay themselves; names ("pos", "neg") are numbered in sorted order, as
    mteb's evaluators (scikit-learn's average precision among them) need integer classes."""
    kinds = {type(v) for v in labels}
    if kinds <= {int}:
        return {v: v for v in set(labels)}
    if kinds <= {str}:
        return {name: i for i, name in enumerate(sorted(set(labels)))}
    shown = " and ".join(sorted(k.__name__ for k in kinds))
    raise ValueError(f"{folder}: the \"label\" fields of train.jsonl and test.jsonl are {shown}: give every "
                     f"label as an integer class, or every label as a class name (a string)")


def task_type(folder: Path) -> str:
    if (folder / "corpus.jsonl").exists():
        return "Retrieval"
    if (folder / "train.jsonl").exists():
        return "Classification"
    if (folder / "test.jsonl").exists():
        return "STS"
    raise FileNotFoundError(f"{folder}: no corpus.jsonl (Retrieval), train.jsonl + test.jsonl (Classification) or "
                            f"test.jsonl (STS); see docs/mteb.md")


def local_task(folder):
    """An mteb task object for the files in `folder` (see the module docstring); the data is read and checked
    here, so that a bad file fails before any model runs."""
    from datasets import Dataset, DatasetDict
    from mteb.abstasks.task_metadata import TaskMetadata

    folder = Path(folder)
    if not folder.is_dir():
        raise FileNotFoundError(f"local MTEB task {folder} is not a folder")
    kind, name = task_type(folder), folder.resolve().name
    metadata = TaskMetadata(type=kind, name=name, main_score=MAIN_SCORES[kind], description=f"Local task {folder}.",
                            dataset={"path": f"local/{name}", "revision": "local"}, **_METADATA)
    if kind == "Retrieval":
        from mteb.abstasks.retrieval import AbsTaskRetrieval
        from mteb.abstasks.retrieval_dataset_loaders import RetrievalSplitData

        corpus, queries = read_jsonl(folder / "corpus.jsonl", ["text"]), read_jsonl(folder / "queries.jsonl", ["text"])
        qrels = read_qrels(folder / "qrels.tsv")
        corpus_ids, query_ids = _ids(corpus, folder / "corpus.jsonl"), _ids(queries, folder / "queries.jsonl")
        unknown = sorted({d for docs in qrels.values() for d in docs} - set(corpus_ids))[:5]
        if unknown or not set(qrels) <= set(query_ids):
            raise ValueError(f"{folder / 'qrels.tsv'} names ids missing from corpus.jsonl / queries.jsonl: "
                             f"{unknown or sorted(set(qrels) - set(query_ids))[:5]}")
        split = RetrievalSplitData(
            queries=Dataset.from_list([{"id": i, "text": r["text"]} for i, r in zip(query_ids, queries)]),
            corpus=Dataset.from_list([{"id": i, "text": r["text"], "title": r.get("title", "")}
                                      for i, r in zip(corpus_ids, corpus)]),
            relevant_docs=qrels, top_ranked=None)
        data, base, extra = {"default": {"test": split}}, AbsTaskRetrieval, {}
    elif kind == "STS":
        from mteb.abstasks.sts import AbsTaskSTS

        rows = read_jsonl(folder / "test.jsonl", ["sentence1", "sentence2", "score"])
        scores = [float(r["score"]) for r in rows]
        data = DatasetDict({"test": Dataset.from_dict({"sentence1": [r["sentence1"] for r in rows],
                                                       "sentence2": [r["sentence2"] for r in rows], "score": scores})})
        base, extra = AbsTaskSTS, {"min_score": min(scores), "max_score": max(scores)}
    else:
        from mteb.abstasks.classification import AbsTaskClassification

        splits = {split: read_jsonl(folder / f"{split}.jsonl", ["text", "label"]) for split in ("train", "test")}
        classes = class_indices([r["label"] for rows in splits.values() for r in rows], folder)
        data = DatasetDict({split: Dataset.from_list([{"text": r["text"], "label": classes[r["label"]]} for r in rows])
                            for split, rows in splits.items()})
        base, extra = AbsTaskClassification, {}

    def load_data(self, **kwargs):
        self.dataset, self.data_loaded = data, True

    return type(f"Local{kind}", (base,), dict(metadata=metadata, load_data=load_data, **extra))()
