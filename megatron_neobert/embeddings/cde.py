"""Contextual Document Embeddings (Morris & Rush, 2024) with NeoBERT backbones.

- Contextual batching: query-document pairs are clustered with k-means into pseudo-contexts, and every training
  batch is cut from one cluster, so in-batch negatives are hard and the context describes the batch's domain.
- Two stages: a first-stage NeoBERT embeds J context documents (mean pooling); a second-stage NeoBERT reads those
  J vectors, projected to its width, as extra input positions before the document tokens (`inputs_embeds`) and
  mean-pools over the document tokens only. All context positions get RoPE position 0 (the context is a set: no
  order among its vectors), document tokens positions 1, 2, ...
- Two-stage GradCache: context, query and document embeddings are first computed without graphs; the loss
  gradient flows back chunk by chunk through the second stage into the cached context embeddings, and from
  there chunk by chunk through the first stage.
"""

import contextlib
import json
import logging
import math
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Callable, List, Optional, Sequence, Tuple

import numpy as np
import torch
from torch import nn

from megatron_neobert.atomic_write import atomic_path

from .config import CDEConfig
from .contrastive import MeanPoolEncoder, mean_pool, split_batch
from .finetune import load_encoder, lr_lambda, lr_reached, save_encoder
from .instructions import format_query, load_instructions

logger = logging.getLogger(__name__)
CDE_CONFIG = "cde_config.json"
PROJECTION_FILE = "context_projection.safetensors"


# ------------------------------------------------------------------------------------------------------------
# Contextual batching
# ------------------------------------------------------------------------------------------------------------


@dataclass
class ContextualBatch:
    indices: np.ndarray  # the pairs of this batch
    cluster: np.ndarray  # the pairs of its pseudo-context (context documents are sampled from these)


def contextual_batches(embeddings, batch_size: int, seed: int = 0, drop_last: bool = True) -> List[ContextualBatch]:
    """k-means (k = n / batch_size, on normalised vectors, i.e. cosine) pseudo-contexts, each cut into batches of
    `batch_size`; the clusters' remainders are pooled in cluster order into further batches."""
    from sklearn.cluster import KMeans

    x = torch.as_tensor(embeddings, dtype=torch.float32)
    n = x.shape[0]
    if n < batch_size:
        raise ValueError(f"{n} pairs cannot fill one batch of {batch_size}")
    x = torch.nn.functional.normalize(x, dim=-1).numpy()
    k = max(1, n // batch_size)
    labels = KMeans(n_clusters=k, n_init=3, random_state=seed).fit_predict(x)
    rng = np.random.default_rng(seed)
    batches, leftover = [], []
    for c in range(k):
        members = rng.permutation(np.flatnonzero(labels == c))
        full = len(members) // batch_size * batch_size
        batches += [ContextualBatch(members[i:i + batch_size], members) for i in range(0, full, batch_size)]
        leftover.append(members[full:])
    leftover = np.concatenate(leftover)
    for i in range(0, len(leftover), batch_size):
        chunk = leftover[i:i + batch_size]
        if len(chunk) == batch_size or not drop_last:
            batches.append(ContextualBatch(chunk, np.flatnonzero(np.isin(labels, labels[chunk]))))
    return [batches[i] for i in rng.permutation(len(batches))]


# ------------------------------------------------------------------------------------------------------------
# The two-stage model
# ------------------------------------------------------------------------------------------------------------


class ContextualNeoBERT(nn.Module):
    def __init__(self, first: MeanPoolEncoder, second: MeanPoolEncoder, context_size: int):
        super().__init__()
        self.first, self.second, self.context_size = first, second, context_size
        h1, h2 = first.backbone.config.hidden_size, second.backbone.config.hidden_size
        # First-stage outputs are final-RMSNormed states, second-stage inputs are raw token embeddings: a learned
        # map bridges the scales (and the widths, when the stages differ).
        self.projection = nn.Linear(h1, h2)
        self.tokenizer = second.tokenizer

    def tokenize(self, texts: Sequence[str]):
        return self.second.tokenize(texts)

    def embed_context(self, input_ids, attention_mask) -> torch.Tensor:
        return self.first(input_ids=input_ids, attention_mask=attention_mask)

    def forward(self, input_ids, attention_mask, context: torch.Tensor) -> torch.Tensor:
        """Embeddings of the documents in (input_ids, attention_mask) given first-stage `context` [J, H1]."""
        b, j = input_ids.shape[0], context.shape[0]
        tokens = self.second.backbone.get_input_embeddings()(input_ids)
        ctx = self.projection(context.to(self.projection.weight.dtype)).to(tokens.dtype)
        x = torch.cat([ctx.unsqueeze(0).expand(b, j, -1), tokens], dim=1)
        mask = torch.cat([attention_mask.new_ones(b, j), attention_mask], dim=1)
        positions = torch.cat([attention_mask.new_zeros(b, j), attention_mask.long().cumsum(-1)], dim=1)
        hidden = self.second.backbone(inputs_embeds=x, attention_mask=mask, position_ids=positions).last_hidden_state
        return mean_pool(hidden[:, j:], attention_mask)


def cde_grad_cache_step(model: ContextualNeoBERT, context_batch, batches: Sequence[dict],
                        loss_fn: Callable[..., torch.Tensor], chunk_size: int,
                        to_device: Callable = lambda b: b, autocast: Callable = contextlib.nullcontext) -> torch.Tensor:
    """Two-stage GradCache: gradients equal those of one graph over the whole batch and context; only one chunk
    has a graph at a time.
    `autocast` wraps the forward passes (not the backward ones)."""
    ctx_chunks = [to_device(c) for c in split_batch(context_batch, chunk_size)]
    chunked = [[to_device(c) for c in split_batch(b, chunk_size)] for b in batches]
    with torch.no_grad(), autocast():
        context = torch.cat([model.embed_context(**c) for c in ctx_chunks])
        cached = [torch.cat([model(**c, context=context) for c in chunks]) for chunks in chunked]
    leaves = [e.detach().float().requires_grad_() for e in cached]
    loss = loss_fn(*leaves)
    loss.backward()
    context_leaf = context.detach().requires_grad_()
    for chunks, leaf in zip(chunked, leaves):  # second stage; accumulates d loss / d context in context_leaf.grad
        start = 0
        for c in chunks:
            with autocast():
                emb = model(**c, context=context_leaf)
            emb.backward(gradient=leaf.grad[start:start + emb.shape[0]].to(emb.dtype))
            start += emb.shape[0]
    start = 0
    for c in ctx_chunks:  # first stage
        with autocast():
            emb = model.embed_context(**c)
        emb.backward(gradient=context_leaf.grad[start:start + emb.shape[0]].to(emb.dtype))
        start += emb.shape[0]
    return loss.detach()


# ------------------------------------------------------------------------------------------------------------
# Export and loading
# ------------------------------------------------------------------------------------------------------------


def save_cde(model: ContextualNeoBERT, heads: Tuple[dict, dict], dst, tokenizer_dirs: Tuple, extra_config=None) -> Path:
    """Folder with first_stage/ and second_stage/ (exported NeoBERT folders), the context projection and
    cde_config.json; built in a temporary sibling and renamed, so readers never see a partial folder."""
    from safetensors.torch import save_file

    dst = Path(dst)
    with atomic_path(dst) as tmp:
        for name, stage, head, tok in zip(("first_stage", "second_stage"), (model.first, model.second), heads,
                                          tokenizer_dirs):
            save_encoder(stage, head, stage.backbone.config, tmp / name, tok)
        save_file({k: v.detach().cpu().float().contiguous() for k, v in model.projection.state_dict().items()},
                  str(tmp / PROJECTION_FILE))
        config = {"context_size": model.context_size, "max_length": model.second.max_length,
                  "first_stage_hidden_size": model.first.backbone.config.hidden_size,
                  "second_stage_hidden_size": model.second.backbone.config.hidden_size,
                  "context_positions": "all context vectors at RoPE position 0, document tokens from 1",
                  "pooling": "mean over document tokens", **(extra_config or {})}
        (tmp / CDE_CONFIG).write_text(json.dumps(config, indent=2) + "\n")
    return dst


def load_cde(folder, max_length: Optional[int] = None) -> ContextualNeoBERT:
    from safetensors.torch import load_file

    folder = Path(folder)
    if not (folder / CDE_CONFIG).is_file():
        raise FileNotFoundError(f"{folder} has no {CDE_CONFIG}: not a CDE export")
    config = json.loads((folder / CDE_CONFIG).read_text())
    first, _, _ = load_encoder(folder / "first_stage", max_length or config["max_length"])
    second, _, _ = load_encoder(folder / "second_stage", max_length or config["max_length"])
    model = ContextualNeoBERT(first, second, config["context_size"])
    model.projection.load_state_dict(load_file(str(folder / PROJECTION_FILE)))
    return model


# ------------------------------------------------------------------------------------------------------------
# Training
# ------------------------------------------------------------------------------------------------------------


def finetune_cde(first_dir, datasets, output_dir, config: CDEConfig = CDEConfig(), second_dir=None,
                 device: Optional[str] = None, checkpoint_dir=None) -> Path:
    """Trains both stages (initialised from `first_dir` and `second_dir`, default the same folder) on the pairs of
    `datasets` (PairDataset), with contextual batches and two-stage GradCache; writes a CDE folder."""
    from .contrastive import info_nce_loss

    if not datasets:
        raise ValueError("no training datasets given")
    device = torch.device(device or ("cuda" if torch.cuda.is_available() else "cpu"))
    bf16 = config.bf16 if config.bf16 is not None else device.type == "cuda"
    torch.manual_seed(config.seed)
    rng = np.random.default_rng(config.seed)
    template = load_instructions()["template"]
    queries = [format_query(d.instruction, q, template) for d in datasets for q in d.queries]
    docs = [p for d in datasets for p in d.positives]

    first, head1, _ = load_encoder(first_dir, config.max_length)
    second, head2, _ = load_encoder(second_dir or first_dir, config.max_length)
    model = ContextualNeoBERT(first, second, config.context_size).to(device).train()

    # Pseudo-contexts from the untrained first stage's view of the documents.
    first.eval()
    with torch.no_grad():
        doc_vectors = torch.cat([first(**{k: v.to(device) for k, v in first.tokenize(docs[i:i + 256]).items()}).float().cpu()
                                 for i in range(0, len(docs), 256)])
    first.train()
    batches = contextual_batches(doc_vectors, config.batch_size, config.seed)
    logger.info("%d pairs in %d contextual batches of %d", len(docs), len(batches), config.batch_size)

    optimizer = torch.optim.AdamW(model.parameters(), lr=config.lr, weight_decay=config.weight_decay)
    lr_reached(config.warmup_steps, config.steps, config.lr, "CDE")
    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lr_lambda(config.warmup_steps, config.steps))
    autocast = (lambda: torch.autocast("cuda", dtype=torch.bfloat16)) if bf16 else contextlib.nullcontext

    def to_device(b):
        return {k: v.to(device) for k, v in b.items()}

    output_dir = Path(output_dir)
    checkpoint_dir = Path(checkpoint_dir) if checkpoint_dir else output_dir.with_name(output_dir.name + "-checkpoints")
    tokenizer_dirs = (first_dir, second_dir or first_dir)
    for step in range(config.steps):
        batch = batches[step % len(batches)]
        context_ids = rng.choice(batch.cluster, config.context_size, replace=len(batch.cluster) < config.context_size)
        optimizer.zero_grad(set_to_none=True)
        loss = cde_grad_cache_step(
            model, first.tokenize([docs[i] for i in context_ids]),
            [second.tokenize([queries[i] for i in batch.indices]), second.tokenize([docs[i] for i in batch.indices])],
            lambda q, d: info_nce_loss(q, d, config.temperature), config.chunk_size, to_device, autocast)
        if not math.isfinite(loss.item()):
            raise FloatingPointError(f"non-finite loss at step {step + 1}")
        torch.nn.utils.clip_grad_norm_(model.parameters(), config.max_grad_norm)
        optimizer.step()
        scheduler.step()
        if config.log_every and ((step + 1) % config.log_every == 0 or step + 1 == config.steps):
            logger.info("step %d/%d loss %.4f lr %.2e", step + 1, config.steps, loss.item(), scheduler.get_last_lr()[0])
        if config.checkpoint_every and (step + 1) % config.checkpoint_every == 0 and step + 1 < config.steps:
            save_cde(model, (head1, head2), checkpoint_dir / f"step_{step + 1}", tokenizer_dirs)
    return save_cde(model, (head1, head2), output_dir, tokenizer_dirs, {"training": asdict(config)})


# ------------------------------------------------------------------------------------------------------------
# MTEB
# ------------------------------------------------------------------------------------------------------------


def task_context_texts(task, hf_subset: str, hf_split: str) -> Optional[List[str]]:
    """Documents that describe a task's domain: the retrieval corpus, or the classification training texts.
    None when the task has neither (the texts being encoded are then the context, as in mteb's CDE wrapper)."""
    data = getattr(task, "dataset", None)
    if not data:
        return None
    t = task.metadata.type
    if t in ("Retrieval", "Reranking", "InstructionRetrieval", "InstructionReranking"):
        subset = data.get(hf_subset) or data.get("default") or {}
        corpus = (subset.get(hf_split) or {}).get("corpus")
        if corpus is None:
            return None
        return [f"{r.get('title') or ''} {r['text']}".strip() for r in corpus]
    if t == "Classification":
        split = getattr(task, "train_split", "train")
        ds = data[hf_subset] if hf_subset in data and split not in data else data
        if split in ds:
            return list(ds[split][getattr(task, "input_column_name", "text")])
    return None


class CDEEncoder:
    """mteb encoder protocol for a CDE folder: per (task, subset, split), J documents sampled from the task's
    corpus are embedded once by the first stage; every text is then embedded by the second stage with them."""

    def __init__(self, folder, dtype: str = "float16", device: Optional[str] = None, batch_size: int = 64,
                 max_length: Optional[int] = None, use_instructions: bool = True, name: Optional[str] = None,
                 context_size: Optional[int] = None, tasks: Sequence = (), seed: int = 42):
        from ..conversion.hf_format import checkpoint_revision
        from .mteb_eval import DTYPES, _autocast, model_meta

        if dtype not in DTYPES:
            raise ValueError(f"dtype {dtype!r} is not one of {sorted(DTYPES)}")
        self.device = torch.device(device or ("cuda" if torch.cuda.is_available() else "cpu"))
        self.dtype, self.batch_size, self.use_instructions, self.seed = DTYPES[dtype], batch_size, use_instructions, seed
        self._autocast = lambda: _autocast(self.device, self.dtype)
        self.model = load_cde(folder, max_length).to(self.device).eval()
        self.context_size = context_size or self.model.context_size
        self.tasks = {t.metadata.name: t for t in tasks}
        self._context_key, self._context = None, None
        revision = checkpoint_revision(folder, dtype=str(self.dtype), context_size=self.context_size, seed=seed,
                                       max_length=self.model.second.max_length,
                                       instructions=load_instructions() if use_instructions else None)
        self.mteb_model_meta = model_meta(name or Path(folder).resolve().name, revision,
                                          self.model.second.backbone.config.hidden_size, self.model.second.max_length,
                                          sum(p.numel() for p in self.model.parameters()))

    @torch.no_grad()
    def embed_context(self, texts: Sequence[str]) -> torch.Tensor:
        rng = np.random.default_rng(self.seed)
        picked = rng.choice(len(texts), self.context_size, replace=len(texts) < self.context_size)
        sample = [texts[i] for i in picked]
        out = []
        for i in range(0, len(sample), self.batch_size):
            b = {k: v.to(self.device) for k, v in self.model.first.tokenize(sample[i:i + self.batch_size]).items()}
            with self._autocast():
                out.append(self.model.embed_context(**b).float())
        return torch.cat(out)

    @torch.no_grad()
    def embed(self, texts: Sequence[str], context: torch.Tensor) -> torch.Tensor:
        out = []
        for i in range(0, len(texts), self.batch_size):
            b = {k: v.to(self.device) for k, v in self.model.tokenize(texts[i:i + self.batch_size]).items()}
            with self._autocast():
                out.append(self.model(**b, context=context).float().cpu())
        return torch.cat(out)

    def encode(self, inputs, *, task_metadata, hf_split, hf_subset, prompt_type=None, **kwargs) -> np.ndarray:
        from .instructions import mteb_instruction
        from .mteb_eval import query_side

        raw = [t for batch in inputs for t in batch["text"]]
        key = (task_metadata.name, hf_subset, hf_split)
        if key != self._context_key:
            task = self.tasks.get(task_metadata.name)
            texts = task_context_texts(task, hf_subset, hf_split) if task is not None else None
            self._context, self._context_key = self.embed_context(texts or raw), key
        instruction = (mteb_instruction(task_metadata.name, task_metadata.type)
                       if self.use_instructions and query_side(prompt_type) else None)
        return self.embed([format_query(instruction, t) for t in raw], self._context).numpy()

    def similarity(self, a, b):
        from mteb.similarity_functions import cos_sim

        return cos_sim(a, b)

    def similarity_pairwise(self, a, b):
        from mteb.similarity_functions import pairwise_cos_sim

        return pairwise_cos_sim(a, b)
