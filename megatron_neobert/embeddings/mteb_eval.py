"""MTEB (mteb 2.x) evaluation of exported NeoBERT embedding models, with the paper's instructions and summary.

mteb caches results under {model name}/{revision}/{task}.json and returns cached scores without running the
model. Our checkpoints are local folders with no hub revision, so the revision is a hash of everything that
determines the embeddings (weights, config, tokenizer, instructions, dtype): a new checkpoint can never be served
another one's scores.
"""

import logging
from pathlib import Path
from typing import Dict, Iterable, List, Optional, Sequence

import numpy as np
import torch

from ..atomic_write import write_json_atomic, write_text_atomic
from ..conversion.hf_format import checkpoint_revision
from ..defaults import DTYPE_NAMES, torch_dtypes
from .finetune import load_encoder
from .instructions import format_query, load_instructions, mteb_instruction

logger = logging.getLogger(__name__)

TASK_TYPES = ("Classification", "Clustering", "PairClassification", "Reranking", "Retrieval", "STS", "Summarization")
# NeoBERT after unified contrastive fine-tuning, MTEB(eng, v1), 56 tasks (the paper's table).
PAPER_SCORES = {"Average": 51.3, "Classification": 61.6, "Clustering": 40.8, "PairClassification": 76.2,
                "Reranking": 51.2, "Retrieval": 31.6, "STS": 74.8, "Summarization": 30.7}
DTYPES = torch_dtypes(DTYPE_NAMES)


def model_meta(name: str, revision: str, embed_dim: int, max_tokens: int, n_parameters: int):
    from mteb.models.model_meta import ModelMeta, ScoringFunction

    return ModelMeta.create_empty(dict(
        name=name if "/" in name else f"megatron_neobert/{name}", revision=revision, embed_dim=embed_dim,
        max_tokens=max_tokens, n_parameters=n_parameters, similarity_fn_name=ScoringFunction.COSINE, use_instructions=True,
        languages=["eng-Latn"], framework=["PyTorch"], open_weights=True))


def _texts(inputs) -> List[str]:
    return [t for batch in inputs for t in batch["text"]]


def query_side(prompt_type) -> bool:
    """Instructions go on queries and on both sides of symmetric tasks (STS, clustering, ... have no prompt
    type), never on retrieval documents."""
    return prompt_type is None or getattr(prompt_type, "value", prompt_type) == "query"


def _autocast(device: torch.device, dtype: torch.dtype):
    import contextlib

    if dtype == torch.float32:
        return contextlib.nullcontext()
    return torch.autocast(device.type, dtype=dtype)


class NeoBERTEncoder:
    """mteb encoder protocol for a mean-pooling NeoBERT folder (ours, loaded without remote code)."""

    def __init__(self, model_dir, dtype: str = "float16", device: Optional[str] = None, batch_size: int = 64,
                 max_length: Optional[int] = None, use_instructions: bool = True, name: Optional[str] = None):
        if dtype not in DTYPES:
            raise ValueError(f"dtype {dtype!r} is not one of {sorted(DTYPES)}")
        self.device = torch.device(device or ("cuda" if torch.cuda.is_available() else "cpu"))
        self.dtype, self.batch_size, self.use_instructions = DTYPES[dtype], batch_size, use_instructions
        self.encoder, _, config = load_encoder(model_dir, max_length)
        self.encoder.to(self.device).eval()
        instructions = load_instructions() if use_instructions else None
        revision = checkpoint_revision(model_dir, dtype=str(self.dtype), max_length=self.encoder.max_length,
                                       instructions=instructions, pooling="mean")
        self.mteb_model_meta = model_meta(name or Path(model_dir).resolve().name, revision, config.hidden_size,
                                          self.encoder.max_length, sum(p.numel() for p in self.encoder.parameters()))

    def instruction_for(self, task_metadata, prompt_type) -> Optional[str]:
        if not self.use_instructions or not query_side(prompt_type):
            return None
        return mteb_instruction(task_metadata.name, task_metadata.type)

    @torch.no_grad()
    def embed(self, texts: Sequence[str]) -> torch.Tensor:
        out = []
        for i in range(0, len(texts), self.batch_size):
            batch = {k: v.to(self.device) for k, v in self.encoder.tokenize(texts[i:i + self.batch_size]).items()}
            with _autocast(self.device, self.dtype):
                out.append(self.encoder(**batch).float().cpu())
        return torch.cat(out) if out else torch.zeros(0, self.mteb_model_meta.embed_dim)

    def encode(self, inputs, *, task_metadata, hf_split, hf_subset, prompt_type=None, **kwargs) -> np.ndarray:
        instruction = self.instruction_for(task_metadata, prompt_type)
        texts = [format_query(instruction, t) for t in _texts(inputs)]
        return self.embed(texts).numpy()

    def similarity(self, a, b):
        from mteb.similarity_functions import cos_sim

        return cos_sim(a, b)

    def similarity_pairwise(self, a, b):
        from mteb.similarity_functions import pairwise_cos_sim

        return pairwise_cos_sim(a, b)


def resolve_tasks(names: Iterable[str]) -> list:
    """Benchmark names (e.g. 'MTEB(eng, v1)') expand to their tasks; other names are tasks. Unknown names are
    reported together."""
    import mteb

    tasks, unknown = [], []
    for name in names:
        try:
            tasks.extend(mteb.get_benchmark(name).tasks)
            continue
        except KeyError:
            pass
        try:
            tasks.append(mteb.get_task(name))
        except KeyError:
            unknown.append(name)
    if unknown:
        raise ValueError(f"unknown MTEB task or benchmark name(s): {', '.join(map(repr, unknown))}")
    seen, unique = set(), []
    for t in tasks:
        if t.metadata.name not in seen:
            seen.add(t.metadata.name)
            unique.append(t)
    return unique


def summarize(task_results, task_types: Dict[str, str], paper: Dict[str, float] = PAPER_SCORES) -> dict:
    """Main scores (x100) by task and averaged by task type, beside the paper's numbers. `task_types` maps task
    names to types (TaskResult.task_type looks the name up in mteb's registry, which local tasks are not in)."""
    per_task = {}
    for r in task_results:
        per_task[r.task_name] = {"type": task_types[r.task_name], "main_score": 100 * float(r.get_score())}
    by_type = {}
    for t in TASK_TYPES + tuple(sorted({v["type"] for v in per_task.values()} - set(TASK_TYPES))):
        scores = [v["main_score"] for v in per_task.values() if v["type"] == t]
        if scores:
            by_type[t] = {"n_tasks": len(scores), "ours": float(np.mean(scores)), "paper": paper.get(t)}
    average = float(np.mean([v["main_score"] for v in per_task.values()])) if per_task else float("nan")
    return {"tasks": per_task, "by_type": by_type,
            "average": {"n_tasks": len(per_task), "ours": average, "paper": paper.get("Average")}}


def summary_markdown(summary: dict, title: str = "MTEB results") -> str:
    def fmt(x):
        return "-" if x is None else f"{x:.2f}"

    lines = [f"## {title}", "", "| task type | tasks | ours | NeoBERT (paper) |", "| --- | --- | --- | --- |"]
    for t, row in summary["by_type"].items():
        lines.append(f"| {t} | {row['n_tasks']} | {fmt(row['ours'])} | {fmt(row['paper'])} |")
    avg = summary["average"]
    lines.append(f"| **Average** | {avg['n_tasks']} | {fmt(avg['ours'])} | {fmt(avg['paper'])} |")
    lines += ["", "The paper's numbers are over all 56 tasks of MTEB(eng, v1); a subset is not comparable.", "",
              "| task | type | main score |", "| --- | --- | --- |"]
    lines += [f"| {name} | {v['type']} | {v['main_score']:.2f} |" for name, v in sorted(summary["tasks"].items())]
    if summary.get("failed"):
        lines += ["", f"Failed ({len(summary['failed'])} task(s), not in the averages above):", ""]
        lines += [f"- {name}: {error}" for name, error in sorted(summary["failed"].items())]
    return "\n".join(lines) + "\n"


def _write_summary(output_dir: Path, task_results, types: Dict[str, str], failed: Dict[str, str], meta,
                   model_name: str) -> dict:
    summary = summarize(task_results, types)
    summary.update(model={"name": meta.name, "revision": meta.revision}, failed=failed)
    write_json_atomic(output_dir / "summary.json", summary)
    write_text_atomic(output_dir / "summary.md",
                      summary_markdown(summary, f"MTEB results: {model_name} @ {meta.revision}"))
    return summary


class MTEBTaskError(RuntimeError):
    """Some tasks failed; the summary of those that finished is written. One line: the tools print it as their
    `error:`."""


def run_mteb(model, tasks, output_dir, cache_dir=None, overwrite: bool = False, encode_batch_size: int = 64,
             model_name: Optional[str] = None) -> dict:
    """Evaluates `model` (a NeoBERTEncoder or any mteb encoder) on `tasks` (task objects or names); writes
    summary.json and summary.md to `output_dir` and returns the summary. `model_name` heads summary.md: the folder
    or name the user gave (default: the model's name in mteb's cache, `megatron_neobert/` and the folder's last
    component for a local folder, which says little).

    One task at a time, the summary rewritten after each: a task that fails (or an interruption) leaves the
    summary of those that finished; failed tasks are listed in it, and then raised as an MTEBTaskError."""
    import mteb
    from mteb.cache import ResultCache

    tasks = list(tasks)
    if not tasks:
        raise ValueError("no MTEB tasks given")
    if isinstance(tasks[0], str):
        tasks = resolve_tasks(tasks)
    output_dir = Path(output_dir)
    cache = ResultCache(cache_path=cache_dir or output_dir / "mteb_cache")
    types, meta = {t.metadata.name: t.metadata.type for t in tasks}, model.mteb_model_meta
    finished, failed = [], {}
    for task in tasks:
        result = mteb.evaluate(model, [task], cache=cache, overwrite_strategy="always" if overwrite else "only-missing",
                               encode_kwargs={"batch_size": encode_batch_size}, show_progress_bar=False,
                               raise_error=False)  # mteb logs the task's error; the others still run
        finished += result.task_results
        failed.update({e.task_name: " ".join(e.exception.split()) for e in result.exceptions or []})
        summary = _write_summary(output_dir, finished, types, failed, meta, model_name or meta.name)
    if failed:
        raise MTEBTaskError(f"{len(failed)} of {len(tasks)} MTEB task(s) failed ({output_dir / 'summary.md'} holds "
                            f"the {len(finished)} that finished): "
                            + "; ".join(f"{name}: {error}" for name, error in sorted(failed.items())))
    return summary
