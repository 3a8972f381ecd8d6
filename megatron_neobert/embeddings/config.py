"""Settings of contrastive and CDE fine-tuning, free of torch: tools build their flags from these before importing
the training modules."""

from dataclasses import dataclass
from typing import Optional


@dataclass
class ContrastiveConfig:
    steps: int = 2000
    batch_size: int = 128  # queries per step; documents = positives + hard negatives
    chunk_size: int = 32  # rows per GradCache forward
    lr: float = 2e-5
    warmup_steps: int = 100
    weight_decay: float = 0.01
    max_grad_norm: float = 1.0
    temperature: float = 0.07
    alpha: float = 0.5
    max_length: int = 512
    seed: int = 0
    checkpoint_every: int = 0  # 0: only the final model
    log_every: int = 50
    bf16: Optional[bool] = None  # default: on CUDA only


# --help text of ContrastiveConfig's and CDEConfig's fields (tools/finetune_contrastive.py, tools/finetune_cde.py).
CONFIG_HELP = {
    "steps": "optimizer steps",
    "batch_size": "queries per step (CDE: also the size of the k-means pseudo-context clusters)",
    "chunk_size": "rows per GradCache forward/backward: memory, not results, depends on it",
    "context_size": "CDE: context documents J embedded by the first stage",
    "lr": "peak learning rate",
    "warmup_steps": "linear warmup steps, then linear decay to zero",
    "weight_decay": "AdamW weight decay",
    "max_grad_norm": "gradient clipping norm (0: none)",
    "temperature": "InfoNCE softmax temperature",
    "alpha": "dataset mixture exponent: each batch comes from one dataset, drawn with probability proportional "
             "to its number of pairs to the power alpha (1: by size, 0: uniform)",
    "max_length": "tokens per text (truncated)",
    "seed": "random seed (data order, k-means, new weights)",
    "checkpoint_every": "save a resumable checkpoint every N steps (0: only the final model)",
    "log_every": "log the loss every N steps and at the last (0: never)",
    "bf16": "bf16 autocast (default: on CUDA only)",
}


@dataclass
class CDEConfig:
    steps: int = 2000
    batch_size: int = 512  # = cluster size of the pseudo-contexts
    context_size: int = 512  # J
    chunk_size: int = 32
    lr: float = 5e-5
    warmup_steps: int = 1000
    weight_decay: float = 0.0  # the paper uses Adam
    max_grad_norm: float = 1.0
    temperature: float = 0.07
    max_length: int = 512
    seed: int = 0
    checkpoint_every: int = 0
    log_every: int = 50
    bf16: Optional[bool] = None
