"""Unified contrastive fine-tuning of an HF NeoBERT folder, as in the NeoBERT paper."""

import contextlib
import json
import logging
import math
from dataclasses import asdict
from pathlib import Path
from typing import Callable, Dict, List, Optional, Sequence, Tuple

import torch

from ..conversion.hf_format import read_hf_folder, write_hf_folder
from ..hf import NeoBERT, NeoBERTConfig
from .config import ContrastiveConfig
from .contrastive import MeanPoolEncoder, grad_cache_step, info_nce_loss
from .data import MixtureBatchSampler, PairDataset
from .instructions import format_query, load_instructions

logger = logging.getLogger(__name__)


def lr_reached(warmup: int, total: int, lr: float, what: str) -> float:
    """The highest learning rate a run reaches; a warning when the warmup outlasts the run, which then ends far
    below --lr (a short run with the default warmup would otherwise train at ~1e-7 without a word)."""
    peak = lr * min(1.0, total / warmup) if warmup > 0 else lr
    if warmup > total:
        logger.warning("%s: --warmup-steps %d is longer than the run's %d steps: the learning rate peaks at %.3g, "
                       "%.0f%% of --lr %g; pass a shorter --warmup-steps (e.g. %d, a tenth of the run)",
                       what, warmup, total, peak, 100 * peak / lr, lr, max(1, total // 10))
    return peak


def load_encoder(model_dir, max_length: Optional[int] = None) -> Tuple[MeanPoolEncoder, Dict[str, torch.Tensor], NeoBERTConfig]:
    """An HF NeoBERT folder -> (mean-pooling encoder in float32, the folder's MLM head tensors, config)."""
    from transformers import AutoTokenizer

    state_dict, config = read_hf_folder(model_dir)
    backbone = NeoBERT(config)
    backbone.load_state_dict({k[len("model."):]: v.float() for k, v in state_dict.items() if k.startswith("model.")})
    head = {k: v for k, v in state_dict.items() if k.startswith("decoder.")}
    tokenizer = AutoTokenizer.from_pretrained(str(model_dir), trust_remote_code=True)  # our own export
    return MeanPoolEncoder(backbone, tokenizer, max_length or config.max_length), head, config


def save_encoder(encoder: MeanPoolEncoder, head: Dict[str, torch.Tensor], config: NeoBERTConfig, dst,
                 tokenizer_dir, dtype: torch.dtype = torch.float32) -> Path:
    """Atomic HF folder (sentence-transformers mean pooling). The MLM head is not trained here; it is carried
    over so that the folder stays a complete NeoBERTLMHead checkpoint. A headless source gets a head tied to the
    embeddings with zero bias, which keeps the MLM logits meaningful."""
    sd = {"model." + k: v.detach().cpu() for k, v in encoder.backbone.state_dict().items()}
    if not head:
        emb = sd["model.encoder.weight"]
        head = {"decoder.weight": emb.clone(), "decoder.bias": torch.zeros(emb.shape[0])}
    sd.update(head)
    return write_hf_folder(dst, sd, config, tokenizer_path=tokenizer_dir, dtype=dtype, overwrite=True)


def lr_lambda(warmup: int, total: int) -> Callable[[int], float]:
    """Linear warmup to the peak, then linear decay to zero."""
    def f(step: int) -> float:
        if step < warmup:
            return (step + 1) / warmup
        return max(0.0, (total - step) / max(1, total - warmup))
    return f


def _batch_texts(ds: PairDataset, idx, template: str) -> Tuple[List[str], List[str]]:
    queries = [format_query(ds.instruction, ds.queries[i], template) for i in idx]
    docs = [ds.positives[i] for i in idx] + [n for i in idx for n in ds.negatives[i]]
    return queries, docs


def finetune_contrastive(
    model_dir,
    datasets: Sequence[PairDataset],
    output_dir,
    config: ContrastiveConfig = ContrastiveConfig(),
    device: Optional[str] = None,
    checkpoint_dir=None,
) -> Path:
    """Fine-tunes the NeoBERT in `model_dir` on `datasets`; writes `output_dir`, and `checkpoint_dir`/step_N
    every `checkpoint_every` steps (default `<output_dir>-checkpoints`: outside `output_dir`, which the final
    save replaces), each an atomic sentence-transformers-ready folder."""
    if not datasets:
        raise ValueError("no training datasets given")
    for ds in datasets:
        if ds.instruction is None:
            logger.warning("dataset %s has no instruction: its queries are used as they are", ds.name)
    device = torch.device(device or ("cuda" if torch.cuda.is_available() else "cpu"))
    bf16 = config.bf16 if config.bf16 is not None else device.type == "cuda"
    torch.manual_seed(config.seed)

    encoder, head, model_config = load_encoder(model_dir, config.max_length)
    encoder = encoder.to(device).train()
    template = load_instructions()["template"]
    sampler = iter(MixtureBatchSampler([len(d) for d in datasets], config.batch_size, config.alpha, config.seed,
                                       names=[f"dataset {d.name} ({d.source})" for d in datasets]))

    decay = [p for n, p in encoder.named_parameters() if p.dim() > 1]
    no_decay = [p for n, p in encoder.named_parameters() if p.dim() <= 1]  # norms
    optimizer = torch.optim.AdamW([{"params": decay, "weight_decay": config.weight_decay},
                                   {"params": no_decay, "weight_decay": 0.0}], lr=config.lr)
    lr_reached(config.warmup_steps, config.steps, config.lr, "contrastive fine-tuning")
    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lr_lambda(config.warmup_steps, config.steps))

    def encode(batch):
        batch = {k: v.to(device) for k, v in batch.items()}
        ctx = torch.autocast("cuda", dtype=torch.bfloat16) if bf16 else contextlib.nullcontext()
        with ctx:
            return encoder(**batch)

    def loss_fn(q, d):
        return info_nce_loss(q, d, config.temperature)

    output_dir = Path(output_dir)
    checkpoint_dir = Path(checkpoint_dir) if checkpoint_dir else output_dir.with_name(output_dir.name + "-checkpoints")
    for step in range(config.steps):
        d, idx = next(sampler)
        queries, docs = _batch_texts(datasets[d], idx, template)
        optimizer.zero_grad(set_to_none=True)
        loss = grad_cache_step(encode, [encoder.tokenize(queries), encoder.tokenize(docs)], loss_fn, config.chunk_size)
        norm = torch.nn.utils.clip_grad_norm_(encoder.parameters(), config.max_grad_norm)
        optimizer.step()
        scheduler.step()
        if not math.isfinite(loss.item()):
            raise FloatingPointError(f"non-finite loss at step {step + 1} on dataset {datasets[d].name}")
        if config.log_every and ((step + 1) % config.log_every == 0 or step + 1 == config.steps):
            logger.info("step %d/%d dataset %s loss %.4f grad_norm %.3f lr %.2e", step + 1, config.steps,
                        datasets[d].name, loss.item(), norm.item(), scheduler.get_last_lr()[0])
        if config.checkpoint_every and (step + 1) % config.checkpoint_every == 0 and step + 1 < config.steps:
            save_encoder(encoder, head, model_config, checkpoint_dir / f"step_{step + 1}", model_dir)
    logger.info("training config: %s", json.dumps(asdict(config)))
    return save_encoder(encoder, head, model_config, output_dir, model_dir)
