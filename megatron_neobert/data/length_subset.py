"""Length subsets (RefinedWeb1024+ / 2048+) cut from an existing ``.bin/.idx`` without tokenizing.

Stage 2 of the NeoBERT recipe draws 40% of each batch from documents of at least 1024 tokens and
40% from documents of at least 2048 tokens. Document lengths are read from the index; the selected
documents' bytes are copied as they are (sequence structure included), in corpus order.

The subset's record (``{prefix}.tokenizer.json``) keeps the corpus's, plus its document count, and
``{prefix}.source_ids.npy`` the corpus id of each document, so the MLM dataset splits a subset by
the corpus's own train/valid/test ranges: in a blend of a corpus and its subsets, a document held
out for validation is never trained on through another component.
"""

import logging
import os
from dataclasses import dataclass

import numpy
from megatron.core.datasets.indexed_dataset import IndexedDatasetBuilder

from megatron_neobert.data.indexed import discard_partial, open_indexed, partial_paths
from megatron_neobert.data.records import publish, read_record

SOURCE_IDS_SUFFIX = ".source_ids.npy"

logger = logging.getLogger(__name__)


@dataclass
class SubsetStats:
    documents: int
    tokens: int
    total_documents: int
    total_tokens: int

    def summary(self) -> str:
        return (f"kept {self.documents:,} of {self.total_documents:,} documents, "
                f"{self.tokens:,} of {self.total_tokens:,} tokens")


def document_lengths(dataset) -> numpy.ndarray:
    """Tokens per document (a document may span several sequences, e.g. split sentences)."""
    cumulative = numpy.concatenate([[0], numpy.cumsum(dataset.sequence_lengths, dtype=numpy.int64)])
    return cumulative[dataset.document_indices[1:]] - cumulative[dataset.document_indices[:-1]]


def make_length_subset(input_prefix: str, output_prefix: str, min_tokens: int) -> SubsetStats:
    """Write ``output_prefix.bin/.idx`` holding the documents with at least ``min_tokens`` tokens."""
    if min_tokens < 1:
        raise ValueError(f"min_tokens must be >= 1, got {min_tokens}")
    dataset = open_indexed(input_prefix)
    lengths = document_lengths(dataset)
    keep = numpy.flatnonzero(lengths >= min_tokens)
    os.makedirs(os.path.dirname(output_prefix) or ".", exist_ok=True)  # as preprocess_data.py does
    bin_tmp, idx_tmp = partial_paths(output_prefix)
    doc_index = dataset.document_indices
    try:
        builder = IndexedDatasetBuilder(bin_tmp, dtype=dataset.index.dtype)
        for d in keep:
            first, last = int(doc_index[d]), int(doc_index[d + 1])
            seq_lengths = dataset.sequence_lengths[first:last]
            # Sequences of one document are contiguous in the .bin: one read covers them all.
            tokens = dataset.get(first, 0, int(lengths[d]))
            builder.add_document(tokens, seq_lengths.tolist())
        builder.finalize(idx_tmp)
        # The ids first: a subset with a record always has them. A subset of a subset points
        # to the corpus.
        source = read_record(input_prefix) or {}
        ids, corpus_size = keep.astype(numpy.int64), len(lengths)
        if os.path.isfile(input_prefix + SOURCE_IDS_SUFFIX) and "source_documents" in source:
            ids = numpy.load(input_prefix + SOURCE_IDS_SUFFIX)[keep]
            corpus_size = source["source_documents"]
        tmp = output_prefix + SOURCE_IDS_SUFFIX + ".partial.npy"
        numpy.save(tmp, ids)
        os.replace(tmp, output_prefix + SOURCE_IDS_SUFFIX)
        publish(output_prefix, {**source, "documents": int(keep.size),
                                "source_documents": int(corpus_size)})
    except BaseException:
        discard_partial(output_prefix)
        raise
    stats = SubsetStats(len(keep), int(lengths[keep].sum()), len(lengths), int(lengths.sum()))
    logger.info("%s >= %d tokens: %s", output_prefix, min_tokens, stats.summary())
    return stats
