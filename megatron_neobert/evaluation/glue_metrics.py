"""GLUE metrics as the paper reports them, in numpy (tests check them against scikit-learn and SciPy)."""

from typing import Dict, Mapping, Sequence

import numpy as np

from .glue_data import GlueTask

# NeoBERT-4096 on the GLUE dev sets, in percent (the paper's table).
PAPER_SCORES = {"MNLI": 89.0, "QNLI": 93.7, "QQP": 90.7, "RTE": 91.3, "SST-2": 95.6, "MRPC": 93.4,
                "CoLA": 66.2, "STS-B": 91.8}
PAPER_AVERAGE = 89.0


def accuracy(preds, labels) -> float:
    preds, labels = np.asarray(preds), np.asarray(labels)
    return float((preds == labels).mean())


def f1_binary(preds, labels) -> float:
    """F1 of the positive class (label 1), 0 when there is no true or predicted positive."""
    preds, labels = np.asarray(preds) == 1, np.asarray(labels) == 1
    tp = float((preds & labels).sum())
    denominator = float(preds.sum() + labels.sum())
    return 2 * tp / denominator if denominator else 0.0


def matthews_corrcoef(preds, labels) -> float:
    """Multi-class Matthews correlation (Gorodkin's R_K); 0 when undefined, as scikit-learn returns."""
    preds, labels = np.asarray(preds), np.asarray(labels)
    classes = np.union1d(preds, labels)
    confusion = np.zeros((len(classes), len(classes)), dtype=np.float64)
    np.add.at(confusion, (np.searchsorted(classes, labels), np.searchsorted(classes, preds)), 1)
    t, p = confusion.sum(1), confusion.sum(0)  # true / predicted counts per class
    n, correct = confusion.sum(), np.trace(confusion)
    cov_yy, cov_pp, cov_yp = n * n - t @ t, n * n - p @ p, correct * n - t @ p
    return float(cov_yp / np.sqrt(cov_yy * cov_pp)) if cov_yy * cov_pp > 0 else 0.0


def pearson(x, y) -> float:
    x, y = np.asarray(x, dtype=np.float64), np.asarray(y, dtype=np.float64)
    x, y = x - x.mean(), y - y.mean()
    denominator = np.sqrt((x * x).sum() * (y * y).sum())
    return float((x * y).sum() / denominator) if denominator > 0 else 0.0


def _average_ranks(x: np.ndarray) -> np.ndarray:
    order = np.argsort(x, kind="mergesort")
    ranks = np.empty(len(x), dtype=np.float64)
    ranks[order] = np.arange(1, len(x) + 1)
    # Ties share the mean of their ranks.
    values, inverse = np.unique(x, return_inverse=True)
    sums = np.bincount(inverse, weights=ranks)
    counts = np.bincount(inverse)
    return (sums / counts)[inverse]


def spearman(x, y) -> float:
    return pearson(_average_ranks(np.asarray(x, dtype=np.float64)), _average_ranks(np.asarray(y, dtype=np.float64)))


def split_metrics(task: GlueTask, preds: Sequence, labels: Sequence) -> Dict[str, float]:
    """Metrics of one dev split; "score" is the task's number in the paper's table (a fraction)."""
    if len(preds) != len(labels) or not len(labels):
        raise ValueError(f"{task.name}: {len(preds)} predictions for {len(labels)} labels")
    if task.name == "CoLA":
        m = {"matthews": matthews_corrcoef(preds, labels)}
        m["score"] = m["matthews"]
    elif task.name == "STS-B":
        m = {"pearson": pearson(preds, labels), "spearman": spearman(preds, labels)}
        m["score"] = (m["pearson"] + m["spearman"]) / 2
    elif task.name in ("MRPC", "QQP"):
        m = {"f1": f1_binary(preds, labels), "accuracy": accuracy(preds, labels)}
        m["score"] = (m["f1"] + m["accuracy"]) / 2
    else:
        m = {"accuracy": accuracy(preds, labels)}
        m["score"] = m["accuracy"]
    return m


def task_metrics(task: GlueTask, preds: Mapping[str, Sequence], labels: Mapping[str, Sequence]) -> Dict[str, float]:
    """Metrics over all dev splits of a task (MNLI: matched and mismatched, averaged into "score")."""
    out, scores = {}, []
    for split in task.dev_splits:
        m = split_metrics(task, preds[split], labels[split])
        scores.append(m.pop("score"))
        prefix = "" if len(task.dev_splits) == 1 else split.replace("dev_", "") + "_"
        out.update({prefix + k: v for k, v in m.items()})
    out["score"] = float(np.mean(scores))
    return out


def glue_average(scores: Mapping[str, float]) -> float:
    """The paper's GLUE average: unweighted mean of the task scores."""
    if not scores:
        raise ValueError("no task scores to average")
    return float(np.mean(list(scores.values())))
