"""Merge indexed datasets (shards) into one: the ``.bin`` files back to back, the indexes joined a chunk at a time
(``IndexedWriter.add_index``: the bytes megatron-core's ``IndexedDatasetBuilder.add_index`` writes, without a
Python object per sequence).

Every input is checked first (``.bin`` size against its ``.idx``, one token dtype, one tokenizer
when they carry a record); the merged pair is written under ``.partial`` names, checked and
renamed, with a record that sums theirs. Inputs that hold no document at all never replace an
existing output.
"""

import logging
from typing import Dict, Optional, Sequence

from megatron.core.datasets.indexed_dataset import DType, get_idx_path

from megatron_neobert.data.indexed import check_indexed, discard_partial, partial_paths, read_header
from megatron_neobert.data.preprocessing.index_writer import IndexedWriter
from megatron_neobert.data.records import publish, read_record

logger = logging.getLogger(__name__)

_SAME = ("tokenizer_type", "tokenizer_model", "vocab_size", "append_eod", "eod_id", "split_sentences")


def merged_record(prefixes: Sequence[str]) -> Optional[Dict]:
    """The record of the merge: the inputs' common tokenizer, their largest id, their documents.
    None when an input has no record (written by another tool)."""
    records = [read_record(p) for p in prefixes]
    if any(r is None for r in records):
        missing = [p for p, r in zip(prefixes, records) if r is None]
        logger.warning("%d input(s) without a tokenizer record (e.g. %s): the merged dataset "
                       "gets none, and the trainer cannot check its token ids", len(missing),
                       missing[0])
        return None
    first = {k: records[0].get(k) for k in _SAME}
    for prefix, record in zip(prefixes, records):
        mine = {k: record.get(k) for k in _SAME}
        if mine != first:
            raise ValueError(f"{prefix} was written with {mine} but {prefixes[0]} with {first}: "
                             "datasets from different tokenizers or sentence splitting cannot be merged")
    return {**first, "max_token_id": max(r["max_token_id"] for r in records),
            "documents": sum(r["documents"] for r in records)}


def merge_datasets(prefixes: Sequence[str], output_prefix: str) -> int:
    """Write ``output_prefix.bin/.idx`` holding the documents of ``prefixes`` in order; returns
    the number of documents."""
    if not prefixes:
        raise ValueError("nothing to merge: no input dataset")
    for prefix in prefixes:
        check_indexed(prefix)
    headers = [read_header(get_idx_path(p)) for p in prefixes]
    codes = {h[1] for h in headers}
    if len(codes) > 1:
        raise ValueError(f"inputs hold different token dtypes {sorted(map(DType.dtype_from_code, codes), key=str)}")
    documents = sum(h[3] - 1 for h in headers)
    if documents == 0:
        raise ValueError(f"the input ({len(prefixes)} datasets, e.g. {prefixes[0]}) holds no "
                         f"document: {output_prefix} is left as it was")
    record = merged_record(prefixes)
    dtype = DType.dtype_from_code(headers[0][1])
    bin_tmp, idx_tmp = partial_paths(output_prefix)
    try:
        writer = IndexedWriter(bin_tmp, dtype)
        for prefix in prefixes:
            writer.add_index(prefix)
        writer.finalize(idx_tmp)
        publish(output_prefix, record)
    except BaseException:
        discard_partial(output_prefix)
        raise
    return documents
