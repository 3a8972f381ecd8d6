"""Checks and safe writing for megatron-core ``.bin/.idx`` indexed datasets.

megatron-core reads the index with asserts and memory-maps the ``.bin`` without checking its size,
so a truncated ``.bin`` surfaces as garbage tokens or a crash deep in training. ``check_indexed``
verifies the pair up front. ``commit_pair`` publishes a pair written under temporary names so an
interrupted run never leaves files that look like a complete dataset.
"""

import os
import struct
from typing import Type

import numpy
from megatron.core.datasets.indexed_dataset import (
    _INDEX_HEADER, DType, IndexedDataset, get_bin_path, get_idx_path)

PARTIAL_SUFFIX = ".partial"


class IndexedDataError(ValueError):
    """A ``.bin/.idx`` pair that is missing, truncated or inconsistent."""


def token_dtype(vocab_size: int) -> Type[numpy.number]:
    """uint16 below 65,500 entries, else int32: the rule of Megatron-LM's preprocess_data.py."""
    return DType.optimal_dtype(vocab_size)


def check_indexed(prefix: str) -> None:
    """Raise ``IndexedDataError`` unless ``prefix.idx`` and ``prefix.bin`` are consistent."""
    check_indexed_files(get_idx_path(prefix), get_bin_path(prefix))


def check_indexed_files(idx_path: str, bin_path: str) -> None:
    for path in (idx_path, bin_path):
        if not os.path.isfile(path):
            raise IndexedDataError(f"{path} not found")
    idx_size = os.path.getsize(idx_path)
    version, code, n_seq, n_doc = read_header(idx_path)
    if version != 1:
        raise IndexedDataError(f"{idx_path}: unsupported index version {version}")
    try:
        itemsize = DType.size(code)
    except ValueError:
        raise IndexedDataError(f"{idx_path}: unknown token dtype code {code}") from None
    body = 4 * n_seq + 8 * n_seq + 8 * n_doc
    # A multimodal index appends one int8 mode per sequence.
    if idx_size not in (34 + body, 34 + body + n_seq):
        raise IndexedDataError(f"{idx_path} is {idx_size} bytes; {n_seq} sequences and "
                               f"{n_doc - 1} documents need {34 + body}: truncated or corrupt")
    lengths = numpy.fromfile(idx_path, dtype=numpy.int32, count=n_seq, offset=34)
    pointers = numpy.fromfile(idx_path, dtype=numpy.int64, count=n_seq, offset=34 + 4 * n_seq)
    docs = numpy.fromfile(idx_path, dtype=numpy.int64, count=n_doc, offset=34 + 12 * n_seq)
    if n_doc < 1 or docs[0] != 0 or docs[-1] != n_seq or numpy.any(numpy.diff(docs) < 0):
        raise IndexedDataError(f"{idx_path}: document indices are inconsistent")
    if numpy.any(lengths < 0):
        raise IndexedDataError(f"{idx_path}: negative sequence lengths")
    expected = int(lengths.astype(numpy.int64).sum()) * itemsize
    if n_seq and (pointers[0] != 0 or numpy.any(pointers[1:] != numpy.cumsum(
            lengths[:-1].astype(numpy.int64)) * itemsize)):
        raise IndexedDataError(f"{idx_path}: sequence pointers do not follow the lengths")
    bin_size = os.path.getsize(bin_path)
    if bin_size != expected:
        raise IndexedDataError(
            f"{bin_path} is {bin_size} bytes but {idx_path} describes {expected} bytes "
            f"({n_seq} sequences of {numpy.dtype(DType.dtype_from_code(code)).name}): the .bin is "
            "truncated or the .idx belongs to another .bin")


def read_header(idx_path: str):
    """(version, dtype code, sequences, documents + 1) from a megatron-core index header."""
    with open(idx_path, "rb") as f:
        head = f.read(34)
    if len(head) < 34 or head[:9] != _INDEX_HEADER:
        raise IndexedDataError(f"{idx_path} is not a megatron-core index (bad header)")
    return struct.unpack("<QBQQ", head[9:34])


def open_indexed(prefix: str, mmap: bool = True) -> IndexedDataset:
    """Check, then open with megatron-core's reader."""
    check_indexed(prefix)
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
    os.replace(bin_tmp, get_bin_path(prefix))
    os.replace(idx_tmp, get_idx_path(prefix))


def discard_partial(prefix: str) -> None:
    for path in partial_paths(prefix):
        if os.path.exists(path):
            os.remove(path)
