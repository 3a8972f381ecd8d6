"""GLUE fine-tuning with the NeoBERT paper's protocol.

One run = one task and one (batch size, learning rate, weight decay, seed): 10 epochs, dev evaluation every
min(500, steps_per_epoch // 10) steps, early stop after 15 evaluations without improvement, the best dev
score is the run's result. RTE, STS-B, MRPC and QNLI start from the best MNLI checkpoint. A grid is many
independent runs, each one stored as `{output_dir}/runs/{key}.json` when it finishes, so an interrupted grid
resumes where it stopped; see `run_glue`.
"""

import contextlib
import logging
import math
import time
from dataclasses import asdict
from pathlib import Path
from typing import Dict

import torch

from ..atomic_write import atomic_path
from .. import hf  # noqa: F401  (registers NeoBERT with the Auto classes: no remote code runs)
from ..conversion.hf_format import load_neobert_auto_config
from ..progress import library_bars, progress_bar
from .glue_data import HF_DATASET, GlueTask, get_task, load_split
from .glue_metrics import task_metrics
from .glue_protocol import PAPER_GRID, Protocol, RunSpec, data_source, eval_interval

logger = logging.getLogger(__name__)


# --------------------------------------------------------------------------------------------------------
# Model loading
# --------------------------------------------------------------------------------------------------------


def load_classifier(folder, task: GlueTask, seed: int = 0):
    """AutoModelForSequenceClassification for `task` from a NeoBERT folder (ours, the published one, or a
    fine-tuned checkpoint). A classifier layer trained for another label space (MNLI -> RTE) is re-initialised;
    the encoder and the dense layer of the head are kept."""
    from transformers import AutoModelForSequenceClassification

    folder = str(folder)
    source = load_neobert_auto_config(folder)
    labels = task.labels or ("score",)
    id2label = dict(enumerate(labels))
    torch.manual_seed(seed)  # new head weights depend on the run's seed only
    with _load_report_hidden():
        model, loading = AutoModelForSequenceClassification.from_pretrained(
            folder, trust_remote_code=False, num_labels=len(labels), id2label=id2label,
            label2id={v: k for k, v in id2label.items()},
            problem_type="regression" if task.is_regression else "single_label_classification",
            ignore_mismatched_sizes=True,  # MNLI's 3-way classifier into a 2-way or regression head
            output_loading_info=True,
        )
    trained_for = [source.id2label[i] for i in sorted(source.id2label)] if source.id2label else []
    head_was_trained = source.architectures and "NeoBERTForSequenceClassification" in source.architectures
    _report_unexpected_loading(folder, loading, bool(head_was_trained))
    if head_was_trained and tuple(trained_for) != tuple(labels):
        # Same shape but other labels (or a shape mismatch already re-drawn by transformers): re-draw it with
        # the published classifier initialisation so the new task never inherits MNLI's label meaning.
        with torch.no_grad():
            model.classifier.weight.normal_(0.0, model.config.classifier_init_range)
            model.classifier.bias.zero_()
    return model


HEAD_PREFIXES = ("dense.", "classifier.")  # NeoBERTForSequenceClassification's head, on top of the encoder


@contextlib.contextmanager
def _load_report_hidden():
    """transformers prints a LOAD REPORT table (with terminal colour codes) for every key a load did not match,
    once per GLUE run and per watched checkpoint; `_report_unexpected_loading` says what is not expected."""
    from transformers.utils import logging as hf_logging

    def not_the_report(record: logging.LogRecord) -> bool:
        # A filter, not a level: transformers checks TP plans (and warns) when its loader's level is raised.
        return "LOAD REPORT" not in record.getMessage()

    loader = hf_logging.get_logger("transformers.modeling_utils")
    loader.addFilter(not_the_report)
    try:
        yield
    finally:
        loader.removeFilter(not_the_report)


def _report_unexpected_loading(folder: str, loading: dict, head_was_trained: bool) -> None:
    """One warning for what a classifier load should not meet: encoder weights the folder lacks, weights the
    model has no place for, or a trained head missing. Expected, and silent: a pre-trained folder without the
    head (it is newly initialised for the task), and a head of another label space re-drawn (MNLI -> RTE)."""
    head = lambda key: key.startswith(HEAD_PREFIXES)  # noqa: E731
    missing = [k for k in loading["missing_keys"] if head_was_trained or not head(k)]
    mismatched = [k for k, *_ in loading["mismatched_keys"] if not head(k)]
    problems = [f"{what}: {', '.join(sorted(keys))}" for what, keys in (
        ("missing (newly initialised)", missing), ("unexpected (not loaded)", loading["unexpected_keys"]),
        ("of another shape (newly initialised)", mismatched)) if keys]
    if problems:
        logger.warning("%s: the classifier's weights do not match the folder's: %s", folder, "; ".join(problems))


def _save_checkpoint(model, tokenizer, state_dict, dst: Path) -> None:
    """Writes the best weights as a loadable folder, atomically."""
    if dst.exists():
        raise FileExistsError(f"checkpoint {dst} already exists; refusing to overwrite it")
    current = {k: v.detach().clone() for k, v in model.state_dict().items()}
    model.load_state_dict(state_dict)
    try:
        with atomic_path(dst) as tmp:
            model.save_pretrained(str(tmp))
            tokenizer.save_pretrained(str(tmp))
    finally:
        model.load_state_dict(current)


# --------------------------------------------------------------------------------------------------------
# One run
# --------------------------------------------------------------------------------------------------------


class _Encoded:
    """Token ids of one split, padded per batch."""

    def __init__(self, tokenizer, split, max_length: int, regression: bool):
        enc = tokenizer(split.text_a, split.text_b, truncation=True, max_length=max_length)
        self.input_ids = enc["input_ids"]
        self.labels = torch.tensor(split.labels, dtype=torch.float32 if regression else torch.long)
        self.pad_id = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else 0

    def __len__(self):
        return len(self.input_ids)

    def batch(self, indices, device):
        rows = [self.input_ids[i] for i in indices]
        width = max(len(r) for r in rows)
        ids = torch.full((len(rows), width), self.pad_id, dtype=torch.long)
        mask = torch.zeros((len(rows), width), dtype=torch.long)
        for j, r in enumerate(rows):
            ids[j, : len(r)] = torch.tensor(r)
            mask[j, : len(r)] = 1
        return ids.to(device), mask.to(device), self.labels[list(indices)].to(device)


def _autocast(device: torch.device):
    # bf16 autocast on GPU, as the paper trains; fp32 on CPU.
    return torch.autocast("cuda", dtype=torch.bfloat16, enabled=device.type == "cuda")


@torch.no_grad()
def evaluate(model, task: GlueTask, dev: Dict[str, _Encoded], batch_size: int, device) -> Dict[str, float]:
    was_training = model.training
    model.eval()
    preds, labels = {}, {}
    for split, data in dev.items():
        out = []
        for start in range(0, len(data), batch_size):
            ids, mask, _ = data.batch(range(start, min(start + batch_size, len(data))), device)
            with _autocast(device):
                logits = model(input_ids=ids, attention_mask=mask).logits.float()
            out.append(logits.squeeze(-1) if task.is_regression else logits.argmax(-1))
        preds[split], labels[split] = torch.cat(out).cpu().numpy(), data.labels.numpy()
    model.train(was_training)
    return task_metrics(task, preds, labels)


def _optimizer(model, spec: RunSpec):
    # No weight decay on biases and RMSNorm gains (1-D tensors), as usual for BERT fine-tuning.
    decay = [p for p in model.parameters() if p.requires_grad and p.dim() > 1]
    no_decay = [p for p in model.parameters() if p.requires_grad and p.dim() <= 1]
    return torch.optim.AdamW([{"params": decay, "weight_decay": spec.weight_decay},
                              {"params": no_decay, "weight_decay": 0.0}], lr=spec.learning_rate)


def fine_tune(
    model_path,
    spec: RunSpec,
    protocol: Protocol = Protocol(),
    data_dir=None,
    dataset_name: str = HF_DATASET,
    init_path=None,
    checkpoint_dir=None,
    device="cpu",
    progress: bool = True,
) -> dict:
    """Fine-tunes `model_path` (or `init_path`, e.g. an MNLI checkpoint) on one task; returns the run record.

    The tokenizer always comes from `model_path`. `checkpoint_dir`, when given, receives the weights of the
    best evaluation.
    """
    from transformers import AutoTokenizer

    library_bars(progress)  # here: the runs of a grid on several devices load their models in worker processes
    task, device = get_task(spec.task), torch.device(device)
    started = time.time()
    tokenizer = AutoTokenizer.from_pretrained(str(model_path), trust_remote_code=True)
    train_split = load_split(task, "train", data_dir, dataset_name)
    if protocol.max_train_examples:
        n = protocol.max_train_examples
        train_split.text_a = train_split.text_a[:n]
        train_split.text_b = train_split.text_b[:n] if train_split.text_b else None
        train_split.labels = train_split.labels[:n]
    train = _Encoded(tokenizer, train_split, protocol.max_length, task.is_regression)
    dev = {s: _Encoded(tokenizer, load_split(task, s, data_dir, dataset_name), protocol.max_length,
                       task.is_regression) for s in task.dev_splits}

    model = load_classifier(init_path or model_path, task, seed=spec.seed).to(device)
    model.train()

    steps_per_epoch = math.ceil(len(train) / spec.batch_size)
    every = eval_interval(steps_per_epoch, protocol.max_eval_interval)
    total = protocol.epochs * steps_per_epoch
    warmup = int(protocol.warmup_ratio * total)
    optimizer = _optimizer(model, spec)
    scheduler = torch.optim.lr_scheduler.LambdaLR(
        optimizer, lambda s: (s + 1) / warmup if s < warmup else max(0.0, (total - s) / max(1, total - warmup)))

    generator = torch.Generator().manual_seed(spec.seed)
    history, best, best_state, bad, step = [], None, None, 0, 0
    stopped_early = False
    bar = progress_bar(total=total, desc=spec.key, enabled=progress, leave=False)
    for _ in range(protocol.epochs):
        order = torch.randperm(len(train), generator=generator).tolist()
        for start in range(0, len(order), spec.batch_size):
            ids, mask, labels = train.batch(order[start: start + spec.batch_size], device)
            with _autocast(device):
                loss = model(input_ids=ids, attention_mask=mask, labels=labels).loss
            loss.backward()
            if protocol.max_grad_norm:
                torch.nn.utils.clip_grad_norm_(model.parameters(), protocol.max_grad_norm)
            optimizer.step()
            scheduler.step()
            optimizer.zero_grad(set_to_none=True)
            step += 1
            bar.update(1)
            if step % every == 0 or step == total:
                metrics = evaluate(model, task, dev, protocol.eval_batch_size, device)
                history.append({"step": step, "loss": loss.item(), **metrics})
                if best is None or metrics["score"] > best["score"]:
                    best, bad = {"step": step, **metrics}, 0
                    if checkpoint_dir is not None:
                        best_state = {k: v.detach().to("cpu", copy=True) for k, v in model.state_dict().items()}
                else:
                    bad += 1
                bar.set_postfix(score=f"{metrics['score']:.4f}", best=f"{best['score']:.4f}")
                if bad >= protocol.patience:
                    stopped_early = True
                    break
        if stopped_early:
            break
    bar.close()

    checkpoint = None
    if checkpoint_dir is not None and best_state is not None:
        checkpoint = Path(checkpoint_dir)
        checkpoint.parent.mkdir(parents=True, exist_ok=True)
        _save_checkpoint(model, tokenizer, best_state, checkpoint)
    return {
        "key": spec.key,
        **asdict(spec),
        "model": str(Path(model_path).resolve()) if Path(model_path).exists() else str(model_path),
        "init_checkpoint": str(init_path) if init_path else None,
        "data": data_source(data_dir, dataset_name),
        "score": best["score"],
        "metrics": {k: v for k, v in best.items() if k != "step"},
        "best_step": best["step"],
        "steps": step,
        "steps_per_epoch": steps_per_epoch,
        "eval_every": every,
        "stopped_early": stopped_early,
        "history": history,
        "checkpoint": str(checkpoint) if checkpoint else None,
        "train_examples": len(train),
        "protocol": asdict(protocol),
        "seconds": round(time.time() - started, 1),
    }


__all__ = ["PAPER_GRID", "Protocol", "RunSpec", "data_source", "eval_interval", "load_classifier", "evaluate", "fine_tune"]
