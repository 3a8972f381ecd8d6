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
from megatron.core.datasets.indexed_dataset import get_bin_path

from megatron_neobert.atomic_write import atomic_path
from megatron_neobert.data.indexed import discard_partial, mapped, open_indexed, partial_paths, raw_lengths
from megatron_neobert.data.preprocessing.index_writer import IndexedWriter
from megatron_neobert.data.records import SOURCE_IDS_SUFFIX, publish, read_record
from megatron_neobert.progress import progress_bar

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


def _concatenated_ranges(starts: numpy.ndarray, counts: numpy.ndarray) -> numpy.ndarray:
    """starts[0] .. starts[0]+counts[0]-1, then starts[1] .., as one int64 array without a loop."""
    total = int(counts.sum())
    offsets = numpy.repeat(starts.astype(numpy.int64) - (numpy.cumsum(counts) - counts), counts)
    return offsets + numpy.arange(total, dtype=numpy.int64)


def make_length_subset(input_prefix: str, output_prefix: str, min_tokens: int, progress: bool = True,
                       documents_per_step: int = 1 << 20, tokens_per_write: int = 1 << 24) -> SubsetStats:
    """Write ``output_prefix.bin/.idx`` holding the documents with at least ``min_tokens`` tokens.

    A million documents at a time: their lengths come from the index and the kept ones' index entries are appended
    in bulk. Their tokens are copied a run of adjacent kept documents at a time (a slice of the ``.bin``, written
    in pieces of at most ``tokens_per_write``): a Python step per run, so at most one per ``min_tokens`` tokens."""
    if min_tokens < 1:
        raise ValueError(f"min_tokens must be >= 1, got {min_tokens}")
    dataset = open_indexed(input_prefix)
    index = dataset.index
    n_docs = index.document_indices.shape[0] - 1
    bin_path = get_bin_path(input_prefix)
    # (a plain array view: slicing a memmap subclass costs a few microseconds a run more)
    corpus = mapped(bin_path, index.dtype, 0, os.path.getsize(bin_path) // index.dtype_size).view(numpy.ndarray)
    os.makedirs(os.path.dirname(output_prefix) or ".", exist_ok=True)  # as preprocess_data.py does
    bin_tmp, idx_tmp = partial_paths(output_prefix)
    kept, tokens, kept_tokens, kept_docs = [], 0, 0, 0
    try:
        writer = IndexedWriter(bin_tmp, index.dtype)
        # The bar counts the documents read; how many were kept goes beside it.
        bar = progress_bar(desc=f"documents read for >= {min_tokens} tokens", total=n_docs, enabled=progress,
                           unit="doc")
        for lo in range(0, n_docs, documents_per_step):
            docs = numpy.arange(lo, min(n_docs, lo + documents_per_step))
            lengths = raw_lengths(index, docs)
            tokens += int(lengths.sum())
            keep = docs[lengths >= min_tokens]
            lengths = lengths[lengths >= min_tokens]
            kept.append(keep)
            kept_tokens += int(lengths.sum())
            _append_documents(writer, index, corpus, keep, lengths, tokens_per_write)
            kept_docs += keep.size
            bar.set_postfix(kept=f"{kept_docs:,}")
            bar.update(docs.shape[0])
        bar.close()
        writer.finalize(idx_tmp)
        keep = numpy.concatenate(kept) if kept else numpy.zeros(0, numpy.int64)
        # The ids first: a subset with a record always has them. A subset of a subset points
        # to the corpus.
        source = read_record(input_prefix) or {}
        ids, corpus_size = keep.astype(numpy.int64), n_docs
        if os.path.isfile(input_prefix + SOURCE_IDS_SUFFIX) and "source_documents" in source:
            ids = numpy.load(input_prefix + SOURCE_IDS_SUFFIX, mmap_mode="r")[keep]
            corpus_size = source["source_documents"]
        with atomic_path(output_prefix + SOURCE_IDS_SUFFIX) as tmp:
            numpy.save(tmp, ids)
        publish(output_prefix, {**source, "documents": int(keep.size),
                                "source_documents": int(corpus_size)})
    except BaseException:
        discard_partial(output_prefix)
        raise
    stats = SubsetStats(int(keep.size), kept_tokens, n_docs, tokens)
    logger.info("%s >= %d tokens: %s", output_prefix, min_tokens, stats.summary())
    return stats


def _append_documents(writer: IndexedWriter, index, corpus: numpy.ndarray, docs: numpy.ndarray,
                      lengths: numpy.ndarray, tokens_per_write: int) -> None:
    """The documents' tokens and index entries appended to the writer. A document's sequences are contiguous in
    the ``.bin``, and so are adjacent documents."""
    if not docs.size:
        return
    first, last = index.document_indices[docs], index.document_indices[docs + 1]
    starts = index.sequence_pointers[first] // index.dtype_size
    ends = starts + lengths
    run = numpy.concatenate([[0], numpy.flatnonzero(starts[1:] != ends[:-1]) + 1, [docs.size]])
    for run_start, run_end in zip(starts[run[:-1]].tolist(), ends[run[1:] - 1].tolist()):
        for at in range(run_start, run_end, tokens_per_write):
            writer.write_tokens(corpus[at:min(run_end, at + tokens_per_write)])
    sequences = last - first
    writer.add_documents(index.sequence_lengths[_concatenated_ranges(first, sequences)],
                         numpy.concatenate([[0], numpy.cumsum(sequences)]))
