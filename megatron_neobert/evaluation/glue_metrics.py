"""GLUE metrics as the paper reports them, from scikit-learn and SciPy (the eval extra)."""

import math
import warnings
from typing import Callable, Dict, Mapping, Sequence

import numpy as np
from scipy import stats
from sklearn import metrics

from .glue_data import GlueTask

# NeoBERT-4096 on the GLUE dev sets, in percent (the paper's table).
PAPER_SCORES = {"MNLI": 89.0, "QNLI": 93.7, "QQP": 90.7, "RTE": 91.3, "SST-2": 95.6, "MRPC": 93.4,
                "CoLA": 66.2, "STS-B": 91.8}
PAPER_AVERAGE = 89.0


def accuracy(preds, labels) -> float:
    return float(metrics.accuracy_score(labels, preds))


def f1_binary(preds, labels) -> float:
    """F1 of the positive class (label 1), 0 when there is no true or predicted positive."""
    return float(metrics.f1_score(labels, preds, zero_division=0.0))


def matthews_corrcoef(preds, labels) -> float:
    """Multi-class Matthews correlation (Gorodkin's R_K); 0 when undefined."""
    return float(metrics.matthews_corrcoef(labels, preds))


def _correlation(statistic: Callable, x, y) -> float:
    """SciPy's correlation of x and y; 0 when undefined (a constant input, e.g. a run that predicts one score),
    where SciPy gives nan, so that such a run still ranks below the others in the grid."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", stats.ConstantInputWarning)
        r = float(statistic(np.asarray(x, dtype=np.float64), np.asarray(y, dtype=np.float64))[0])
    return 0.0 if math.isnan(r) else r


def pearson(x, y) -> float:
    return _correlation(stats.pearsonr, x, y)


def spearman(x, y) -> float:
    return _correlation(stats.spearmanr, x, y)


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
