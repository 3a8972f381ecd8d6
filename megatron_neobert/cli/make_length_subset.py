"""Make RefinedWeb1024+ / 2048+ style datasets: the documents of at least N tokens.

    neobert-make-length-subset --input-prefix data/refinedweb_content_document \
        --min-tokens 1024 --output-prefix data/refinedweb1024plus_content_document

Reads lengths from the .idx and copies token bytes; no tokenizer needed.
"""

import logging
import sys

from megatron_neobert.cli import import_megatron_core_quietly
from megatron_neobert.flags import ArgumentParser


def build_parser() -> ArgumentParser:
    parser = ArgumentParser(description=__doc__)
    parser.add_argument("--input-prefix", required=True, help="existing dataset (no .bin/.idx)")
    parser.add_argument("--output-prefix", required=True, help="the subset to write: {prefix}.bin and .idx")
    parser.add_argument("--min-tokens", type=int, required=True,
                        help="keep documents with at least this many tokens (no [CLS]/[SEP])")
    return parser


def main(argv=None) -> int:
    args = build_parser().parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(levelname)s %(message)s")
    import_megatron_core_quietly()  # the data modules import megatron-core
    from megatron_neobert.data.length_subset import make_length_subset

    try:
        stats = make_length_subset(args.input_prefix, args.output_prefix, args.min_tokens)
    except ValueError as err:
        print(f"error: {err}", file=sys.stderr)
        return 1
    print(f"done: {stats.summary()} -> {args.output_prefix}.bin / .idx")
    return 0
