"""InfoNCE on cosine similarity, mean pooling, and gradient caching (Gao et al., 2021, "GradCache").

GradCache makes the contrastive batch size independent of memory: embed every text without a graph in chunks,
compute the loss on those (leaf) embeddings and its gradient with respect to them, then re-run each chunk with a
graph and backpropagate the cached embedding gradient through it. The parameter gradients are exactly those of
the full-batch step. NeoBERT has no dropout, so the re-run sees the same function and no RNG state is replayed.
"""

from typing import Callable, Dict, List, Sequence

import torch
import torch.nn.functional as F
from torch import nn

Batch = Dict[str, torch.Tensor]


def mean_pool(hidden: torch.Tensor, attention_mask: torch.Tensor) -> torch.Tensor:
    """Average of the hidden states over real tokens (what the sentence-transformers Pooling module computes)."""
    mask = attention_mask.to(hidden.dtype).unsqueeze(-1)
    return (hidden * mask).sum(1) / mask.sum(1).clamp(min=1)


def info_nce_loss(queries: torch.Tensor, documents: torch.Tensor, temperature: float = 0.07) -> torch.Tensor:
    """Cross-entropy over cosine similarities / temperature.

    `documents` holds the B positives first (row i belongs to query i), then any hard negatives; every query is
    scored against all rows, so the other positives are in-batch negatives and hard negatives are shared.
    """
    b = queries.shape[0]
    if documents.shape[0] < b:
        raise ValueError(f"need at least one document per query: {b} queries, {documents.shape[0]} documents")
    q = F.normalize(queries.float(), dim=-1)
    d = F.normalize(documents.float(), dim=-1)
    logits = q @ d.T / temperature
    return F.cross_entropy(logits, torch.arange(b, device=logits.device))


class MeanPoolEncoder(nn.Module):
    """A NeoBERT backbone + tokenizer that maps texts to mean-pooled vectors."""

    def __init__(self, backbone: nn.Module, tokenizer, max_length: int = 512):
        super().__init__()
        self.backbone, self.tokenizer, self.max_length = backbone, tokenizer, max_length

    def tokenize(self, texts: Sequence[str]) -> Batch:
        return dict(self.tokenizer(list(texts), padding=True, truncation=True, max_length=self.max_length,
                                   return_tensors="pt", return_token_type_ids=False))

    def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor) -> torch.Tensor:
        hidden = self.backbone(input_ids=input_ids, attention_mask=attention_mask).last_hidden_state
        return mean_pool(hidden, attention_mask)

    @torch.no_grad()
    def encode(self, texts: Sequence[str], batch_size: int = 64) -> torch.Tensor:
        device = next(self.parameters()).device
        out = []
        for i in range(0, len(texts), batch_size):
            batch = {k: v.to(device) for k, v in self.tokenize(texts[i:i + batch_size]).items()}
            out.append(self(**batch).float())
        return torch.cat(out)


def split_batch(batch: Batch, chunk_size: int) -> List[Batch]:
    """Row chunks of a padded batch, each cut to its own longest sequence: positions count real tokens only,
    so dropping trailing padding changes nothing but the cost."""
    n = batch["input_ids"].shape[0]
    chunks = []
    for i in range(0, n, chunk_size):
        mask = batch["attention_mask"][i:i + chunk_size]
        length = max(int(mask.sum(1).max()), 1)
        chunks.append({k: v[i:i + chunk_size, :length] for k, v in batch.items()})
    return chunks


def grad_cache_step(
    encode: Callable[[Batch], torch.Tensor],
    batches: Sequence[Batch],
    loss_fn: Callable[..., torch.Tensor],
    chunk_size: int,
) -> torch.Tensor:
    """One GradCache forward/backward. `batches` are tokenized groups (e.g. queries, documents); `loss_fn`
    takes one embedding matrix per group. Parameter .grad fields are accumulated; returns the detached loss."""
    chunked = [split_batch(b, chunk_size) for b in batches]
    with torch.no_grad():
        cached = [torch.cat([encode(c) for c in chunks]) for chunks in chunked]
    leaves = [e.detach().float().requires_grad_() for e in cached]
    loss = loss_fn(*leaves)
    loss.backward()
    for chunks, leaf in zip(chunked, leaves):
        start = 0
        for c in chunks:
            emb = encode(c)
            grad = leaf.grad[start:start + emb.shape[0]]
            start += emb.shape[0]
            emb.backward(gradient=grad.to(emb.dtype))
    return loss.detach()

