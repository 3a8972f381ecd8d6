"""Fixtures of the data tests: a slice of the sample corpus, preprocessed once per session."""

import os
import sys
import warnings

import numpy
import pyarrow.parquet as pq
import pytest

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), os.pardir, os.pardir))
sys.path.insert(0, ROOT)

from megatron_neobert.data.assets import SAMPLE_CORPUS, SAMPLE_TOKENIZER  # noqa: E402
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
warnings.filterwarnings("ignore", message="Transformer Engine and Apex are not installed")


@pytest.fixture(scope="session")
def sample_tokenizer():
    from megatron_neobert.data.tokenizer import build_tokenizer
    return build_tokenizer("HuggingFaceTokenizer", SAMPLE_TOKENIZER)


N_DOCS = 240  # enough for documents over 1024 and 2048 tokens, small enough to be fast


@pytest.fixture(scope="session")
def corpus_slice(tmp_path_factory):
    """(parquet path, texts): the first N_DOCS documents of the sample corpus."""
    table = pq.read_table(SAMPLE_CORPUS).slice(0, N_DOCS)
    path = str(tmp_path_factory.mktemp("corpus") / "slice.parquet")
    pq.write_table(table, path)
    return path, table.column("content").to_pylist()


@pytest.fixture(scope="session")
def expected_ids(corpus_slice):
    """The tokenizer's own encoding of every document, via transformers (not our wrapper)."""
    from transformers import AutoTokenizer
    tok = AutoTokenizer.from_pretrained(SAMPLE_TOKENIZER)
    return [numpy.asarray(tok(text, add_special_tokens=False)["input_ids"])
            for text in corpus_slice[1]]


@pytest.fixture(scope="session")
def indexed_prefix(corpus_slice, tmp_path_factory):
    from megatron_neobert.data.preprocessing.preprocess import preprocess_data
    out = str(tmp_path_factory.mktemp("indexed") / "slice")
    stats = preprocess_data([corpus_slice[0]], out, tokenizer_model=SAMPLE_TOKENIZER,
                            workers=1, progress=False, json_keys=["content"])
    return stats.outputs["content"]

