"""Megatron-LM's `--tokenizer-type NullTokenizer --vocab-size N`: the data's ids taken as they are, the MLM's special
ids from the flags or after the data's (its end of document at N, as megatron-core 0.16's), refused in one line
when they cannot be."""

import numpy
import pytest
import torch

from megatron_neobert.data.assets import SAMPLE_TOKENIZER
from megatron_neobert.data.datasets.mlm_dataset import IGNORE_INDEX
from megatron_neobert.data.tokenizer import build_tokenizer
from megatron_neobert.data.datasets.trainer_datasets import build_trainer_datasets
from megatron_neobert.training.config.arguments import parse_settings
from megatron_neobert.training.engine.model_setup import run_model_shape

NULL = ["--tokenizer-type", "NullTokenizer", "--vocab-size", "100"]
SHORT = ["--model-preset", "neobert-tiny", "--seq-length", "64", "--train-iters", "10", "--lr-warmup-iters", "1",
         "--global-batch-size", "8", "--micro-batch-size", "8"]


def _tokenizer(settings):
    return build_tokenizer(settings.data.tokenizer_type, settings.data.tokenizer_model)


@pytest.mark.parametrize("flags, ids", [
    ([], dict(eod=100, pad=101, cls=102, sep=103, mask=104, vocab=105)),
    (["--null-tokenizer-pad-id", "0", "--null-tokenizer-cls-id", "1", "--null-tokenizer-sep-id", "2",
      "--null-tokenizer-mask-id", "3"], dict(eod=100, pad=0, cls=1, sep=2, mask=3, vocab=101)),
    (["--null-tokenizer-mask-id", "7"], dict(eod=100, pad=101, cls=102, sep=103, mask=7, vocab=104)),
])
def test_special_ids_are_the_flags_or_follow_the_datas(flags, ids):
    settings = parse_settings(["--mock-data", *NULL, *SHORT, *flags])
    tokenizer = _tokenizer(settings)
    found = dict(eod=tokenizer.eod_id, pad=tokenizer.pad_id, cls=tokenizer.cls_id, sep=tokenizer.sep_id,
                 mask=tokenizer.mask_id, vocab=tokenizer.vocab_size)
    assert found == ids
    assert tokenizer.special_ids == {ids[role] for role in ("eod", "pad", "cls", "sep", "mask")}
    # --vocab-size is the tokenizer's, as Megatron-LM's: the model's vocabulary is the tokenizer's whole one.
    assert settings.model.vocab_size is None and run_model_shape(settings, tokenizer.vocab_size).arch.vocab_size == ids[
        "vocab"]


@pytest.mark.parametrize("flags, message", [
    (["--tokenizer-type", "NullTokenizer"], "--tokenizer-type NullTokenizer needs --vocab-size"),
    ([*NULL, "--tokenizer-model", SAMPLE_TOKENIZER], "reads no --tokenizer-model: give --vocab-size"),
    ([*NULL, "--null-tokenizer-mask-id", "100"],
     "--null-tokenizer-mask-id 100: the data's ids are 0 .. 99 (--vocab-size 100); leave the flag out for an id of "
     "its own (104)"),
    ([*NULL, "--null-tokenizer-pad-id", "-1"], "--null-tokenizer-pad-id -1: the data's ids are 0 .. 99"),
    ([*NULL, "--null-tokenizer-cls-id", "5", "--null-tokenizer-sep-id", "5"],
     "--null-tokenizer-cls-id and --null-tokenizer-sep-id name the same id 5"),
    (["--null-tokenizer-mask-id", "5"], "--null-tokenizer-mask-id: only with --tokenizer-type NullTokenizer"),
])
def test_null_tokenizer_flags_that_cannot_be_are_refused_in_one_line(flags, message):
    with pytest.raises(ValueError) as err:
        parse_settings(["--mock-data", *SHORT, *flags])
    assert message in str(err.value) and "\n" not in str(err.value)


def _pieces(sample, tokenizer):
    """The document pieces of a packed sample, masked tokens restored from the labels: [(first, body, last)]."""
    tokens = torch.where(sample["labels"] != IGNORE_INDEX, sample["labels"], sample["tokens"]).numpy()
    bounds = sample["cu_seqlens"].tolist()
    return [(tokens[a], tokens[a + 1:b - 1], tokens[b - 1]) for a, b in zip(bounds[:-1], bounds[1:])
            if tokens[a] != tokenizer.pad_id]


def test_mock_documents_count_through_the_datas_ids_between_the_special_ones():
    settings = parse_settings(["--mock-data", *NULL, *SHORT])
    tokenizer = _tokenizer(settings)
    train, _, _ = build_trainer_datasets(settings, tokenizer)
    masked = 0
    for i in range(20):
        sample = train[i]
        masked += int((sample["tokens"] == 104).sum())
        assert ((sample["tokens"] == 104) == (sample["labels"] != IGNORE_INDEX)).all()  # [MASK] is 104
        for first, body, last in _pieces(sample, tokenizer):
            assert (first, last) == (102, 103)  # [CLS] [SEP]
            assert body.max(initial=0) < 100 and ((numpy.diff(body) - 1) % 100 == 0).all()  # the data's ids, counting
    assert masked > 0


def test_already_tokenized_data_is_read_with_its_own_special_ids(data):
    """The sample corpus (tokenized with the sample tokenizer: [PAD] 0, [CLS] 2, [SEP] 3, [MASK] 4) read by a
    NullTokenizer told those ids: every document piece is a run of the corpus's ids as they are."""
    prefix, cache = data
    hf = build_tokenizer("HuggingFaceTokenizer", SAMPLE_TOKENIZER)
    settings = parse_settings(["--data-path", prefix, "--data-cache-path", cache, "--tokenizer-type", "NullTokenizer",
                               "--vocab-size", str(hf.vocab_size), "--null-tokenizer-pad-id", str(hf.pad_id),
                               "--null-tokenizer-cls-id", str(hf.cls_id), "--null-tokenizer-sep-id", str(hf.sep_id),
                               "--null-tokenizer-mask-id", str(hf.mask_id), *SHORT])
    tokenizer = _tokenizer(settings)
    assert tokenizer.vocab_size == hf.vocab_size + 1  # the end of document after the data's ids
    from megatron.core.datasets.indexed_dataset import IndexedDataset

    corpus = numpy.fromfile(prefix + ".bin", IndexedDataset(prefix).index.dtype).astype(numpy.int64).tobytes()
    train, _, _ = build_trainer_datasets(settings, tokenizer)
    pieces = [piece for i in range(8) for piece in _pieces(train[i], tokenizer)]
    assert len(pieces) > 8
    for first, body, last in pieces:
        assert (first, last) == (hf.cls_id, hf.sep_id) and corpus.find(body.astype(numpy.int64).tobytes()) >= 0
