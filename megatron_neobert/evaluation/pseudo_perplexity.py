"""Pseudo-perplexity of long texts against sequence length (the NeoBERT paper's figure 2, appendix E).

For a sequence, each position is masked alone and the model's cross-entropy of the true token is taken;
pseudo-perplexity is exp of their mean. Special tokens ([CLS], [SEP]) are not scored. The single-mask copies
of a sequence are batched, `batch_size` per forward, and only the masked positions go through the MLM
decoder, so a 4096-token sequence costs 4096 / batch_size encoder passes and no [batch, length, vocab] logits.
"""

import csv
import json
import math
from dataclasses import dataclass
from pathlib import Path
from typing import List, Optional, Sequence

import torch
import torch.nn.functional as F

from ..atomic_write import atomic_file, atomic_path
from ..conversion.hf_format import load_neobert_auto_config
from ..defaults import DEFAULT_BUCKETS
from ..extras import require_extra
from ..progress import progress_bar

TEXT_SUFFIXES = (".jsonl", ".json", ".parquet", ".txt")


# --------------------------------------------------------------------------------------------------------
# Model and texts
# --------------------------------------------------------------------------------------------------------


def load_mlm(folder, rope_scaling: Optional[dict] = None, device="cpu"):
    """NeoBERT's MLM model from a NeoBERT folder (ours or the published layout; no remote code runs), optionally
    with RoPE scaled past the trained length: `rope_scaling` holds transformers' RoPE parameters,
    {"rope_type": "linear" | "dynamic" | "yarn", "factor": f[, "original_max_position_embeddings": n]}."""
    from huggingface_hub.errors import StrictDataclassError

    from ..hf import NeoBERTLMHead

    folder = str(folder)
    config = load_neobert_auto_config(folder)
    if rope_scaling:
        from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS

        if rope_scaling.get("rope_type") not in ROPE_INIT_FUNCTIONS:
            raise ValueError(f"RoPE scaling {rope_scaling}: rope_type must be one of transformers' "
                             f"{sorted(ROPE_INIT_FUNCTIONS)}")
        try:
            config.rope_parameters = {"rope_theta": config.rope_parameters["rope_theta"], **rope_scaling}
            config.standardize_rope_params()
            config.validate_rope()
        except (KeyError, ValueError, StrictDataclassError) as err:
            raise ValueError(f"RoPE scaling {rope_scaling}: {err}") from None
    model = NeoBERTLMHead.from_pretrained(folder, config=config)
    return model.to(device).eval()


def load_texts(source, text_field: str = "text", split: str = "train", config_name: Optional[str] = None,
               limit: Optional[int] = None) -> List[str]:
    """Texts from a .jsonl/.json (one object per line), .parquet or .txt (one document per line) file, or
    from a Hugging Face dataset name (streamed, so only `limit` rows are read)."""
    path = Path(source)
    if path.is_file():
        suffix = path.suffix.lower()
        if suffix in (".jsonl", ".json"):
            texts = []
            with open(path, encoding="utf-8") as f:
                for line_no, line in enumerate(f, 1):
                    if line.strip():
                        try:
                            row = json.loads(line)
                        except json.JSONDecodeError as e:
                            raise ValueError(f"{path}: line {line_no} is not valid JSON ({e.msg})") from None
                        if not isinstance(row, dict):
                            raise ValueError(f"{path}: line {line_no} is not a JSON object (one per line)")
                        if text_field not in row:
                            raise ValueError(f"{path} line {line_no} has no field {text_field!r} (has {sorted(row)})")
                        texts.append(row[text_field])
        elif suffix == ".parquet":
            import pyarrow.parquet as pq

            table = pq.read_table(path)
            if text_field not in table.column_names:
                raise ValueError(f"{path} has no column {text_field!r} (has {table.column_names})")
            texts = table.column(text_field).to_pylist()
        elif suffix == ".txt":
            texts = [line.rstrip("\n") for line in open(path, encoding="utf-8") if line.strip()]
        else:
            raise ValueError(f"{path}: unsupported text file type {suffix!r} (use one of {TEXT_SUFFIXES})")
        return texts[:limit] if limit else texts
    if path.suffix.lower() in TEXT_SUFFIXES:
        raise FileNotFoundError(f"text file {source} does not exist")
    require_extra("eval", f"hub dataset {source}", ("datasets",))
    from datasets import load_dataset

    stream = load_dataset(str(source), config_name, split=split, streaming=True)
    texts = []
    for row in stream:
        if text_field not in row:
            raise ValueError(f"dataset {source} has no field {text_field!r} (has {sorted(row)})")
        texts.append(row[text_field])
        if limit and len(texts) >= limit:
            break
    return texts


# --------------------------------------------------------------------------------------------------------
# Computation
# --------------------------------------------------------------------------------------------------------


def _masked_logits(model, ids: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
    rows = torch.arange(len(positions), device=ids.device)
    if hasattr(model, "model") and hasattr(model, "decoder"):  # NeoBERTLMHead, ours or the published one
        hidden = model.model(input_ids=ids)[0]
        return model.decoder(hidden[rows, positions])
    return model(input_ids=ids).logits[rows, positions]


@torch.no_grad()
def masked_token_losses(model, input_ids: Sequence[int], positions: Sequence[int], mask_token_id: int,
                        batch_size: int = 32) -> torch.Tensor:
    """Cross-entropy of input_ids[p] with position p (alone) masked, for every p in `positions` -> fp32 [P]."""
    device = next(model.parameters()).device
    ids = torch.as_tensor(list(input_ids), dtype=torch.long, device=device)
    positions = torch.as_tensor(list(positions), dtype=torch.long, device=device)
    losses = []
    for start in range(0, len(positions), batch_size):
        chunk = positions[start: start + batch_size]
        copies = ids.repeat(len(chunk), 1)
        copies[torch.arange(len(chunk), device=device), chunk] = mask_token_id
        with torch.autocast("cuda", dtype=torch.bfloat16, enabled=device.type == "cuda"):
            logits = _masked_logits(model, copies, chunk)
        losses.append(F.cross_entropy(logits.float(), ids[chunk], reduction="none"))
    return torch.cat(losses).cpu() if losses else torch.zeros(0)


@dataclass
class SequenceResult:
    index: int  # position of the text in the input
    length: int  # tokens, special tokens included
    scored: int  # tokens scored (special tokens excluded)
    mean_loss: float

    @property
    def pseudo_perplexity(self) -> float:
        return math.exp(self.mean_loss)


def pseudo_perplexities(model, tokenizer, texts: Sequence[str], max_length: int, batch_size: int = 32,
                        min_length: int = 2, progress: bool = True) -> List[SequenceResult]:
    """Per text (truncated to `max_length` tokens; shorter than `min_length` skipped): mean masked loss."""
    if tokenizer.mask_token_id is None:
        raise ValueError("the tokenizer has no mask token")
    results = []
    for index, text in enumerate(progress_bar(texts, desc="pseudo-perplexity", enabled=progress, unit="text")):
        enc = tokenizer(text, truncation=True, max_length=max_length, return_special_tokens_mask=True)
        positions = [i for i, special in enumerate(enc["special_tokens_mask"]) if not special]
        if len(enc["input_ids"]) < min_length or not positions:
            continue
        losses = masked_token_losses(model, enc["input_ids"], positions, tokenizer.mask_token_id, batch_size)
        results.append(SequenceResult(index, len(enc["input_ids"]), len(positions), float(losses.mean())))
    return results


def bucket_results(results: Sequence[SequenceResult], edges: Sequence[int] = DEFAULT_BUCKETS) -> List[dict]:
    """Groups sequences by length: bucket i holds edges[i-1] < length <= edges[i]. A bucket's pseudo-perplexity
    is exp of its token-weighted mean loss (every scored token counts once, as in a single long text)."""
    edges = sorted(int(e) for e in edges)
    rows = []
    for low, high in zip([0] + edges[:-1], edges):
        inside = [r for r in results if low < r.length <= high]
        if not inside:
            continue
        tokens = sum(r.scored for r in inside)
        mean_loss = sum(r.mean_loss * r.scored for r in inside) / tokens
        rows.append({"min_length": low + 1, "max_length": high, "sequences": len(inside), "tokens": tokens,
                     "mean_length": sum(r.length for r in inside) / len(inside), "mean_loss": mean_loss,
                     "pseudo_perplexity": math.exp(mean_loss)})
    beyond = [r for r in results if r.length > edges[-1]]
    if beyond:
        raise ValueError(f"{len(beyond)} sequence(s) are longer than the last bucket edge {edges[-1]}")
    return rows


def write_outputs(results: Sequence[SequenceResult], buckets: List[dict], prefix, title: str = "") -> List[Path]:
    """{prefix}.csv (buckets), {prefix}_sequences.csv and {prefix}.png (pseudo-perplexity against length)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    prefix = Path(prefix)
    prefix.parent.mkdir(parents=True, exist_ok=True)
    paths = [prefix.with_suffix(".csv"), prefix.parent / f"{prefix.name}_sequences.csv", prefix.with_suffix(".png")]
    fields = ["min_length", "max_length", "sequences", "tokens", "mean_length", "mean_loss", "pseudo_perplexity"]
    with atomic_file(paths[0], "w", newline="", encoding="utf-8") as f:
        writer = csv.DictWriter(f, fieldnames=fields)
        writer.writeheader()
        writer.writerows(buckets)
    with atomic_file(paths[1], "w", newline="", encoding="utf-8") as f:
        writer = csv.writer(f)
        writer.writerow(["index", "length", "scored", "mean_loss", "pseudo_perplexity"])
        writer.writerows([r.index, r.length, r.scored, r.mean_loss, r.pseudo_perplexity] for r in results)

    fig, ax = plt.subplots(figsize=(6, 4))
    ax.scatter([r.length for r in results], [r.pseudo_perplexity for r in results], s=6, alpha=0.3, label="sequences")
    ax.plot([b["mean_length"] for b in buckets], [b["pseudo_perplexity"] for b in buckets], "o-", label="buckets")
    ax.set_xlabel("sequence length (tokens)")
    ax.set_ylabel("pseudo-perplexity")
    ax.set_yscale("log")
    ax.set_title(title)
    ax.legend()
    fig.tight_layout()
    with atomic_path(paths[2]) as tmp:
        fig.savefig(tmp, dpi=120, metadata={"Title": title})  # readable without viewing the image
    plt.close(fig)
    return paths


__all__ = ["DEFAULT_BUCKETS", "load_mlm", "load_texts", "masked_token_losses", "SequenceResult",
           "pseudo_perplexities", "bucket_results", "write_outputs"]
