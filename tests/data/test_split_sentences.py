"""--split-sentences / --keep-newlines / --lang (Megatron-LM's) in tools/preprocess_data.py.

No model is downloaded: a punkt model is trained on the sample corpus and written as punkt_tab
files under a private NLTK data folder put on nltk's search path.
"""

import json
import os
import sys

import numpy
import pytest
from data_helpers import file_bytes, listing, megatron_lm_pair, read_documents, write_jsonl

from megatron_neobert.data.assets import SAMPLE_TOKENIZER
from megatron_neobert.data.preprocessing.preprocess import preprocess_data

nltk = pytest.importorskip("nltk")
from nltk.tokenize import punkt  # noqa: E402

NEWLINES_TEXT = ("Readline configuration is easy. It loads the module.\nThen it stops.\n\n"
                 "The history file is kept. Delete it to start again.  Done.")


@pytest.fixture(scope="session")
def punkt_root(corpus_slice, tmp_path_factory):
    """An NLTK data folder holding tokenizers/punkt_tab/english, trained on the corpus."""
    trainer = punkt.PunktTrainer()
    trainer.train("\n\n".join(corpus_slice[1][:60]), finalize=True)
    root = str(tmp_path_factory.mktemp("nltk_data"))
    nltk.data.path.insert(0, root)  # nltk writes only under its data path
    os.makedirs(os.path.join(root, "tokenizers", "punkt_tab"), mode=0o700)
    try:
        punkt.save_punkt_params(trainer.get_params(),
                                os.path.join(root, "tokenizers", "punkt_tab", "english"))
    finally:
        nltk.data.path.remove(root)
    return root, trainer.get_params()


@pytest.fixture
def punkt_model(punkt_root, monkeypatch):
    """The trained model found by lang 'english'; returns nltk's own tokenizer built from it."""
    monkeypatch.setattr(nltk.data, "path", [punkt_root[0]] + list(nltk.data.path))
    return punkt.PunktSentenceTokenizer(punkt_root[1])


def _write_jsonl(path, texts):
    write_jsonl(path, [{"content": text} for text in texts])


@pytest.mark.parametrize("append_eod", [False, True])
def test_sentences_are_the_sequences_and_records_the_documents(
        punkt_model, corpus_slice, sample_tokenizer, append_eod, tmp_path):
    from megatron_neobert.data.indexed import open_indexed
    texts = corpus_slice[1][:24]
    # Empty texts, and sentences without a token (a zero-width space): no sequence.
    texts = texts[:5] + ["", " \n ", "\u200b", "One sentence only. \u200b", "..."] + texts[5:]
    src = tmp_path / "src"
    src.mkdir()
    _write_jsonl(src / "a.jsonl", texts[:10])
    _write_jsonl(src / "b.jsonl", texts[10:])
    # Two files written at once (the splitter travels pickled) and two workers per file.
    stats = preprocess_data([str(src)], str(tmp_path / "ours"), tokenizer_model=SAMPLE_TOKENIZER,
                            split_sentences=True, append_eod=append_eod, workers=4, partitions=2,
                            chunk_documents=3, progress=False, json_keys=["content"])
    assert stats.outputs["content"] == str(tmp_path / "ours_content_sentence")
    assert "ours_content_sentence.idx" in listing(tmp_path)
    sentences = [punkt_model.tokenize(text) for text in texts]  # nltk's own splitting
    megatron_lm_pair(sentences, str(tmp_path / "ref"), append_eod, sample_tokenizer.eod_id)
    assert file_bytes(stats.outputs["content"]) == file_bytes(str(tmp_path / "ref"))

    ds = open_indexed(stats.outputs["content"])
    assert len(ds.document_indices) - 1 == len(texts)  # document i is record i
    per_doc = numpy.diff(ds.document_indices)
    assert list(per_doc[5:10]) == [0, 0, 0, 1, 1] and per_doc.max() > 10
    assert len(punkt_model.tokenize(texts[8])) == 2
    first = [sample_tokenizer.tokenize(s) for s in sentences[0]]
    for k, ids in enumerate(first):
        numpy.testing.assert_array_equal(
            ds[k], ids + [sample_tokenizer.eod_id] * (append_eod and k == len(first) - 1))
    eods = sum(int((ds[i] == sample_tokenizer.eod_id).sum()) for i in range(len(ds)))
    assert eods == (int((per_doc > 0).sum()) if append_eod else 0)  # only on last sentences
    with open(stats.outputs["content"] + ".tokenizer.json") as f:
        assert json.load(f)["split_sentences"] == {"lang": "english", "keep_newlines": False}


def test_keep_newlines_keeps_them_in_the_sentences(punkt_model, sample_tokenizer, tmp_path):
    from megatron_neobert.data.preprocessing.sentences import SentenceSplitter
    plain = SentenceSplitter("english").split(NEWLINES_TEXT)
    kept = SentenceSplitter("english", keep_newlines=True).split(NEWLINES_TEXT)
    assert plain == punkt_model.tokenize(NEWLINES_TEXT) and len(plain) == 6
    assert not any("\n" in s for s in plain)
    assert kept == ["Readline configuration is easy. ", "It loads the module.\n",
                    "Then it stops.\n\n", "The history file is kept. ",
                    "Delete it to start again.  ", "Done."]
    assert "".join(kept) == NEWLINES_TEXT
    # Through the tool: the sentences, one sequence each.
    _write_jsonl(tmp_path / "in.jsonl", [NEWLINES_TEXT])
    stats = preprocess_data([str(tmp_path / "in.jsonl")], str(tmp_path / "out"),
                            tokenizer_model=SAMPLE_TOKENIZER, split_sentences=True,
                            keep_newlines=True, progress=False, json_keys=["content"])
    from megatron_neobert.data.indexed import open_indexed
    ds = open_indexed(stats.outputs["content"])
    assert [list(ds[i]) for i in range(len(ds))] == [sample_tokenizer.tokenize(s) for s in kept]


def test_more_than_a_million_characters_are_split_in_pieces(punkt_model, monkeypatch):
    import megatron_neobert.data.preprocessing.sentences as sentences
    from megatron_neobert.data.preprocessing.sentences import SentenceSplitter
    monkeypatch.setattr(sentences, "MAX_SPLIT_CHARS", 30)  # as Megatron-LM's 1,000,000
    text = "Readline configuration is easy. It loads the module. Then it stops."
    assert SentenceSplitter().split(text) == [s for piece in (text[:30], text[30:60], text[60:])
                                              for s in punkt_model.tokenize(piece)]


def test_sentence_flags_without_split_sentences_are_refused(corpus_slice, tmp_path, capsys):
    from tools.preprocess_data import main
    for flags in (["--keep-newlines"], ["--lang", "german"]):
        with pytest.raises(SystemExit) as info:
            main(["--json-keys", "content", "--input", corpus_slice[0], "--output-prefix", str(tmp_path / "x"), *flags])
        assert info.value.code == 2
        assert f"{flags[0]} only applies to sentence splitting: add --split-sentences" in capsys.readouterr().err
    with pytest.raises(ValueError, match="--keep-newlines .* needs --split-sentences"):
        preprocess_data([corpus_slice[0]], str(tmp_path / "x"), keep_newlines=True, json_keys=["content"])
    assert listing(tmp_path) == []


def test_a_missing_model_or_nltk_fails_before_any_output(punkt_model, corpus_slice, tmp_path,
                                                         monkeypatch, capsys):
    from tools.preprocess_data import main
    argv = ["--json-keys", "content", "--input", corpus_slice[0], "--output-prefix", str(tmp_path / "x"), "--split-sentences",
            "--tokenizer-model", SAMPLE_TOKENIZER, "--no-progress"]
    assert main(argv + ["--lang", "esperanto"]) == 1
    err = capsys.readouterr().err
    assert "--split-sentences --lang esperanto: no NLTK punkt model for 'esperanto'" in err
    assert "python -m nltk.downloader punkt_tab" in err and "NLTK_DATA" in err
    monkeypatch.setitem(sys.modules, "nltk", None)  # import nltk raises ImportError
    with pytest.raises(SystemExit, match=r'--split-sentences needs nltk, not installed: .*pip install "\.\[data\]"'):
        main(argv)
    assert listing(tmp_path) == []


def test_the_trainer_reads_a_document_as_its_sentences(punkt_model, corpus_slice, sample_tokenizer,
                                                       tmp_path):
    """Samples of a _sentence dataset: each piece is a slice of one document (its sentences
    joined, EOD dropped), in its own attention segment, as for a _document dataset."""
    import torch
    from megatron_neobert.data.datasets.mlm_dataset import MLMDatasetConfig, build_mlm_datasets
    texts = corpus_slice[1][:40]
    _write_jsonl(tmp_path / "in.jsonl", texts)
    stats = preprocess_data([str(tmp_path / "in.jsonl")], str(tmp_path / "rw"),
                            tokenizer_model=SAMPLE_TOKENIZER, split_sentences=True,
                            append_eod=True, progress=False, json_keys=["content"])
    documents = [numpy.concatenate([sample_tokenizer.tokenize(s) for s in punkt_model.tokenize(t)])
                 for t in texts]
    assert all(numpy.array_equal(a[:-1], b) for a, b in zip(read_documents(stats.outputs["content"]),
                                                             documents))
    config = MLMDatasetConfig(random_seed=1, sequence_length=128, split="1,0,0",
                              blend=([stats.outputs["content"]], None), tokenizer=sample_tokenizer,
                              path_to_cache=str(tmp_path / "cache"))
    train, _, _ = build_mlm_datasets(config, [None] * 3)
    covered = [numpy.zeros(len(d), bool) for d in documents]
    for i in range(len(train)):
        sample = train[i]
        tokens = torch.where(sample["labels"] != -100, sample["labels"], sample["tokens"]).numpy()
        bounds = sample["cu_seqlens"].tolist()
        for (d, start, _), a, b in zip(train.pieces(i), bounds[:-1], bounds[1:]):
            assert tokens[a] == sample_tokenizer.cls_id and tokens[b - 1] == sample_tokenizer.sep_id
            numpy.testing.assert_array_equal(tokens[a + 1:b - 1], documents[d][start:start + b - a - 2])
            covered[d][start:start + b - a - 2] = True
    assert all(c.all() for c in covered)  # every token of every document, and no EOD


def test_a_chunk_is_one_batch_call_of_all_its_sentences(punkt_model, corpus_slice, monkeypatch,
                                                        tmp_path):
    from megatron_neobert.data import tokenizer as tokenizer_module
    texts = corpus_slice[1][:10]
    _write_jsonl(tmp_path / "in.jsonl", texts)
    calls = []
    real = tokenizer_module.HuggingFaceMLMTokenizer.tokenize_batch

    def counted(self, batch):
        calls.append(len(batch))
        return real(self, batch)

    monkeypatch.setattr(tokenizer_module.HuggingFaceMLMTokenizer, "tokenize_batch", counted)
    preprocess_data([str(tmp_path / "in.jsonl")], str(tmp_path / "out"),
                    tokenizer_model=SAMPLE_TOKENIZER, split_sentences=True, chunk_documents=4,
                    progress=False, json_keys=["content"])
    sentences = [len(punkt_model.tokenize(t)) for t in texts]
    assert calls == [sum(sentences[:4]), sum(sentences[4:8]), sum(sentences[8:])]


def test_sentence_and_document_data_never_mix(punkt_model, corpus_slice, tmp_path):
    from megatron_neobert.data.preprocessing.merge import merge_datasets
    texts = corpus_slice[1][:6]
    for name in ("a", "b"):
        _write_jsonl(tmp_path / f"{name}.jsonl", texts)
    run = dict(tokenizer_model=SAMPLE_TOKENIZER, progress=False)
    # Shards of a killed sentence run are not resumed by a document run, and vice versa.
    split = preprocess_data([str(tmp_path / "a.jsonl"), str(tmp_path / "b.jsonl")],
                            str(tmp_path / "rw"), split_sentences=True, rank=0, world_size=2, **run, json_keys=["content"])
    assert split.shards_done_before == 0
    again = preprocess_data([str(tmp_path / "a.jsonl"), str(tmp_path / "b.jsonl")],
                            str(tmp_path / "rw"), split_sentences=True, rank=0, world_size=2, **run, json_keys=["content"])
    assert again.shards_done_before == 1 and again.documents == 0
    whole = preprocess_data([str(tmp_path / "a.jsonl"), str(tmp_path / "b.jsonl")],
                            str(tmp_path / "rw"), rank=0, world_size=2, **run, json_keys=["content"])
    assert whole.shards_done_before == 0 and whole.documents == 6
    sentences = preprocess_data([str(tmp_path / "a.jsonl")], str(tmp_path / "s"),
                                split_sentences=True, **run, json_keys=["content"]).outputs["content"]
    documents = preprocess_data([str(tmp_path / "a.jsonl")], str(tmp_path / "d"), **run, json_keys=["content"]).outputs["content"]
    with pytest.raises(ValueError, match="different tokenizers or sentence splitting"):
        merge_datasets([sentences, documents], str(tmp_path / "mixed"))
    assert not os.path.exists(str(tmp_path / "mixed.idx"))


def test_a_chunk_without_any_sentence(punkt_model, tmp_path):
    _write_jsonl(tmp_path / "in.jsonl", ["", "  ", "Some text here. More."])
    stats = preprocess_data([str(tmp_path / "in.jsonl")], str(tmp_path / "out"),
                            tokenizer_model=SAMPLE_TOKENIZER, split_sentences=True,
                            append_eod=True, chunk_documents=2, progress=False, json_keys=["content"])
    from megatron_neobert.data.indexed import open_indexed
    assert numpy.diff(open_indexed(stats.outputs["content"]).document_indices).tolist() == [0, 0, 2]


def test_a_length_subset_of_sentence_data_is_what_megatron_core_copies_document_by_document(
        punkt_model, corpus_slice, tmp_path):
    """Documents of several sequences (and empty ones) copied in bulk, in steps of a few documents and writes
    smaller than a document, equal megatron-core's builder fed the kept documents one at a time."""
    from megatron.core.datasets.indexed_dataset import IndexedDataset, IndexedDatasetBuilder

    from megatron_neobert.data.preprocessing.length_subset import make_length_subset
    texts = corpus_slice[1][:30]
    texts = texts[:3] + ["", "..."] + texts[3:]
    _write_jsonl(tmp_path / "a.jsonl", texts)
    prefix = preprocess_data([str(tmp_path / "a.jsonl")], str(tmp_path / "ours"), tokenizer_model=SAMPLE_TOKENIZER,
                             split_sentences=True, progress=False, json_keys=["content"]).outputs["content"]
    source = IndexedDataset(prefix)
    documents = [source[int(a):int(b)] for a, b in zip(source.document_indices[:-1], source.document_indices[1:])]
    min_tokens = int(numpy.median([sum(map(len, d)) for d in documents if d]))
    reference = IndexedDatasetBuilder(str(tmp_path / "ref.bin"), dtype=source.index.dtype)
    kept = [d for d in documents if sum(map(len, d)) >= min_tokens]
    for sequences in kept:
        reference.add_document(numpy.concatenate(sequences), [len(s) for s in sequences])
    reference.finalize(str(tmp_path / "ref.idx"))
    assert 5 <= len(kept) < len(documents) and max(len(d) for d in kept) > 3
    for steps in ({}, {"documents_per_step": 4, "tokens_per_write": min_tokens // 3}):
        out = str(tmp_path / f"subset{len(steps)}")
        stats = make_length_subset(prefix, out, min_tokens, progress=False, **steps)
        assert file_bytes(out) == file_bytes(str(tmp_path / "ref"))
        assert (stats.documents, stats.tokens) == (len(kept), sum(sum(map(len, d)) for d in kept))
        assert (stats.total_documents, stats.total_tokens) == (len(documents), sum(sum(map(len, d)) for d in documents))
