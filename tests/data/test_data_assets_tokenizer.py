"""The built-in corpus and tokenizer, and build_tokenizer for both backends."""

import os
import pickle

import numpy
import pyarrow.parquet as pq
import pytest

from megatron_neobert.data.assets import SAMPLE_CORPUS, SAMPLE_TOKENIZER
from megatron_neobert.data.tokenizer import build_tokenizer


def test_sample_tokenizer_loads_offline_as_bert_wordpiece():
    from transformers import AutoTokenizer
    tok = AutoTokenizer.from_pretrained(SAMPLE_TOKENIZER)
    assert tok.is_fast and type(tok).__name__.startswith("BertTokenizer")
    assert len(tok) == 8192
    assert [tok.pad_token_id, tok.unk_token_id, tok.cls_token_id, tok.sep_token_id,
            tok.mask_token_id] == [0, 1, 2, 3, 4]
    assert tok("Hello World")["input_ids"] == tok("hello world")["input_ids"]  # lowercase
    for name in ("tokenizer.json", "vocab.txt", "tokenizer_config.json", "special_tokens_map.json"):
        assert os.path.isfile(os.path.join(SAMPLE_TOKENIZER, name))
    with open(os.path.join(SAMPLE_TOKENIZER, "vocab.txt"), encoding="utf-8") as f:
        assert len(f.read().splitlines()) == 8192


def test_sample_corpus_has_refinedweb_schema_and_varied_lengths(sample_tokenizer):
    table = pq.read_table(SAMPLE_CORPUS)
    assert table.schema.names == ["content", "url", "timestamp", "dump", "segment", "image_urls"]
    assert os.path.getsize(SAMPLE_CORPUS) < 8e6
    texts = table.column("content").to_pylist()
    lengths = numpy.array([len(ids) for ids in sample_tokenizer.tokenize_batch(texts)])
    assert (lengths >= 2048).sum() >= 50 and (lengths >= 1024).sum() > (lengths >= 2048).sum()
    assert (lengths < 256).sum() >= 200
    assert all(url.startswith("https://docs.python.org/3.11/") for url in table.column("url").to_pylist())


def test_hf_wrapper_matches_transformers(sample_tokenizer):
    from transformers import AutoTokenizer
    ref = AutoTokenizer.from_pretrained(SAMPLE_TOKENIZER)
    text = "The asyncio module provides infrastructure for writing single-threaded code."
    assert sample_tokenizer.tokenize(text) == ref(text, add_special_tokens=False)["input_ids"]
    assert sample_tokenizer.tokenize_batch([text, "x"]) == [sample_tokenizer.tokenize(text),
                                                           sample_tokenizer.tokenize("x")]
    assert sample_tokenizer.special_ids == {0, 1, 2, 3, 4}
    assert sample_tokenizer.vocab_size == 8192
    clone = pickle.loads(pickle.dumps(sample_tokenizer))
    assert clone.tokenize(text) == sample_tokenizer.tokenize(text) and clone.mask_id == 4


def test_unknown_tokenizer_type_and_model_are_clear_errors(tmp_path):
    with pytest.raises(ValueError, match="unknown tokenizer type 'GPT2BPETokenizer'"):
        build_tokenizer("GPT2BPETokenizer", SAMPLE_TOKENIZER)
    missing = str(tmp_path / "no-such-tokenizer")
    with pytest.raises(ValueError, match="no-such-tokenizer"):
        build_tokenizer("HuggingFaceTokenizer", missing)
    with pytest.raises(ValueError, match="not found"):
        build_tokenizer("SentencePieceTokenizer", str(tmp_path / "missing.model"))


def _train_sentencepiece(tmp_path, name, **extra):
    import sentencepiece
    texts = pq.read_table(SAMPLE_CORPUS).slice(0, 60).column("content").to_pylist()
    prefix = str(tmp_path / name)
    sentencepiece.SentencePieceTrainer.train(
        sentence_iterator=iter(texts), model_prefix=prefix, vocab_size=400,
        model_type="unigram", minloglevel=2, **extra)
    return prefix + ".model"


def test_sentencepiece_maps_bert_specials(tmp_path):
    model = _train_sentencepiece(tmp_path, "bert_like", pad_id=0, pad_piece="[PAD]", unk_id=1,
                                 unk_piece="[UNK]", bos_id=-1, eos_id=-1,
                                 user_defined_symbols=["[CLS]", "[SEP]", "[MASK]"])
    tok = build_tokenizer("SentencePieceTokenizer", model)
    assert (tok.pad_id, tok.unk_id) == (0, 1)
    assert {tok.cls_id, tok.sep_id, tok.mask_id} == {2, 3, 4}
    ids = tok.tokenize("Python is a programming language.")
    assert ids and not set(ids) & tok.special_ids
    assert tok.vocab_size == 400
    assert pickle.loads(pickle.dumps(tok)).tokenize("abc") == tok.tokenize("abc")


def test_sentencepiece_without_specials_is_a_clear_error(tmp_path):
    model = _train_sentencepiece(tmp_path, "plain")  # default pieces: <unk> <s> </s>, no mask/pad
    with pytest.raises(ValueError, match=r"lacks BERT special pieces: pad .*mask"):
        build_tokenizer("SentencePieceTokenizer", model)


# Pieces of text that stress BERT's normalizer and pre-tokenizer at piece boundaries: every kind of
# whitespace, control characters it deletes (some of them whitespace to Python), combining marks,
# CJK (padded with spaces), final sigma, special tokens inside words, over-long words ([UNK]).
_NASTY = ["the", "Word", "naïve", "e\u0301", "\u0308", "ΣΑΣ", "ς", "中文", "の", "42", ".", ",", "'s", "-", "(",
          "[MASK]", "[SEP]x", "x[CLS]", "[mask]", " ", "  ", "\t", "\n", "\r\n", "\xa0", "\u2003", "\u3000", "\u2028",
          "\x00", "\x0b", "\x0c", "\x1c", "\x1f", "\x85", "\x07", "\u200b", "\ufeff", "\ufffd", "\u200d", "😀",
          "ภาษา", "عربي", "a" * 101, "b" * 100, "é" * 100,
          "x.[MASK].y", "[[SEP]]", "#", "##ing", "don't", "e.g.", "\u2026", "«", "\u201cq\u201d", "$5", "a_b", "[", "]"]


def _nasty_documents(rng, n):
    return ["".join(rng.choice(_NASTY, size=int(rng.integers(0, 60)))) for _ in range(n)]


def test_word_piece_cache_gives_the_ids_of_whole_documents(sample_tokenizer):
    from megatron_neobert.data.tokenizer import WordPieceCache
    backend = sample_tokenizer._backend
    rng = numpy.random.default_rng(0)
    small = WordPieceCache(backend, max_pieces=50)  # starts over many times
    for _ in range(20):  # later batches mostly hit the cache
        docs = _nasty_documents(rng, 50)
        whole = [e.ids for e in backend.encode_batch(docs, add_special_tokens=False)]
        assert sample_tokenizer.tokenize_batch(docs) == whole
        assert small.encode(docs) == whole


def test_every_character_a_piece_ends_at_is_whitespace_to_bert(sample_tokenizer):
    """All of Unicode: wherever either piece splitter cuts, BERT drops the character and splits."""
    from megatron_neobert.data.tokenizer import WordPieceCache
    backend = sample_tokenizer._backend
    everything = list(map(chr, range(0x110000)))
    cuts = [c for c in everything if not WordPieceCache._PIECE.match(c)]
    assert cuts == [c for c in everything if c.isspace() and not WordPieceCache._CONTROL_SPACE.match(c)]
    assert len(cuts) == 22
    ids = [e.ids for e in backend.encode_batch([f"ab{c}cd" for c in cuts] + ["ab", "cd"], add_special_tokens=False)]
    assert all(split == ids[-2] + ids[-1] for split in ids[:-2])


def test_word_piece_cache_applies_to_bert_word_piece_only(sample_tokenizer, tmp_path):
    from tokenizers import AddedToken, Tokenizer, models, normalizers
    from megatron_neobert.data.tokenizer import WordPieceCache
    backend = sample_tokenizer._backend
    assert WordPieceCache.applies_to(backend)
    assert build_tokenizer("BertWordPieceLowerCase", os.path.join(SAMPLE_TOKENIZER, "vocab.txt"))._word_pieces
    variants = {"no clean_text": lambda t: setattr(t, "normalizer", normalizers.BertNormalizer(clean_text=False)),
                "truncation": lambda t: t.enable_truncation(512),
                "lstrip token": lambda t: t.add_special_tokens([AddedToken("<m>", lstrip=True)]),
                "normalized token": lambda t: t.add_tokens([AddedToken("hello", normalized=True)]),
                "BPE": lambda t: setattr(t, "model", models.BPE())}
    for name, change in variants.items():
        variant = Tokenizer.from_str(backend.to_str())
        change(variant)
        assert not WordPieceCache.applies_to(variant), name
