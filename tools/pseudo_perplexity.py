#!/usr/bin/env python
"""Pseudo-perplexity of long texts against sequence length (paper figure 2): CSV files and a PNG plot.

    python tools/pseudo_perplexity.py --model /ckpt/neobert-hf --texts long_docs.jsonl --max_length 4096 \\
        --output runs/pppl/neobert
    # past the trained length with YaRN (factor 2 over 4096 trained tokens)
    python tools/pseudo_perplexity.py --model /ckpt/neobert-hf --texts wikimedia/wikipedia --dataset_config \\
        20231101.en --num_texts 200 --max_length 8192 --rope_scaling yarn --rope_factor 2 --output runs/pppl/yarn2
"""

import argparse
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from megatron_neobert.evaluation.pseudo_perplexity import (DEFAULT_BUCKETS, bucket_results, load_mlm,  # noqa: E402
                                                           load_texts, pseudo_perplexities, write_outputs)


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model", required=True, help="NeoBERT HF folder with its tokenizer")
    p.add_argument("--texts", required=True, help=".jsonl/.json/.parquet/.txt file, or a HF dataset name")
    p.add_argument("--text_field", default="text")
    p.add_argument("--dataset_config", help="configuration of the HF dataset")
    p.add_argument("--split", default="train")
    p.add_argument("--num_texts", type=int, help="evaluate only the first N texts")
    p.add_argument("--max_length", type=int, default=4096, help="texts are truncated to this many tokens")
    p.add_argument("--min_length", type=int, default=2)
    p.add_argument("--batch_size", type=int, default=32, help="single-mask copies per forward pass")
    p.add_argument("--buckets", type=int, nargs="+", default=list(DEFAULT_BUCKETS), help="bucket upper edges")
    p.add_argument("--rope_scaling", choices=["linear", "ntk", "yarn"])
    p.add_argument("--rope_factor", type=float, default=2.0)
    p.add_argument("--original_max_position_embeddings", type=int, help="default: the model's max_length")
    p.add_argument("--device", default=None, help="default: cuda when available")
    p.add_argument("--output", required=True, help="prefix of the outputs: {output}.csv, .png, _sequences.csv")
    p.add_argument("--no_progress", action="store_true")
    return p.parse_args(argv)


def main(argv=None):
    import torch
    from transformers import AutoTokenizer

    args = parse_args(argv)
    device = args.device or ("cuda" if torch.cuda.is_available() else "cpu")
    scaling = None
    if args.rope_scaling:
        scaling = {"type": args.rope_scaling, "factor": args.rope_factor}
        if args.original_max_position_embeddings:
            scaling["original_max_position_embeddings"] = args.original_max_position_embeddings
    model = load_mlm(args.model, scaling, device)
    tokenizer = AutoTokenizer.from_pretrained(args.model, trust_remote_code=True)
    texts = load_texts(args.texts, args.text_field, args.split, args.dataset_config, args.num_texts)
    results = pseudo_perplexities(model, tokenizer, texts, args.max_length, args.batch_size, args.min_length,
                                  progress=not args.no_progress)
    if not results:
        raise SystemExit(f"no text of {args.texts} has at least {args.min_length} tokens")
    edges = sorted({e for e in args.buckets if e < args.max_length} | {args.max_length})
    buckets = bucket_results(results, edges)
    title = Path(args.model).name + (f" ({args.rope_scaling} x{args.rope_factor:g})" if scaling else "")
    for path in write_outputs(results, buckets, args.output, title):
        print(path)
    for b in buckets:
        print(f"{b['min_length']:>6}-{b['max_length']:<6} {b['sequences']:>5} seqs  pppl {b['pseudo_perplexity']:.3f}")
    return buckets


if __name__ == "__main__":
    main()
