r"""Merge megatron-core .bin/.idx datasets (e.g. the shards of neobert-preprocess-data run on
several nodes) into one, in order: the bytes megatron-core's IndexedDatasetBuilder.add_index writes.

    neobert-merge-datasets --shard-dir data/rw_shards --json-key content \
        --output-prefix data/rw_content_document
    neobert-merge-datasets --input data/a_content_document data/b_content_document \
        --output-prefix data/ab_content_document

--shard-dir takes the shards of one --json-keys key listed there, refusing while one is missing;
the output is written atomically and refused when the inputs hold no document or come from different tokenizers.
"""

import dataclasses
import sys
from typing import List, Optional

from megatron_neobert.cli import import_megatron_core_quietly
from megatron_neobert.flags import ArgumentParser, add_flags, setting


@dataclasses.dataclass(frozen=True)
class MergeFlags:
    input: Optional[List[str]] = setting(None, "dataset prefixes, merged in this order", one_of="source")
    shard_dir: Optional[str] = setting(None, "a folder of preprocess_data.py shards", one_of="source")
    json_key: str = setting("content", "the key of the shards to merge")
    output_prefix: Optional[str] = setting(None, "writes {prefix}.bin / .idx, as Megatron-LM's merge_datasets.py: "
                                                 "give the dataset's whole name, e.g. data/rw_content_document",
                                           required=True)


def main(argv=None) -> int:
    parser = ArgumentParser(description=__doc__)
    add_flags(parser, MergeFlags)
    args = parser.parse_args(argv)
    import_megatron_core_quietly()  # the data modules import megatron-core
    from megatron_neobert.data.preprocessing.merge import merge_datasets
    from megatron_neobert.data.preprocessing.preprocess import shards_of

    try:
        prefixes = args.input or shards_of(args.shard_dir, args.json_key)
        documents = merge_datasets(prefixes, args.output_prefix)
    except ValueError as err:  # IndexedDataError, different tokenizers, nothing to merge
        print(f"error: {err}", file=sys.stderr)
        return 1
    print(f"merged {len(prefixes)} datasets, {documents:,} documents: {args.output_prefix}.bin / .idx")
    return 0
