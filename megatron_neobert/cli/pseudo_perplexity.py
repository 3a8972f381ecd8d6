"""Pseudo-perplexity of long texts against sequence length (paper figure 2): CSV files and a PNG plot.

    neobert-pseudo-perplexity --model /ckpt/neobert-hf --texts long_docs.jsonl --max-length 4096 \\
        --output runs/pppl/neobert
    # past the trained length with YaRN (factor 2 over 4096 trained tokens)
    neobert-pseudo-perplexity --model /ckpt/neobert-hf --texts wikimedia/wikipedia --dataset-config \\
        20231101.en --num-texts 200 --max-length 8192 --rope-scaling yarn --rope-factor 2 --output runs/pppl/yarn2
"""

from pathlib import Path

from megatron_neobert.flags import ArgumentParser


def build_parser() -> ArgumentParser:
    from megatron_neobert.defaults import DEFAULT_BUCKETS

    p = ArgumentParser(description=__doc__)
    p.add_argument("--model", required=True, help="NeoBERT HF folder with its tokenizer")
    p.add_argument("--texts", required=True, help=".jsonl/.json/.parquet/.txt file, or a HF dataset name")
    p.add_argument("--text-field", default="text", help="field of each record that holds the text")
    p.add_argument("--dataset-config", help="configuration of the HF dataset")
    p.add_argument("--split", default="train", help="split of the HF dataset")
    p.add_argument("--num-texts", type=int, help="evaluate only the first N texts (default: all)")
    p.add_argument("--max-length", type=int, default=4096, help="texts are truncated to this many tokens")
    p.add_argument("--min-length", type=int, default=2, help="shorter texts (in tokens) are skipped")
    p.add_argument("--batch-size", type=int, default=32, help="single-mask copies per forward pass")
    p.add_argument("--buckets", type=int, nargs="+", default=list(DEFAULT_BUCKETS),
                   help="upper edges of the length buckets (cut at --max-length)")
    p.add_argument("--rope-scaling", choices=["linear", "dynamic", "yarn"],
                   help="RoPE extension past the trained length (transformers' RoPE types; dynamic is NTK-aware)")
    p.add_argument("--rope-factor", type=float, default=2.0, help="--rope-scaling factor")
    p.add_argument("--original-max-position-embeddings", type=int,
                   help="trained length for --rope-scaling (default: the model's max_length)")
    p.add_argument("--device", default=None, help="default: cuda when available, else cpu")
    p.add_argument("--output", required=True, help="prefix of the outputs: {output}.csv, .png, _sequences.csv")
    p.add_argument("--no-progress", action="store_true", help="no progress bar")
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
