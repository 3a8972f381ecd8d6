"""Helpers shared by the data tests."""

import json
import os

import numpy


def read_documents(prefix):
    from megatron_neobert.data.indexed import raw_lengths
    from megatron_neobert.data.indexed import open_indexed
    ds = open_indexed(prefix)
    lengths = raw_lengths(ds.index, numpy.arange(len(ds.document_indices) - 1))
    first = ds.document_indices[:-1]
    return [numpy.array(ds.get(int(first[d]), 0, int(lengths[d]))) for d in range(len(lengths))]


def file_bytes(prefix):
    return [open(prefix + ext, "rb").read() for ext in (".bin", ".idx")]


def listing(folder):
    return sorted(os.listdir(folder))


def megatron_lm_pair(documents, prefix, append_eod, eod):
    """What Megatron-LM's tools/preprocess_data.py writes for ``documents``, each a list of texts
    (its sentences with --split-sentences, else [the record's text]): each text tokenized on its
    own, one sequence per text with tokens, EOD on the last one of a non-empty document, and an
    empty document as no sequence at all."""
    from megatron.core.datasets.indexed_dataset import IndexedDatasetBuilder
    from transformers import AutoTokenizer

    from megatron_neobert.data.assets import SAMPLE_TOKENIZER
    tok = AutoTokenizer.from_pretrained(SAMPLE_TOKENIZER)
    builder = IndexedDatasetBuilder(prefix + ".bin", dtype=numpy.uint16)
    for texts in documents:
        ids, lengths = [], []
        for text in texts:
            text_ids = tok(text, add_special_tokens=False)["input_ids"]
            if text_ids:
                ids += text_ids
                lengths.append(len(text_ids))
        if ids and append_eod:
            ids.append(eod)
            lengths[-1] += 1
        builder.add_document(ids, lengths)
    builder.finalize(prefix + ".idx")


def write_jsonl(path, rows, opener=open):
    with opener(path, "wt", encoding="utf-8") as f:
        for row in rows:
            f.write(json.dumps(row) + "\n")
