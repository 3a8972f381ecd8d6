"""Data-pipeline benchmark on the built-in sample corpus (or any Parquet file), in one run:

1. preprocessing throughput: preprocess_data with N workers against a plain single-process loop
   calling the same tokenizer document by document;
2. the share of real (non-pad) tokens per batch, packed against padded samples, at one length.

    python tools/benchmark_data.py [--corpus X.parquet] [--tokenizer-model DIR] [--workers 2]
"""

import os
import sys
import tempfile
import time

os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")  # one thread per process, fair counts
sys.path.insert(0, os.path.abspath(os.path.join(os.path.dirname(__file__), os.pardir)))

from megatron_neobert.cli import ArgumentParser  # noqa: E402
from megatron_neobert.data.assets import SAMPLE_CORPUS, SAMPLE_TOKENIZER  # noqa: E402


def real_token_share(prefix, tokenizer, seq_length, packed, micro_batch_size):
    from megatron_neobert.data.loader import build_data_loader
    from megatron_neobert.data.mlm_dataset import MLMDatasetConfig, build_mlm_datasets
    config = MLMDatasetConfig(random_seed=1234, sequence_length=seq_length, blend=([prefix], None),
                              split="1,0,0", tokenizer=tokenizer, packed=packed,
                              path_to_cache=os.path.join(os.path.dirname(prefix), "cache"))
    train = build_mlm_datasets(config, [None, None, None])[0]
    real = total = batches = 0
    for batch in build_data_loader(train, micro_batch_size, num_workers=0, drop_last=False):
        tokens = batch["tokens"]
        mask = batch.get("attention_mask")
        real += int(mask.sum()) if mask is not None else int((tokens != tokenizer.pad_id).sum())
        total += tokens.numel()
        batches += 1
    return real / total, len(train), batches


def main(argv=None):
    parser = ArgumentParser(description=__doc__)
    parser.add_argument("--corpus", default=SAMPLE_CORPUS, help="RefinedWeb-style Parquet file to tokenize")
    parser.add_argument("--tokenizer-type", default="HuggingFaceTokenizer", help="as Megatron-LM's")
    parser.add_argument("--tokenizer-model", default=SAMPLE_TOKENIZER, help="Hugging Face name or folder")
    parser.add_argument("--workers", type=int, default=2, help="tokenizer worker processes")
    parser.add_argument("--seq-length", type=int, default=1024, help="sequence length of the batches compared")
    parser.add_argument("--micro-batch-size", type=int, default=8, help="sequences per batch")
    parser.add_argument("--repeats", type=int, default=3,
                        help="best of N timings (the cores may be shared with other work)")
    args = parser.parse_args(argv)

    import pyarrow.parquet as pq
    from megatron_neobert.data.preprocess import preprocess_data
    from megatron_neobert.data.tokenizer import build_tokenizer

    tokenizer = build_tokenizer(args.tokenizer_type, args.tokenizer_model)
    texts = pq.read_table(args.corpus, columns=["content"]).column("content").to_pylist()
    plain_seconds = float("inf")
    for _ in range(args.repeats):
        start = time.perf_counter()
        plain_tokens = sum(len(tokenizer.tokenize(text)) for text in texts)
        plain_seconds = min(plain_seconds, time.perf_counter() - start)

    with tempfile.TemporaryDirectory() as tmp:
        runs = [preprocess_data([args.corpus], os.path.join(tmp, "bench"), ["content"],
                                args.tokenizer_type, args.tokenizer_model, args.workers,
                                progress=False) for _ in range(args.repeats)]
        stats = min(runs, key=lambda r: r.seconds)
        assert stats.tokens == plain_tokens, (stats.tokens, plain_tokens)
        prefix = stats.outputs["content"]
        packed = real_token_share(prefix, tokenizer, args.seq_length, True, args.micro_batch_size)
        padded = real_token_share(prefix, tokenizer, args.seq_length, False, args.micro_batch_size)

    print(f"\ncorpus: {args.corpus} ({len(texts):,} documents, {plain_tokens:,} tokens); "
          f"{os.cpu_count()} CPU cores, load average {os.getloadavg()[0]:.1f}; "
          f"best of {args.repeats}")
    print("\n1. preprocessing throughput (same tokenizer, same tokens)")
    print(f"   {'plain loop, 1 process':<38}{plain_tokens / plain_seconds:>12,.0f} tokens/s"
          f"  ({plain_seconds:.2f} s, tokenizing only)")
    print(f"   {f'preprocess_data, {args.workers} workers':<38}{stats.tokens_per_second:>12,.0f} "
          f"tokens/s  ({stats.seconds:.2f} s, reading + tokenizing + writing .bin/.idx)")
    print(f"   speed-up: {stats.tokens_per_second / (plain_tokens / plain_seconds):.2f}x")
    print(f"\n2. real (non-pad) tokens per batch at length {args.seq_length}, "
          f"micro batch {args.micro_batch_size}, one epoch")
    print(f"   {'mode':<10}{'real tokens':>12}{'samples':>10}{'batches':>10}")
    for name, (share, samples, batches) in (("packed", packed), ("padded", padded)):
        print(f"   {name:<10}{share:>12.1%}{samples:>10,}{batches:>10,}")
    print(f"   padded mode needs {padded[1] / packed[1]:.2f}x the samples for the same tokens")


if __name__ == "__main__":
    main()
