"""The 8 GLUE tasks NeoBERT reports (WNLI excluded), read from the original TSV files or `nyu-mll/glue`.

Label indices follow `nyu-mll/glue`, so a model fine-tuned from either source has the same label space.
"""

import csv
import logging
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Dict, List, Optional, Tuple, Union

logger = logging.getLogger(__name__)

HF_DATASET = "nyu-mll/glue"


@dataclass(frozen=True)
class GlueTask:
    name: str  # the paper's spelling: "STS-B", "SST-2", ...
    hf_config: str  # configuration name in nyu-mll/glue
    hf_text_fields: Tuple[str, ...]  # one field for single-sentence tasks, two for pair tasks
    labels: Optional[Tuple[str, ...]]  # label names in index order; None for regression (STS-B)
    # TSV layout: column names of (text_a[, text_b], label) in the header, or column positions when the
    # file has no header (CoLA).
    tsv_columns: Tuple[Union[str, int], ...]
    dev_splits: Tuple[str, ...] = ("dev",)
    transfer_from_mnli: bool = False  # RTE, STS-B, MRPC and QNLI start from the best MNLI checkpoint
    skip_malformed_rows: bool = False  # QQP's train.tsv has a few truncated lines

    @property
    def num_labels(self) -> int:
        return 1 if self.labels is None else len(self.labels)

    @property
    def is_regression(self) -> bool:
        return self.labels is None

    @property
    def is_pair(self) -> bool:
        return len(self.hf_text_fields) == 2


TASKS: Dict[str, GlueTask] = {
    t.name: t
    for t in (
        GlueTask("CoLA", "cola", ("sentence",), ("unacceptable", "acceptable"), (3, 1)),
        GlueTask("SST-2", "sst2", ("sentence",), ("negative", "positive"), ("sentence", "label")),
        GlueTask("MRPC", "mrpc", ("sentence1", "sentence2"), ("not_equivalent", "equivalent"),
                 ("#1 String", "#2 String", "Quality"), transfer_from_mnli=True),
        GlueTask("STS-B", "stsb", ("sentence1", "sentence2"), None, ("sentence1", "sentence2", "score"),
                 transfer_from_mnli=True),
        GlueTask("QQP", "qqp", ("question1", "question2"), ("not_duplicate", "duplicate"),
                 ("question1", "question2", "is_duplicate"), skip_malformed_rows=True),
        GlueTask("MNLI", "mnli", ("premise", "hypothesis"), ("entailment", "neutral", "contradiction"),
                 ("sentence1", "sentence2", "gold_label"), dev_splits=("dev_matched", "dev_mismatched")),
        GlueTask("QNLI", "qnli", ("question", "sentence"), ("entailment", "not_entailment"),
                 ("question", "sentence", "label"), transfer_from_mnli=True),
        GlueTask("RTE", "rte", ("sentence1", "sentence2"), ("entailment", "not_entailment"),
                 ("sentence1", "sentence2", "label"), transfer_from_mnli=True),
    )
}

_ALIASES = {name.lower().replace("-", ""): name for name in TASKS}


def get_task(name: str) -> GlueTask:
    """Accepts the paper's, nyu-mll/glue's or the TSV folder's spelling: "STS-B", "stsb", "sts-b"."""
    key = str(name).lower().replace("-", "").replace("_", "")
    if key == "wnli":
        raise ValueError("WNLI is excluded: the paper does not report it")
    if key not in _ALIASES:
        raise ValueError(f"unknown GLUE task {name!r}; known tasks: {', '.join(TASKS)}")
    return TASKS[_ALIASES[key]]


@dataclass
class GlueSplit:
    text_a: List[str]
    text_b: Optional[List[str]]
    labels: List[Union[int, float]]

    def __len__(self) -> int:
        return len(self.labels)


def _hf_split_name(split: str) -> str:
    return {"train": "train", "dev": "validation"}.get(split, split.replace("dev_", "validation_"))


def _label_index(task: GlueTask, value: str, where: str) -> Union[int, float]:
    value = value.strip()
    try:
        if task.is_regression:
            return float(value)
        if value in task.labels:
            return task.labels.index(value)
        if value.isdigit() and int(value) < task.num_labels:  # CoLA, SST-2, MRPC and QQP store indices
            return int(value)
    except ValueError:
        pass
    expected = "a number" if task.is_regression else f"one of {list(task.labels)} or 0..{task.num_labels - 1}"
    raise ValueError(f"{where}: label {value!r} is not {expected}")


def read_tsv_split(task: GlueTask, path: Union[str, os.PathLike]) -> GlueSplit:
    """One split file in the original GLUE layout (QUOTE_NONE: GLUE texts contain unbalanced quotes)."""
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"{task.name}: {path} does not exist")
    with open(path, encoding="utf-8", newline="") as f:
        rows = list(csv.reader(f, delimiter="\t", quoting=csv.QUOTE_NONE))
    has_header = isinstance(task.tsv_columns[0], str)
    if has_header:
        if not rows:
            raise ValueError(f"{task.name}: {path} is empty (expected a header row)")
        header, rows, first_line = rows[0], rows[1:], 2
        missing = [c for c in task.tsv_columns if c not in header]
        if missing:
            raise ValueError(f"{task.name}: {path} lacks column(s) {missing}; its header is {header}")
        # MNLI has label1..label5 before gold_label: take the last column of each name.
        positions = [len(header) - 1 - header[::-1].index(c) for c in task.tsv_columns]
    else:
        positions, first_line = list(task.tsv_columns), 1
    needed = max(positions) + 1

    texts = [[] for _ in positions[:-1]]
    labels, skipped = [], 0
    for line, row in enumerate(rows, start=first_line):
        if not row:
            continue
        if len(row) < needed:
            if task.skip_malformed_rows:
                skipped += 1
                continue
            raise ValueError(f"{task.name}: {path} line {line} has {len(row)} column(s), expected at least {needed}")
        for column, pos in zip(texts, positions[:-1]):
            column.append(row[pos])
        labels.append(_label_index(task, row[positions[-1]], f"{task.name}: {path} line {line}"))
    if skipped:
        logger.warning("%s: skipped %d malformed row(s) of %s", task.name, skipped, path)
    if not labels:
        raise ValueError(f"{task.name}: {path} holds no examples")
    return GlueSplit(texts[0], texts[1] if len(texts) > 1 else None, labels)


def read_hf_split(task: GlueTask, split: str, dataset_name: str = HF_DATASET) -> GlueSplit:
    from datasets import load_dataset

    ds = load_dataset(dataset_name, task.hf_config, split=_hf_split_name(split))
    missing = [c for c in task.hf_text_fields + ("label",) if c not in ds.column_names]
    if missing:
        raise ValueError(f"{task.name}: {dataset_name}/{task.hf_config} lacks column(s) {missing}")
    labels = [float(v) if task.is_regression else int(v) for v in ds["label"]]
    if not task.is_regression and any(v < 0 for v in labels):
        raise ValueError(f"{task.name}: {dataset_name} split {split} has no labels (a test split?)")
    text_b = list(ds[task.hf_text_fields[1]]) if task.is_pair else None
    return GlueSplit(list(ds[task.hf_text_fields[0]]), text_b, labels)


def load_split(task: GlueTask, split: str, data_dir: Optional[Union[str, os.PathLike]] = None,
               dataset_name: str = HF_DATASET) -> GlueSplit:
    """`split` is "train" or one of `task.dev_splits`. With `data_dir`, reads `{data_dir}/{task}/{split}.tsv`
    (the folder may be spelled "STS-B" or "stsb"); otherwise loads `dataset_name` from the Hub or its cache."""
    if split != "train" and split not in task.dev_splits:
        raise ValueError(f"{task.name} has splits train, {', '.join(task.dev_splits)}; got {split!r}")
    if data_dir is None:
        return read_hf_split(task, split, dataset_name)
    return read_tsv_split(task, tsv_path(task, split, data_dir))


def tsv_path(task: GlueTask, split: str, data_dir: Union[str, os.PathLike]) -> Path:
    """`{data_dir}/{task}/{split}.tsv`, the task's folder spelled as the paper, nyu-mll/glue or GLUE's zip."""
    candidates = [Path(data_dir) / d for d in (task.name, task.hf_config, task.name.upper(), task.name.lower())]
    folder = next((c for c in candidates if c.is_dir()), candidates[0])
    return folder / f"{split}.tsv"


def check_tsv_files(tasks, data_dir: Union[str, os.PathLike]) -> None:
    """Every split file of `tasks` (names) is there, with the task's columns, full rows and known labels: checked
    before a grid's first run. The missing files are named together, then the first bad line of a file (each is
    read whole, as a run reads it)."""
    wanted = [(t, tsv_path(t, split, data_dir)) for t in map(get_task, tasks) for split in ("train",) + t.dev_splits]
    missing = [str(path) for _, path in wanted if not path.is_file()]
    if missing:
        raise FileNotFoundError(f"--data-dir {data_dir} lacks {len(missing)} GLUE file(s): {', '.join(missing)} "
                                f"(docs/glue.md gives the layout)")
    for task, path in wanted:
        read_tsv_split(task, path)
