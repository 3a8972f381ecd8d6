r"""Make RefinedWeb1024+ / 2048+ style datasets: the documents of at least N tokens.

    neobert-make-length-subset --input-prefix data/refinedweb_content_document \
        --min-tokens 1024 --output-prefix data/refinedweb1024plus_content_document

Reads lengths from the .idx and copies token bytes; no tokenizer needed.
"""

import dataclasses
import sys
from typing import Optional

from megatron_neobert.cli import console_logging, import_megatron_core_quietly
from megatron_neobert.flags import ArgumentParser, add_flags, setting


@dataclasses.dataclass(frozen=True)
class LengthSubsetFlags:
    input_prefix: Optional[str] = setting(None, "existing dataset (no .bin/.idx)", required=True)
    output_prefix: Optional[str] = setting(None, "the subset to write: {prefix}.bin and .idx", required=True)
    min_tokens: Optional[int] = setting(None, "keep documents with at least this many tokens (no [CLS]/[SEP])",
                                        required=True)


def build_parser() -> ArgumentParser:
    parser = ArgumentParser(description=__doc__)
    add_flags(parser, LengthSubsetFlags)
    return parser


@console_logging("%(levelname)s %(message)s")
def main(argv=None) -> int:
    args = build_parser().parse_args(argv)
    import_megatron_core_quietly()  # the data modules import megatron-core
    from megatron_neobert.data.preprocessing.length_subset import make_length_subset

    try:
        stats = make_length_subset(args.input_prefix, args.output_prefix, args.min_tokens)
    except ValueError as err:
        print(f"error: {err}", file=sys.stderr)
        return 1
    print(f"done: {stats.summary()} -> {args.output_prefix}.bin / .idx")
    return 0
