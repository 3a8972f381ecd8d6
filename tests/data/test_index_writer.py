"""IndexedWriter writes the bytes megatron-core's IndexedDatasetBuilder writes, from arrays and from whole datasets."""

import numpy
import pytest
from data_helpers import file_bytes
from megatron.core.datasets.indexed_dataset import IndexedDatasetBuilder

from megatron_neobert.data.preprocessing import index_writer
from megatron_neobert.data.preprocessing.index_writer import IndexedWriter


def random_documents(seed, n):
    """Documents of 0-3 sequences of 1-20 tokens (an empty document has no sequence, as megatron-core writes it)."""
    rng = numpy.random.default_rng(seed)
    return [[rng.integers(0, 60_000, rng.integers(1, 20), dtype=numpy.uint16) for _ in range(rng.integers(0, 4))]
            for _ in range(n)]


def megatron_core_dataset(prefix, documents):
    builder = IndexedDatasetBuilder(prefix + ".bin", dtype=numpy.uint16)
    for sequences in documents:
        builder.add_document(numpy.concatenate(sequences) if sequences else [], [len(s) for s in sequences])
    builder.finalize(prefix + ".idx")


@pytest.fixture
def small_chunks(monkeypatch):
    monkeypatch.setattr(index_writer, "_CHUNK", 7)  # every pass over the arrays in several slices


def test_documents_written_in_parts_are_megatron_cores_bytes(small_chunks, tmp_path):
    documents = random_documents(0, 50)
    megatron_core_dataset(str(tmp_path / "reference"), documents)
    writer = IndexedWriter(str(tmp_path / "ours.bin"), numpy.uint16)
    for part in (documents[:20], [], documents[20:21], documents[21:]):
        lengths = [len(s) for d in part for s in d]
        writer.write_tokens(numpy.concatenate([s for d in part for s in d] or [numpy.zeros(0, numpy.uint16)]))
        writer.add_documents(numpy.array(lengths, numpy.int64), numpy.cumsum([0] + [len(d) for d in part]))
    writer.finalize(str(tmp_path / "ours.idx"))
    assert file_bytes(str(tmp_path / "ours")) == file_bytes(str(tmp_path / "reference"))


def test_a_merge_is_megatron_cores_add_index(small_chunks, tmp_path):
    shards = [str(tmp_path / f"shard{i}") for i in range(4)]
    for i, (shard, n) in enumerate(zip(shards, (30, 0, 1, 25))):  # an empty shard among them
        megatron_core_dataset(shard, random_documents(i, n))
    for name, writer in (("reference", IndexedDatasetBuilder(str(tmp_path / "reference.bin"), dtype=numpy.uint16)),
                         ("ours", IndexedWriter(str(tmp_path / "ours.bin"), numpy.uint16))):
        for shard in shards:
            writer.add_index(shard)
        writer.finalize(str(tmp_path / f"{name}.idx"))
    assert file_bytes(str(tmp_path / "ours")) == file_bytes(str(tmp_path / "reference"))


def test_tokens_the_index_does_not_count_are_refused(tmp_path):
    writer = IndexedWriter(str(tmp_path / "ours.bin"), numpy.uint16)
    writer.write_tokens(numpy.arange(5, dtype=numpy.uint16))
    writer.add_documents(numpy.array([4]), numpy.array([0, 1]))
    with pytest.raises(ValueError, match=r"ours.idx: the index counts 4 tokens but the .bin holds 5"):
        writer.finalize(str(tmp_path / "ours.idx"))
    with pytest.raises(ValueError, match="do not span the 2 sequences given"):
        writer.add_documents(numpy.array([1, 2]), numpy.array([0, 1]))
