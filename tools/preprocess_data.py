"""Tokenize RefinedWeb-style data into megatron-core .bin/.idx files (Megatron-LM's flag names).

    python tools/preprocess_data.py --input 'refinedweb/*.parquet' --output-prefix data/refinedweb \
        --tokenizer-type HuggingFaceTokenizer --tokenizer-model bert-base-uncased --workers 16

writes data/refinedweb_content_document.bin/.idx (one whole document per sequence).
"""

import logging
import os
import sys

sys.path.insert(0, os.path.abspath(os.path.join(os.path.dirname(__file__), os.pardir)))

from megatron_neobert.cli import ArgumentParser  # noqa: E402
from megatron_neobert.data.tokenizer import TOKENIZER_TYPES  # noqa: E402


def get_args(argv=None):
    parser = ArgumentParser(description=__doc__)
    group = parser.add_argument_group("input data")
    group.add_argument("--input", nargs="+", required=True,
                       help="Parquet / JSON lines (.gz, .zst) files, globs, folders, or a folder "
                            "saved by datasets.save_to_disk; each file is one partition")
    group.add_argument("--json-keys", nargs="+", default=["content"],
                       help="text field(s) to tokenize; one output dataset per key")
    group = parser.add_argument_group("tokenizer")
    group.add_argument("--tokenizer-type", default="HuggingFaceTokenizer", choices=TOKENIZER_TYPES,
                       help="as Megatron-LM's")
    group.add_argument("--tokenizer-model", default="bert-base-uncased",
                       help="Hugging Face name or folder, or a SentencePiece .model file")
    group = parser.add_argument_group("output data")
    group.add_argument("--output-prefix", required=True,
                       help="writes {prefix}_{key}_document.bin/.idx per --json-keys key")
    group = parser.add_argument_group("runtime")
    group.add_argument("--workers", type=int, default=1, help="tokenizer worker processes")
    group.add_argument("--chunk-documents", type=int, default=64,
                       help="documents per task sent to a worker")
    group.add_argument("--no-progress", action="store_true", help="no progress bar")
    return parser.parse_args(argv)


def main(argv=None) -> int:
    args = get_args(argv)
    from megatron_neobert.data.preprocess import preprocess_data

    logging.basicConfig(level=logging.INFO, format="%(levelname)s %(message)s")
    try:
        stats = preprocess_data(args.input, args.output_prefix, args.json_keys,
                                args.tokenizer_type, args.tokenizer_model, args.workers,
                                args.chunk_documents, progress=not args.no_progress)
    except ValueError as err:  # DataInputError, IndexedDataError, tokenizer errors
        print(f"error: {err}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        print("interrupted: no output written", file=sys.stderr)
        return 130
    print(f"done: {stats.summary()}")
    for key, prefix in stats.outputs.items():
        print(f"  {key}: {prefix}.bin / .idx")
    return 0


if __name__ == "__main__":
    sys.exit(main())
