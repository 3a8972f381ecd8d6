"""Tokenize RefinedWeb-style data into megatron-core .bin/.idx files (Megatron-LM's flag names).

    neobert-preprocess-data --input 'refinedweb/*.parquet' --output-prefix data/refinedweb \
        --json-keys content --tokenizer-type HuggingFaceTokenizer --tokenizer-model bert-base-uncased --workers 16

writes data/refinedweb_content_document.bin/.idx (one whole document per sequence, one document
per input record) and data/refinedweb_content_document.tokenizer.json. Each input file is first
written as a shard in data/refinedweb_shards/; a killed run started again skips complete shards.

With --split-sentences (as Megatron-LM's: NLTK punkt; pip install nltk and
python -m nltk.downloader punkt_tab), each sentence is one sequence of its document and the
output is data/refinedweb_content_sentence.bin/.idx.

Across nodes, each rank takes every world_size-th file and writes shards only; merge them after:

    # SLURM job array (rank/world size from SLURM_ARRAY_TASK_ID / SLURM_ARRAY_TASK_COUNT)
    sbatch --array=0-63 --wrap "neobert-preprocess-data --input 'rw/*.parquet' \
        --json-keys content --output-prefix data/rw --workers 32"
    # torchrun (rank/world size from RANK / WORLD_SIZE)
    torchrun --nnodes 8 --nproc-per-node 1 ... --no-python neobert-preprocess-data --input 'rw/*.parquet' \
        --json-keys content --output-prefix data/rw --workers 32
    # then, once per key (each rank prints these commands):
    neobert-merge-datasets --shard-dir data/rw_shards --json-key content \
        --output-prefix data/rw_content_document
"""

import dataclasses
import logging
import os
import sys

from megatron_neobert.cli import import_megatron_core_quietly
from megatron_neobert.flags import ArgumentParser, add_flags, parse_given, with_defaults
from megatron_neobert.data.tokenizer import NULL_TOKENIZER, TokenizerSettings, resolve_tokenizer_flags

def rank_from_environment():
    """(rank, world size) of a SLURM job array task or a torchrun process, else (0, 1)."""
    env = os.environ
    if "SLURM_ARRAY_TASK_ID" in env and "SLURM_ARRAY_TASK_COUNT" in env:
        first = int(env.get("SLURM_ARRAY_TASK_MIN", 0))
        return int(env["SLURM_ARRAY_TASK_ID"]) - first, int(env["SLURM_ARRAY_TASK_COUNT"])
    if "RANK" in env and "WORLD_SIZE" in env:
        return int(env["RANK"]), int(env["WORLD_SIZE"])
    return 0, 1


def get_args(argv=None):
    parser = ArgumentParser(description=__doc__)
    group = parser.add_argument_group("input data")
    group.add_argument("--input", nargs="+", required=True,
                       help="Parquet / JSON lines (.gz, .zst) files, globs, folders, or a folder "
                            "saved by datasets.save_to_disk; each file is one shard")
    group.add_argument("--json-keys", nargs="+", default=["text"],
                       help="text field(s) to tokenize, one output dataset per key; as Megatron-LM's default "
                            "(RefinedWeb's field is content)")
    group.add_argument("--split-sentences", action="store_true",
                       help="as Megatron-LM's: split each text into sentences with NLTK punkt "
                            "(needs nltk and its punkt_tab model for --lang), tokenize each on "
                            "its own, one sequence per non-empty sentence; writes "
                            "{prefix}_{key}_sentence instead of _document")
    group.add_argument("--keep-newlines", action="store_true",
                       help="as Megatron-LM's: keep the newlines after sentences in the sentences "
                            "(only with --split-sentences)")
    group.add_argument("--lang", default=None,
                       help="as Megatron-LM's: the punkt model (language) of --split-sentences "
                            "(default: english)")
    group = parser.add_argument_group("tokenizer")
    add_flags(group, TokenizerSettings)
    group.add_argument("--append-eod", action="store_true",
                       help="append the end-of-document token (EOS, else [SEP]) to each non-empty "
                            "document (with --split-sentences: to its last sentence)")
    group = parser.add_argument_group("output data")
    group.add_argument("--output-prefix", required=True,
                       help="writes {prefix}_{key}_document.bin/.idx per --json-keys key "
                            "(_sentence with --split-sentences)")
    group.add_argument("--shard-dir", default=None,
                       help="where per-file shards are kept until merged (default: "
                            "OUTPUT_PREFIX_shards)")
    group = parser.add_argument_group("runtime")
    group.add_argument("--workers", type=int, default=1, help="tokenizer worker processes")
    group.add_argument("--partitions", type=int, default=1,
                       help="input files (shards) tokenized at once, each by workers // "
                            "partitions processes, merged in input order: the bytes never depend "
                            "on it. Megatron-LM's instead deals its input lines into this many "
                            "partition files, round-robin (another document order) unless "
                            "--keep-sequential-samples; so ours equals its output with "
                            "--partitions 1 or --keep-sequential-samples (docs/data.md)")
    group.add_argument("--log-interval", type=int, default=1000,
                       help="log progress every this many documents of a file (0: never)")
    group.add_argument("--chunk-documents", type=int, default=64,
                       help="documents per task sent to a worker")
    group.add_argument("--rank", type=int, default=None,
                       help="this node's share of the files (default: SLURM array task or torchrun "
                            "RANK, else 0)")
    group.add_argument("--world-size", type=int, default=None,
                       help="nodes sharing the files (default: SLURM_ARRAY_TASK_COUNT or torchrun "
                            "WORLD_SIZE, else 1); with more than one, shards are not merged")
    group.add_argument("--no-progress", action="store_true", help="no progress bar")
    given_flags = parse_given(parser, argv)
    args = with_defaults(parser, given_flags)
    for flag, given in (("--keep-newlines", args.keep_newlines), ("--lang", args.lang is not None)):
        if given and not args.split_sentences:
            parser.error(f"{flag} only applies to sentence splitting: add --split-sentences, or "
                         f"drop {flag}")
    args.lang = args.lang or "english"
    if args.tokenizer_type == NULL_TOKENIZER:
        parser.error("--tokenizer-type NullTokenizer takes already tokenized data's ids as they are, at training: "
                     "there is no text for it to tokenize here")
    tokenizer = {f.name: getattr(args, f.name) for f in dataclasses.fields(TokenizerSettings)}
    try:
        vars(args).update(resolve_tokenizer_flags(tokenizer, given_flags))
    except ValueError as err:
        parser.error(str(err))
    env_rank, env_world = rank_from_environment()
    args.rank = env_rank if args.rank is None else args.rank
    args.world_size = env_world if args.world_size is None else args.world_size
    return args


def main(argv=None) -> int:
    args = get_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(levelname)s %(message)s")
    import_megatron_core_quietly()  # the data modules import megatron-core
    from megatron_neobert.data.preprocess import preprocess_data

    try:
        stats = preprocess_data(
            args.input, args.output_prefix, args.json_keys, args.tokenizer_type,
            args.tokenizer_model, args.workers, args.chunk_documents,
            progress=not args.no_progress, append_eod=args.append_eod,
            log_interval=args.log_interval, partitions=args.partitions, rank=args.rank,
            world_size=args.world_size, shard_dir=args.shard_dir,
            split_sentences=args.split_sentences, keep_newlines=args.keep_newlines, lang=args.lang)
    except ValueError as err:  # DataInputError, IndexedDataError, tokenizer errors, empty input
        print(f"error: {err}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        print("interrupted: complete shards are kept, the output is untouched; run again to "
              "resume", file=sys.stderr)
        return 130
    print(f"done: {stats.summary()}")
    for key, prefix in stats.outputs.items():
        print(f"  {key}: {prefix}" + ("" if args.world_size > 1 else ".bin / .idx"))
    return 0
