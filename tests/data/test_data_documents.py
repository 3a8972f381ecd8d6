"""The corpus's document table (data/datasets/documents.py): worked out once, cached, never re-read from the .bin."""

import os

import numpy
import pytest
from megatron.core.datasets.indexed_dataset import IndexedDatasetBuilder

import megatron_neobert.data.datasets.documents as documents
from megatron_neobert.data.datasets.mlm_dataset import MLMDatasetConfig, build_mlm_datasets
from megatron_neobert.data.indexed import IndexedDataError, open_indexed


def _write(prefix, docs):
    builder = IndexedDatasetBuilder(prefix + ".bin", dtype=numpy.uint16)
    for ids in docs:
        builder.add_document(list(ids), [len(ids)])
    builder.finalize(prefix + ".idx")
    return prefix


def _bodies(n, seed=0):
    """n documents of 1-40 ordinary ids (above the tokenizer's specials)."""
    rng = numpy.random.default_rng(seed)
    return [list(rng.integers(100, 8000, int(rng.integers(1, 40)))) for _ in range(n)]


def _build(tok, prefix, cache, seq=64):
    config = MLMDatasetConfig(random_seed=1234, sequence_length=seq, blend=([prefix], None), split="1,0,0",
                              tokenizer=tok, path_to_cache=cache)
    return build_mlm_datasets(config, [None] * 3)[0]


def _samples(dataset):
    return [{k: v.numpy().copy() for k, v in dataset[i].items()} for i in range(len(dataset))]


def _keep_mtime(path, write):
    """Rewrite a file in place with the same size and modification time: only a reader of its bytes notices."""
    stat = os.stat(path)
    write()
    assert os.path.getsize(path) == stat.st_size
    os.utime(path, ns=(stat.st_atime_ns, stat.st_mtime_ns))


def test_a_second_start_reads_no_document(sample_tokenizer, tmp_path):
    tok = sample_tokenizer
    # Written as a tool whose tokenizer adds [CLS] ... [SEP]: 6,000 documents, more than are sampled.
    prefix = _write(str(tmp_path / "cls_sep"), [[tok.cls_id, *b, tok.sep_id] for b in _bodies(6000)])
    first = _build(tok, prefix, str(tmp_path / "cache"))
    assert first._doc_lead.strides == (0,) and int(first._doc_lead[0]) == 1  # one value, no array per document
    # Zero the .bin's bytes behind the cache's back (same size and time): a start that read the documents
    # again would find no [CLS] and lay the corpus out differently.
    _keep_mtime(prefix + ".bin", lambda: open(prefix + ".bin", "r+b").write(bytes(os.path.getsize(prefix + ".bin"))))
    second = _build(tok, prefix, str(tmp_path / "cache"))
    assert int(second._doc_lead[0]) == 1
    for name in ("documents", "sample_position", "sample_offset", "shuffle_index"):
        assert isinstance(getattr(second, name), numpy.memmap), name
        assert numpy.array_equal(getattr(second, name), getattr(first, name)), name
    assert second.indices is None  # megatron-core's document ids are not kept once the layout exists


def test_sampled_convention_equals_a_scan_of_every_document(sample_tokenizer, tmp_path):
    tok = sample_tokenizer
    bodies = _bodies(9000, seed=1)
    for name, docs in [("eod", [[*b, tok.eod_id] for b in bodies]),
                       ("cls_sep", [[tok.cls_id, *b, tok.sep_id] for b in bodies]),
                       ("plain", bodies)]:
        prefix = _write(str(tmp_path / name), docs)
        dataset = open_indexed(prefix)
        table = documents.corpus_documents(dataset.index, prefix, tok, str(tmp_path / "cache"), build=True)
        assert table.lead.strides == table.trail.strides == (0,), name
        scanned = documents.special_tokens_of(dataset.index, prefix, numpy.arange(len(docs)), tok,
                                              documents.tokens_in_span)
        assert numpy.array_equal(table.lead, scanned[0]) and numpy.array_equal(table.trail, scanned[1]), name
        assert table.lengths(dataset.index).tolist() == [len(b) for b in bodies], name


def test_an_interrupted_scan_resumes_where_it_stopped(sample_tokenizer, tmp_path, monkeypatch):
    tok = sample_tokenizer
    bodies = _bodies(5000, seed=2)
    # A merge of corpora written differently: every document has to be read.
    docs = [[tok.cls_id, *b, tok.sep_id] if i % 3 == 0 else [*b, tok.eod_id] if i % 3 == 1 else b
            for i, b in enumerate(bodies)]
    prefix = _write(str(tmp_path / "mixed"), docs)
    dataset = open_indexed(prefix)
    monkeypatch.setattr(documents, "SCAN_CHUNK", 1000)
    read = []
    scan_chunk = documents.special_tokens_of

    def killed_after_two_chunks(dataset, prefix, docs, tokenizer, reader):
        if reader is documents.tokens_in_span:
            if len(read) == 2:
                raise KeyboardInterrupt  # the job is killed between chunks
            read.append(int(docs[0]))
        return scan_chunk(dataset, prefix, docs, tokenizer, reader)

    monkeypatch.setattr(documents, "special_tokens_of", killed_after_two_chunks)
    with pytest.raises(KeyboardInterrupt):
        documents.corpus_documents(dataset.index, prefix, tok, str(tmp_path / "cache"), build=True)
    read.clear()
    monkeypatch.setattr(documents, "special_tokens_of", lambda *a: (read.append(int(a[2][0])), scan_chunk(*a))[1])
    table = documents.corpus_documents(dataset.index, prefix, tok, str(tmp_path / "cache"), build=True)
    assert read[1:] == [2000, 3000, 4000]  # (the first read is the sample of 4,096 documents)
    assert isinstance(table.lead, numpy.memmap) and isinstance(table.trail, numpy.memmap)
    assert table.lead.tolist() == [int(i % 3 == 0) for i in range(len(docs))]
    assert table.trail.tolist() == [int(i % 3 < 2) for i in range(len(docs))]
    assert table.lengths(dataset.index).tolist() == [len(b) for b in bodies]
    assert not [f for f in os.listdir(tmp_path / "cache") if "partial" in f or "scan" in f]


def test_a_corpus_rewritten_in_place_gets_new_caches(sample_tokenizer, tmp_path):
    tok = sample_tokenizer
    prefix = _write(str(tmp_path / "corpus"), _bodies(300, seed=3))
    before = _samples(_build(tok, prefix, str(tmp_path / "cache")))
    os.utime(prefix + ".idx", ns=(0, 0))  # another modification time for the same files: the same samples
    assert _same(before, _samples(_build(tok, prefix, str(tmp_path / "cache"))))
    _write(prefix, _bodies(300, seed=4))  # new documents at the same path
    again = _samples(_build(tok, prefix, str(tmp_path / "cache")))
    assert _same(_samples(_build(tok, prefix, str(tmp_path / "fresh_cache"))), again)
    assert not _same(before, again)


def _same(samples, others):
    return len(samples) == len(others) and all(numpy.array_equal(a[k], b[k]) for a, b in zip(samples, others)
                                               for k in a)


def test_a_corrupt_index_is_refused_when_the_cache_is_built(sample_tokenizer, tmp_path):
    prefix = _write(str(tmp_path / "corpus"), _bodies(300, seed=5))
    # A sequence pointer that does not follow the lengths: the sizes still agree, so only a full read finds it.
    n_seq = 300
    with open(prefix + ".idx", "r+b") as f:
        f.seek(34 + 4 * n_seq + 8 * 150)
        f.write(numpy.int64(12).tobytes())
    with pytest.raises(IndexedDataError, match=r"corpus.idx: sequence pointers do not follow the lengths"):
        _build(sample_tokenizer, prefix, str(tmp_path / "cache"))


def test_a_rank_without_the_cache_says_where_it_looked(sample_tokenizer, tmp_path):
    prefix = _write(str(tmp_path / "corpus"), _bodies(30, seed=6))
    with pytest.raises(FileNotFoundError, match=r"documents1.json not found: the data cache \(--data-cache-path\) "
                                                r"must be a folder that every rank sees"):
        documents.corpus_documents(open_indexed(prefix).index, prefix, sample_tokenizer, str(tmp_path / "node_local"),
                                   build=False)
