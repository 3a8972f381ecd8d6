"""Contrastive training data: (query, positive, optional hard negatives) from local JSONL/Parquet files or the
Hugging Face hub, and the dataset mixture of the paper (one dataset per batch, chosen with p_i ~ n_i^alpha)."""

import json
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Iterator, List, Optional, Sequence, Tuple

import numpy as np

from ..extras import require_extra
from .instructions import finetune_instruction

# Column names accepted for each role; the sentence-transformers hub datasets use anchor/positive/negative(_i).
QUERY_KEYS = ("query", "anchor", "question")
POSITIVE_KEYS = ("positive", "pos", "document")
NEGATIVE_KEYS = ("negatives", "negative", "hard_negatives", "neg")
_NUMBERED_NEGATIVE = re.compile(r"^negative_\d+$")
LOCAL_SUFFIXES = (".jsonl", ".json", ".parquet")


@dataclass
class PairDataset:
    name: str
    queries: List[str]
    positives: List[str]
    negatives: List[List[str]] = field(default_factory=list)  # per example, possibly empty
    instruction: Optional[str] = None
    source: str = ""

    def __len__(self) -> int:
        return len(self.queries)


def _read_records(source: str, split: str) -> Tuple[Sequence[dict], str]:
    path = Path(source)
    if path.is_file():
        if path.suffix == ".parquet":
            import pyarrow.parquet as pq

            return pq.read_table(path).to_pylist(), str(path)
        if path.suffix in (".jsonl", ".json"):
            records = []
            with open(path, encoding="utf-8") as f:
                for lineno, line in enumerate(f, 1):
                    if not line.strip():
                        continue
                    try:
                        records.append(json.loads(line))
                    except json.JSONDecodeError as e:
                        raise ValueError(f"{path}: line {lineno} is not valid JSON ({e.msg})") from None
            return records, str(path)
        raise ValueError(f"{path}: unsupported file type {path.suffix!r}; use one of {LOCAL_SUFFIXES}")
    if path.suffix in LOCAL_SUFFIXES or path.exists():
        raise FileNotFoundError(f"{path} is not a readable data file")
    # Not a local file: a hub dataset "owner/name" or "owner/name:config".
    require_extra("eval", f"hub dataset {source}", ("datasets",))
    import datasets

    name, _, config = source.partition(":")
    return datasets.load_dataset(name, config or None, split=split), f"{source} (split {split})"


def _text(value, where: str, role: str) -> str:
    if not isinstance(value, str) or not value.strip():
        raise ValueError(f"{where}: {role} must be a non-empty string, got {value!r}")
    return value


def _first_key(record: dict, keys: Sequence[str]) -> Optional[str]:
    return next((k for k in keys if k in record), None)


def load_pair_dataset(
    source: str,
    name: Optional[str] = None,
    instruction: Optional[str] = None,
    split: str = "train",
    max_negatives: Optional[int] = None,
) -> PairDataset:
    """Reads one dataset. `name` (default: the file stem or hub name) picks the instruction from
    assets/instructions.json unless `instruction` is given. Errors name the file and the record."""
    records, where = _read_records(source, split)
    name = name or Path(source.partition(":")[0]).stem.split(".")[0]
    queries, positives, negatives = [], [], []
    for i, record in enumerate(records):
        at = f"{where}: record {i}"
        if not isinstance(record, dict):
            raise ValueError(f"{at} is a {type(record).__name__}, expected an object with query/positive fields")
        q_key, p_key = _first_key(record, QUERY_KEYS), _first_key(record, POSITIVE_KEYS)
        if q_key is None or p_key is None:
            raise ValueError(
                f"{at} has fields {sorted(record)}; expected a query ({'/'.join(QUERY_KEYS)}) and a positive "
                f"({'/'.join(POSITIVE_KEYS)})"
            )
        queries.append(_text(record[q_key], at, q_key))
        positives.append(_text(record[p_key], at, p_key))
        n_key = _first_key(record, NEGATIVE_KEYS)
        negs = record[n_key] if n_key is not None else [record[k] for k in sorted(record) if _NUMBERED_NEGATIVE.match(k)]
        if negs is None:
            negs = []
        if isinstance(negs, str):
            negs = [negs]
        if not isinstance(negs, (list, tuple)):
            raise ValueError(f"{at}: {n_key} must be a string or a list of strings, got {type(negs).__name__}")
        negatives.append([_text(n, at, n_key or "negative") for n in negs][:max_negatives])
    if not queries:
        raise ValueError(f"{where}: the dataset is empty")
    if instruction is None:
        instruction = finetune_instruction(name)
    return PairDataset(name, queries, positives, negatives, instruction, where)


def mixture_probabilities(sizes: Sequence[int], alpha: float = 0.5) -> np.ndarray:
    """p_i = n_i^alpha / sum_j n_j^alpha (alpha=1: proportional to size; alpha=0: uniform)."""
    sizes = np.asarray(sizes, dtype=np.float64)
    if sizes.size == 0 or (sizes <= 0).any():
        raise ValueError(f"dataset sizes must be positive, got {sizes.tolist()}")
    weights = sizes**alpha
    return weights / weights.sum()


class MixtureBatchSampler:
    """Endless (dataset index, example indices) batches. Each batch comes from a single dataset, so in-batch
    negatives are task-homogeneous; within a dataset, examples are visited in a fresh permutation each epoch."""

    def __init__(self, sizes: Sequence[int], batch_size: int, alpha: float = 0.5, seed: int = 0,
                 names: Optional[Sequence[str]] = None):
        names = list(names) if names is not None else [f"dataset {i}" for i in range(len(sizes))]
        for n, name in zip(sizes, names):
            if n < batch_size:
                raise ValueError(f"{name} has {n} examples, fewer than the batch size {batch_size}")
        self.sizes, self.batch_size = list(sizes), batch_size
        self.probabilities = mixture_probabilities(sizes, alpha)
        self.rng = np.random.default_rng(seed)
        self._order = [self.rng.permutation(n) for n in self.sizes]
        self._pos = [0] * len(self.sizes)

    def __iter__(self) -> Iterator[Tuple[int, np.ndarray]]:
        while True:
            d = int(self.rng.choice(len(self.sizes), p=self.probabilities))
            if self._pos[d] + self.batch_size > self.sizes[d]:  # epoch over: reshuffle (the tail is dropped)
                self._order[d], self._pos[d] = self.rng.permutation(self.sizes[d]), 0
            start = self._pos[d]
            self._pos[d] += self.batch_size
            yield d, self._order[d][start:start + self.batch_size]


def parse_dataset_spec(spec: str) -> Tuple[Optional[str], str]:
    """'msmarco=data/msmarco.jsonl' -> ('msmarco', 'data/msmarco.jsonl'); a bare source has no name."""
    name, sep, source = spec.partition("=")
    if not sep:
        return None, spec
    if not name or not source:
        raise ValueError(f"dataset spec {spec!r} must be NAME=SOURCE or SOURCE")
    return name, source
