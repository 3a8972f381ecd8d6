"""Settings of contrastive and CDE fine-tuning, each declared once with its help (`megatron_neobert.flags`), free
of torch: tools build their flags from these before importing the training modules."""

from dataclasses import dataclass
from typing import Optional

from megatron_neobert.flags import redeclare, setting


@dataclass
class EmbeddingFinetuneConfig:
    """What contrastive and CDE fine-tuning share (the contrastive defaults)."""

    steps: int = setting(2000, "optimizer steps")
    batch_size: int = setting(128, "queries per step; documents = positives + hard negatives (CDE: also the size "
                                   "of the k-means pseudo-context clusters)")
    chunk_size: int = setting(32, "rows per GradCache forward/backward: memory, not results, depends on it")
    lr: float = setting(2e-5, "peak learning rate")
    warmup_steps: int = setting(100, "linear warmup steps, then linear decay to zero")
    weight_decay: float = setting(0.01, "AdamW weight decay")
    max_grad_norm: float = setting(1.0, "gradient clipping norm (0: none)")
    temperature: float = setting(0.07, "InfoNCE softmax temperature")
    max_length: int = setting(512, "tokens per text (truncated)")
    seed: int = setting(0, "random seed (data order, k-means, new weights)")
    checkpoint_every: int = setting(0, "save a resumable checkpoint every N steps (0: only the final model)")
    log_every: int = setting(50, "log the loss every N steps and at the last (0: never)")
    bf16: Optional[bool] = setting(None, "bf16 autocast (default: on CUDA only)")


@dataclass
class ContrastiveConfig(EmbeddingFinetuneConfig):
    alpha: float = setting(0.5, "dataset mixture exponent: each batch comes from one dataset, drawn with "
                                "probability proportional to its number of pairs to the power alpha (1: by size, "
                                "0: uniform)")


@dataclass
class CDEConfig(EmbeddingFinetuneConfig):
    batch_size: int = redeclare(EmbeddingFinetuneConfig, "batch_size", 512)
    lr: float = redeclare(EmbeddingFinetuneConfig, "lr", 5e-5)
    warmup_steps: int = redeclare(EmbeddingFinetuneConfig, "warmup_steps", 1000)
    weight_decay: float = redeclare(EmbeddingFinetuneConfig, "weight_decay", 0.0)  # the paper uses Adam
    context_size: int = setting(512, "context documents J embedded by the first stage")
