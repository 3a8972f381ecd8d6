"""Length subsets (RefinedWeb1024+ / 2048+) cut from an existing ``.bin/.idx`` without tokenizing.

Stage 2 of the NeoBERT recipe draws 40% of each batch from documents of at least 1024 tokens and
40% from documents of at least 2048 tokens. Document lengths are read from the index; the selected
documents' bytes are copied as they are (sequence structure included), in corpus order.
"""

import logging
from dataclasses import dataclass

import numpy
from megatron.core.datasets.indexed_dataset import IndexedDatasetBuilder

from megatron_neobert.data.indexed import commit_pair, discard_partial, open_indexed, partial_paths

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
        commit_pair(output_prefix)
    except BaseException:
        discard_partial(output_prefix)
        raise
    stats = SubsetStats(len(keep), int(lengths[keep].sum()), len(lengths), int(lengths.sum()))
    logger.info("%s >= %d tokens: %s", output_prefix, min_tokens, stats.summary())
    return stats
