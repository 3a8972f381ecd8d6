"""The GLUE protocol's settings: the paper's grid, the shared protocol, one run's settings and its key.

Free of torch so that neobert-run-glue --help shows these defaults at once.
"""

from dataclasses import dataclass
from pathlib import Path
from typing import Optional

from .glue_data import HF_DATASET

PAPER_GRID = {
    "batch_size": (2, 4, 8, 16, 32),
    "learning_rate": (5e-6, 6e-6, 8e-6, 1e-5, 2e-5, 3e-5),
    "weight_decay": (1e-2, 1e-5),
}


@dataclass
class Protocol:
    """Everything shared by the runs of a grid. Defaults are the paper's where it gives them."""

    epochs: int = 10
    max_eval_interval: int = 500  # evaluate every min(500, steps_per_epoch // 10) steps
    patience: int = 15  # evaluations without improvement before stopping
    max_length: int = 128  # the paper does not give it; GLUE sentences rarely exceed it
    warmup_ratio: float = 0.1  # the paper does not give it: linear warmup then linear decay
    max_grad_norm: float = 1.0
    eval_batch_size: int = 64
    max_train_examples: Optional[int] = None  # for smoke tests on a slice of the training set


@dataclass(frozen=True)
class RunSpec:
    task: str
    batch_size: int
    learning_rate: float
    weight_decay: float
    seed: int = 0
    init: str = "pretrained"  # or "mnli": the run starts from the best MNLI checkpoint

    @property
    def key(self) -> str:
        return (f"{self.task}_bs{self.batch_size}_lr{self.learning_rate:g}_wd{self.weight_decay:g}"
                f"_seed{self.seed}_{self.init}")


def eval_interval(steps_per_epoch: int, max_interval: int = 500) -> int:
    """min(500, steps_per_epoch // 10), at least every step for tiny training sets."""
    return max(1, min(max_interval, steps_per_epoch // 10))


def data_source(data_dir=None, dataset_name: str = HF_DATASET) -> str:
    """Where a run's examples come from, as its record stores it: the TSV folder, else the Hub dataset."""
    return str(Path(data_dir).resolve()) if data_dir is not None else dataset_name
