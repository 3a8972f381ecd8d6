"""Megatron indexed datasets (``.bin`` + ``.idx``) written at corpus scale.

megatron-core's ``IndexedDatasetBuilder`` keeps every sequence length and document index as a Python
object in a list and works out the sequence pointers in a Python loop when it writes the ``.idx``: about
150 bytes and 1 us a sequence, hours and terabytes at a corpus's billions. ``IndexedWriter`` writes the
same bytes from numpy arrays: the documents it is given take 4 bytes a sequence and 8 a document until
the ``.idx`` is written, and the datasets it appends (a merge) take nothing: their indexes are read again,
a chunk at a time, while the ``.idx`` is written.
"""

import shutil
import struct
from typing import Iterator, List, Tuple, Union

import numpy
from megatron.core.datasets.indexed_dataset import DType, get_bin_path, get_idx_path

from megatron_neobert.data.indexed import IndexArrays
from megatron_neobert.megatron_core_compat import index_header

_CHUNK = 1 << 24  # elements per write: the .idx is written in slices, never as one copy of an array


class IndexedWriter:
    """Writes ``bin_path`` as documents or whole datasets are added, and the ``.idx`` at `finalize`."""

    def __init__(self, bin_path: str, dtype) -> None:
        self.dtype = numpy.dtype(dtype)
        self.data_file = open(bin_path, "wb")
        # Each part: (sequence lengths, each document's end in sequences counted from the part's start), or
        # the prefix of a dataset whose index holds them.
        self._parts: List[Union[str, Tuple[numpy.ndarray, numpy.ndarray]]] = []
        self._sequences = self._documents = self._tokens = 0

    def write_tokens(self, tokens: numpy.ndarray) -> None:
        self.data_file.write(numpy.ascontiguousarray(tokens, self.dtype))
        self._tokens += tokens.shape[0]

    def add_documents(self, sequence_lengths: numpy.ndarray, document_sequences: numpy.ndarray) -> None:
        """Index entries for documents whose tokens were written: ``document_sequences`` holds where each
        document's sequences start among ``sequence_lengths``, and their end (n + 1 values from 0; an empty
        document has no sequence)."""
        lengths = numpy.array(sequence_lengths, numpy.int32)
        ends = numpy.array(document_sequences[1:], numpy.int64)
        if len(document_sequences) and (document_sequences[0] != 0 or document_sequences[-1] != lengths.shape[0]):
            raise ValueError(f"document boundaries {document_sequences[0]}..{document_sequences[-1]} do not span "
                             f"the {lengths.shape[0]} sequences given")
        self._parts.append((lengths, ends))
        self._sequences += lengths.shape[0]
        self._documents += ends.shape[0]

    def add_index(self, prefix: str) -> None:
        """A whole dataset appended: its ``.bin`` copied now, its index read when the ``.idx`` is written."""
        index = IndexArrays(get_idx_path(prefix))
        if numpy.dtype(index.dtype) != self.dtype:
            raise ValueError(f"{prefix} holds {numpy.dtype(index.dtype).name} tokens, not {self.dtype.name}")
        with open(get_bin_path(prefix), "rb") as f:
            shutil.copyfileobj(f, self.data_file, 1 << 24)
            self._tokens += f.tell() // self.dtype.itemsize
        self._parts.append(prefix)
        self._sequences += index.sequence_lengths.shape[0]
        self._documents += index.document_indices.shape[0] - 1

    def finalize(self, idx_path: str) -> None:
        """The ``.idx`` as megatron-core's ``_IndexWriter`` writes it: header, sequence lengths (int32),
        pointers (int64 byte offsets: the sequences back to back), document indices (int64, from 0)."""
        self.data_file.close()
        itemsize, offset = self.dtype.itemsize, 0
        with open(idx_path, "wb") as f:
            f.write(index_header() + struct.pack("<QBQQ", 1, DType.code_from_dtype(self.dtype.type),
                                                self._sequences, self._documents + 1))
            for lengths in self._sequence_lengths():
                f.write(lengths)
            for lengths in self._sequence_lengths():
                pointers = numpy.zeros(lengths.shape[0], numpy.int64)
                numpy.cumsum(lengths[:-1], out=pointers[1:], dtype=numpy.int64)
                pointers *= itemsize
                pointers += offset
                offset += int(lengths.sum(dtype=numpy.int64)) * itemsize
                f.write(pointers)
            f.write(numpy.zeros(1, numpy.int64))
            for ends in self._document_ends():
                f.write(ends)
        if offset != self._tokens * itemsize:
            raise ValueError(f"{idx_path}: the index counts {offset // itemsize:,} tokens but the .bin holds "
                             f"{self._tokens:,}")

    def _parts_arrays(self) -> Iterator[Tuple[numpy.ndarray, numpy.ndarray]]:
        """(sequence lengths, document ends counted from the part's first sequence) of each part; a dataset's
        index is mapped again each time."""
        for part in self._parts:
            if isinstance(part, str):
                index = IndexArrays(get_idx_path(part))
                yield index.sequence_lengths, index.document_indices[1:]
            else:
                yield part

    def _sequence_lengths(self) -> Iterator[numpy.ndarray]:
        for lengths, _ in self._parts_arrays():
            for at in range(0, lengths.shape[0], _CHUNK):
                yield numpy.asarray(lengths[at:at + _CHUNK], numpy.int32)

    def _document_ends(self) -> Iterator[numpy.ndarray]:
        """Each document's end in the sequences of the whole dataset."""
        first = 0
        for lengths, ends in self._parts_arrays():
            for at in range(0, ends.shape[0], _CHUNK):
                yield ends[at:at + _CHUNK].astype(numpy.int64) + first
            first += lengths.shape[0]
