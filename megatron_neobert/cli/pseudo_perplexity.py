"""Pseudo-perplexity of long texts against sequence length (paper figure 2): CSV files and a PNG plot.

    neobert-pseudo-perplexity --model /ckpt/neobert-hf --texts long_docs.jsonl --max-length 4096 \\
        --output runs/pppl/neobert
    # past the trained length with YaRN (factor 2 over 4096 trained tokens)
    neobert-pseudo-perplexity --model /ckpt/neobert-hf --texts wikimedia/wikipedia --dataset-config \\
        20231101.en --num-texts 200 --max-length 8192 --rope-scaling yarn --rope-factor 2 --output runs/pppl/yarn2
"""

import dataclasses
from pathlib import Path
from typing import List, Optional

from megatron_neobert.cli import DeviceFlag, ProgressFlag
from megatron_neobert.defaults import DEFAULT_BUCKETS
from megatron_neobert.flags import ArgumentParser, add_flags, setting


@dataclasses.dataclass(frozen=True)
class PseudoPerplexityFlags:
    model: Optional[str] = setting(None, "NeoBERT HF folder with its tokenizer", required=True)
    texts: Optional[str] = setting(None, ".jsonl/.json/.parquet/.txt file, or a HF dataset name", required=True)
    text_field: str = setting("text", "field of each record that holds the text")
    dataset_config: Optional[str] = setting(None, "configuration of the HF dataset")
    split: str = setting("train", "split of the HF dataset")
    num_texts: Optional[int] = setting(None, "evaluate only the first N texts (default: all)")
    max_length: int = setting(4096, "texts are truncated to this many tokens")
    min_length: int = setting(2, "shorter texts (in tokens) are skipped")
    batch_size: int = setting(32, "single-mask copies per forward pass")
    buckets: List[int] = setting(list(DEFAULT_BUCKETS), "upper edges of the length buckets (cut at --max-length)")
    rope_scaling: Optional[str] = setting(
        None, "RoPE extension past the trained length (transformers' RoPE types; dynamic is NTK-aware)",
        choices=["linear", "dynamic", "yarn"])
    rope_factor: float = setting(2.0, "--rope-scaling factor")
    original_max_position_embeddings: Optional[int] = setting(
        None, "trained length for --rope-scaling (default: the model's max_length)")
    output: Optional[str] = setting(None, "prefix of the outputs: {output}.csv, .png, _sequences.csv",
                                    required=True)


def build_parser() -> ArgumentParser:
    p = ArgumentParser(description=__doc__)
    add_flags(p, PseudoPerplexityFlags)
    add_flags(p, DeviceFlag)
    add_flags(p, ProgressFlag)
    return p


def plot_title(args, scored: int) -> str:
    """What the plot shows: the model, the texts and how many, the length cap and any RoPE extension."""
    title = (f"Pseudo-perplexity by length: {Path(args.model).resolve().name}\n{scored} texts of "
             f"{Path(args.texts).name}, up to {args.max_length} tokens")
    return title + (f", {args.rope_scaling} RoPE x{args.rope_factor:g}" if args.rope_scaling else "")


def main(argv=None):
    args = build_parser().parse_args(argv)
    import torch
    from transformers import AutoTokenizer

    from megatron_neobert.evaluation.pseudo_perplexity import (bucket_results, load_mlm, load_texts,
                                                               pseudo_perplexities, write_outputs)
    from megatron_neobert.progress import library_bars

    library_bars(not args.no_progress)

    device = args.device or ("cuda" if torch.cuda.is_available() else "cpu")
    scaling = None
    if args.rope_scaling:
        scaling = {"rope_type": args.rope_scaling, "factor": args.rope_factor}
        if args.original_max_position_embeddings:
            scaling["original_max_position_embeddings"] = args.original_max_position_embeddings
    try:  # the texts first: a bad line fails before the model is loaded
        texts = load_texts(args.texts, args.text_field, args.split, args.dataset_config, args.num_texts)
        model = load_mlm(args.model, scaling, device)
        tokenizer = AutoTokenizer.from_pretrained(args.model, trust_remote_code=True)
    except (ValueError, FileNotFoundError) as err:  # a folder that is no NeoBERT model, a bad text file
        raise SystemExit(f"error: {err}") from None
    results = pseudo_perplexities(model, tokenizer, texts, args.max_length, args.batch_size, args.min_length,
                                  progress=not args.no_progress)
    if not results:
        raise SystemExit(f"error: no text of {args.texts} has at least {args.min_length} tokens")
    edges = sorted({e for e in args.buckets if e < args.max_length} | {args.max_length})
    buckets = bucket_results(results, edges)
    for path in write_outputs(results, buckets, args.output, plot_title(args, len(results))):
        print(path)
    for b in buckets:
        print(f"{b['min_length']:>6}-{b['max_length']:<6} {b['sequences']:>5} seqs  pppl {b['pseudo_perplexity']:.3f}")
    return buckets


def cli() -> None:
    """The neobert-pseudo-perplexity command: main()'s results are printed and written, not its exit status."""
    main()
