"""Helpers shared by the data tests."""

import os

import numpy


def read_documents(prefix):
    from megatron_neobert.data.indexed import open_indexed
    from megatron_neobert.data.length_subset import document_lengths
    ds = open_indexed(prefix)
    lengths = document_lengths(ds)
    first = ds.document_indices[:-1]
    return [numpy.array(ds.get(int(first[d]), 0, int(lengths[d]))) for d in range(len(lengths))]


def file_bytes(prefix):
    return [open(prefix + ext, "rb").read() for ext in (".bin", ".idx")]


def listing(folder):
    return sorted(os.listdir(folder))
