"""Checks and safe writing for megatron-core ``.bin/.idx`` indexed datasets.

megatron-core reads the index with asserts and memory-maps the ``.bin`` without checking its size,
so a truncated ``.bin`` surfaces as garbage tokens or a crash deep in training. ``check_sizes``
verifies the pair up front in constant time; ``check_indexed`` also reads the whole index, in
chunks. ``commit_pair`` publishes a pair written under temporary names so an interrupted run never
leaves files that look like a complete dataset.
"""

import os
import struct
from typing import Type

import numpy
from megatron.core.datasets.indexed_dataset import DType, IndexedDataset, get_bin_path, get_idx_path

from megatron_neobert.atomic_write import commit
from megatron_neobert.megatron_core_compat import index_header, rank_zero_without_process_group

PARTIAL_SUFFIX = ".partial"


class IndexedDataError(ValueError):
    """A ``.bin/.idx`` pair that is missing, truncated or inconsistent."""


def token_dtype(vocab_size: int) -> Type[numpy.number]:
    """uint16 below 65,500 entries, else int32: the rule of Megatron-LM's preprocess_data.py."""
    return DType.optimal_dtype(vocab_size)


def check_indexed(prefix: str) -> None:
    """Raise ``IndexedDataError`` unless ``prefix.idx`` and ``prefix.bin`` are consistent."""
    check_indexed_files(get_idx_path(prefix), get_bin_path(prefix))


def check_indexed_files(idx_path: str, bin_path: str, chunk: int = 1 << 22) -> None:
    """Every check: `check_sizes`, then the index arrays themselves (lengths, pointers and document indices agree),
    read through a memory map `chunk` sequences at a time so that memory stays flat at any corpus size."""
    index = check_sizes(idx_path, bin_path)
    lengths, pointers, docs = index.sequence_lengths, index.sequence_pointers, index.document_indices
    for lo in range(0, docs.shape[0], chunk):
        part = docs[max(lo - 1, 0):lo + chunk]
        if numpy.any(part[1:] < part[:-1]):
            raise IndexedDataError(f"{idx_path}: document indices are inconsistent")
    for lo in range(0, lengths.shape[0], chunk):
        length = lengths[lo:lo + chunk]
        if numpy.any(length < 0):
            raise IndexedDataError(f"{idx_path}: negative sequence lengths")
        pointer = pointers[lo:lo + chunk + 1]
        step = numpy.diff(pointer) if pointer.shape[0] > 1 else pointer[:0]
        if numpy.any(step != length[:step.shape[0]].astype(numpy.int64) * index.dtype_size):
            raise IndexedDataError(f"{idx_path}: sequence pointers do not follow the lengths")


class IndexArrays:
    """The arrays of a megatron-core index, memory-mapped (no copy; megatron-core's reader does the same)."""

    def __init__(self, idx_path: str) -> None:
        version, code, n_seq, n_doc = read_header(idx_path)
        if version != 1:
            raise IndexedDataError(f"{idx_path}: unsupported index version {version}")
        try:
            self.dtype_size = DType.size(code)
        except ValueError:
            raise IndexedDataError(f"{idx_path}: unknown token dtype code {code}") from None
        self.dtype = DType.dtype_from_code(code)
        self.dtype_name = numpy.dtype(self.dtype).name
        self.body_bytes = 4 * n_seq + 8 * n_seq + 8 * n_doc
        size = os.path.getsize(idx_path)
        # A multimodal index appends one int8 mode per sequence.
        if size not in (34 + self.body_bytes, 34 + self.body_bytes + n_seq):
            raise IndexedDataError(f"{idx_path} is {size} bytes; {n_seq} sequences and "
                                   f"{n_doc - 1} documents need {34 + self.body_bytes}: truncated or corrupt")
        self.sequence_lengths = mapped(idx_path, numpy.int32, 34, n_seq)
        self.sequence_pointers = mapped(idx_path, numpy.int64, 34 + 4 * n_seq, n_seq)
        self.document_indices = mapped(idx_path, numpy.int64, 34 + 12 * n_seq, n_doc)


def mapped(path: str, dtype, offset: int, count: int) -> numpy.ndarray:
    return numpy.memmap(path, dtype, "r", offset, (count,)) if count else numpy.zeros(0, dtype)


def check_sizes(idx_path: str, bin_path: str) -> IndexArrays:
    """The checks that read a few bytes whatever the corpus's size (every rank, every start): both files exist,
    the header is megatron-core's, the ``.idx`` has the size its counts give, its document indices start at 0
    and end at the last sequence, and the ``.bin`` ends where the last sequence does. Returns the index."""
    for path in (idx_path, bin_path):
        if not os.path.isfile(path):
            raise IndexedDataError(f"{path} not found")
    index = IndexArrays(idx_path)
    lengths, pointers, docs = index.sequence_lengths, index.sequence_pointers, index.document_indices
    n_seq = lengths.shape[0]
    if docs.shape[0] < 1 or docs[0] != 0 or docs[-1] != n_seq:
        raise IndexedDataError(f"{idx_path}: document indices are inconsistent")
    expected = int(pointers[-1]) + int(lengths[-1]) * index.dtype_size if n_seq else 0
    if n_seq and pointers[0] != 0:
        raise IndexedDataError(f"{idx_path}: sequence pointers do not follow the lengths")
    bin_size = os.path.getsize(bin_path)
    if bin_size != expected:
        raise IndexedDataError(
            f"{bin_path} is {bin_size} bytes but {idx_path} describes {expected} bytes "
            f"({n_seq} sequences of {index.dtype_name}): the .bin is truncated or the .idx belongs to another .bin")
    return index


def read_header(idx_path: str):
    """(version, dtype code, sequences, documents + 1) from a megatron-core index header."""
    with open(idx_path, "rb") as f:
        head = f.read(34)
    if len(head) < 34 or head[:9] != index_header():
        raise IndexedDataError(f"{idx_path} is not a megatron-core index (bad header)")
    return struct.unpack("<QBQQ", head[9:34])


def open_indexed(prefix: str, mmap: bool = True) -> IndexedDataset:
    """`check_sizes`, then open with megatron-core's reader. The full check of the index arrays is the MLM
    dataset's, once per corpus (``documents.py``), and the writers'."""
    check_sizes(get_idx_path(prefix), get_bin_path(prefix))
    with rank_zero_without_process_group():  # the data tools read in one process, without a group
        return IndexedDataset(prefix, multimodal=False, mmap=mmap)


def partial_paths(prefix: str):
    """Temporary names for a pair being written: they never end in .bin/.idx."""
    return get_bin_path(prefix) + PARTIAL_SUFFIX, get_idx_path(prefix) + PARTIAL_SUFFIX


def commit_pair(prefix: str) -> None:
    """Check the partial pair, then move it to its final names.

    The old ``.idx`` is removed first and the new ``.idx`` renamed last, so at every instant the
    final names are either absent, the old complete pair minus its index, or the new pair.
    """
    bin_tmp, idx_tmp = partial_paths(prefix)
    check_indexed_files(idx_tmp, bin_tmp)
    if os.path.exists(get_idx_path(prefix)):
        os.remove(get_idx_path(prefix))
    commit(bin_tmp, get_bin_path(prefix))
    commit(idx_tmp, get_idx_path(prefix))


def discard_partial(prefix: str) -> None:
    for path in partial_paths(prefix):
        if os.path.exists(path):
            os.remove(path)


def raw_lengths(index, docs: numpy.ndarray) -> numpy.ndarray:
    """Tokens of the given documents, from the index's sequence pointers (a document's sequences are contiguous
    in the ``.bin``), so that any set of documents costs what it holds, not what the corpus holds."""
    pointers, first_sequence = index.sequence_pointers, index.document_indices
    n_seq = pointers.shape[0]
    if n_seq == 0:
        return numpy.zeros(docs.shape[0], numpy.int64)
    end = int(pointers[-1]) + int(index.sequence_lengths[-1]) * index.dtype_size

    def offset(sequence):  # byte offset of a sequence's start; the end of the data after the last
        return numpy.where(sequence < n_seq, pointers[numpy.minimum(sequence, n_seq - 1)], end)

    return (offset(first_sequence[docs + 1]) - offset(first_sequence[docs])) // index.dtype_size
