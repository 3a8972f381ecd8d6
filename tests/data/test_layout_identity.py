"""The MLM datasets yield exactly the samples of the layout they had before the per-sample layout (layout 3, which
materialised every piece): the same pieces, [CLS]/[SEP] and masks, in the same order, so that a run in flight
resumes exactly across the change.

``layout_identity.json`` holds a digest of every sample of every case below, written by layout 3's code (commit
f8318c6, with this file as of commit c5107c5: ``python tests/data/test_layout_identity.py FILE``); the test
recomputes them with the code of today.
The corpora hold every edge of packing: 1- and 2-token documents and the 1-2 token gaps that force splits, corpora
of only such documents (padding pieces), empty documents and documents emptied by their trimmed [CLS]/[SEP], a
corpus shorter than two samples (the stream re-read several times), the epoch wrap, several epochs, train and
validation splits, a weighted blend, both mask schemes, packed and padded samples, and megatron-core's mock data.
"""

import hashlib
import json
import os
import sys

import numpy
import pytest
from megatron.core.datasets.indexed_dataset import IndexedDatasetBuilder

FIXTURE = os.path.join(os.path.dirname(os.path.abspath(__file__)), "layout_identity.json")
# (corpus, seq_length, packed, mask scheme, split, samples per split, seed)
CASES = {
    "edges packed, 1 epoch": ("edges", 32, True, "mask", "80,20,0", [None, None, None], 1234),
    "edges packed, 4 epochs": ("edges", 32, True, "mask", "80,20,0", [1200, 300, 0], 1234),
    "edges padded, 3 epochs": ("edges", 32, False, "80/10/10", "80,20,0", [1000, 100, 0], 5),
    "1-2 token documents, padding pieces": ("tiny", 16, True, "mask", "1,0,0", [60, None, None], 1234),
    "1-2 token documents at length 8": ("tiny", 8, True, "80/10/10", "1,0,0", [None, None, None], 3),
    "trimmed [CLS]/[SEP], empty bodies": ("cls_sep", 24, True, "mask", "1,0,0", [None, None, None], 1234),
    "shorter than two samples": ("short", 16, True, "mask", "1,0,0", [9, None, None], 1234),
    "shorter than two samples, padded": ("short", 16, False, "mask", "1,0,0", [9, None, None], 1234),
    "blend of two corpora": (("edges", "cls_sep"), 32, True, "mask", "90,10,0", [300, 40, 0], 77),
}
MOCK = {"mock data, packed": True, "mock data, padded": False}  # megatron-core's mock mode: the first samples
MOCK_SAMPLES = 40


def _corpus(name, folder):
    """A corpus written as Megatron-LM's tool writes it (no record), from a fixed seed."""
    prefix = os.path.join(folder, name)
    if os.path.exists(prefix + ".idx"):
        return prefix
    rng = numpy.random.default_rng(sum(map(ord, name)))
    if name == "edges":  # 1-4 token documents among longer ones, and empty documents
        kind = rng.random(400)
        lengths = numpy.where(kind < 0.3, 1, numpy.where(kind < 0.45, 2, numpy.where(
            kind < 0.55, rng.integers(3, 5, 400), rng.integers(5, 100, 400))))
        lengths[kind > 0.95] = 0
        docs = [rng.integers(200, 8000, n) for n in lengths]
    elif name == "tiny":  # only 1-2 token documents: samples that no split can fill
        docs = [rng.integers(200, 8000, n) for n in rng.integers(1, 3, 60)]
    elif name == "short":  # 9 tokens in all
        docs = [rng.integers(200, 8000, n) for n in (3, 1, 5)]
    else:  # cls_sep: [CLS] body [SEP] as a tool whose tokenizer adds them writes it, some bodies empty
        docs = [numpy.concatenate([[2], rng.integers(200, 8000, n), [3]]) for n in rng.integers(0, 40, 150)]
    builder = IndexedDatasetBuilder(prefix + ".bin", dtype=numpy.uint16)
    for ids in docs:
        builder.add_document(list(ids), [len(ids)] if len(ids) else [])
    builder.finalize(prefix + ".idx")
    return prefix


def _digest(sample):
    h = hashlib.sha256()
    for key in sorted(sample):
        h.update(key.encode() + numpy.asarray(sample[key]).tobytes())
    return h.hexdigest()[:16]


def digests(folder):
    """{case: {split: [digest of each sample]}} with the code on the path."""
    from megatron_neobert.data.assets import SAMPLE_TOKENIZER
    from megatron_neobert.data.datasets.mlm_dataset import MLMDatasetConfig, build_mlm_datasets
    from megatron_neobert.data.tokenizer import build_tokenizer
    tok = build_tokenizer("HuggingFaceTokenizer", SAMPLE_TOKENIZER)
    assert (tok.cls_id, tok.sep_id) == (2, 3)  # the ids the cls_sep corpus is written with
    out = {}
    for case, (corpus, seq, packed, scheme, split, samples, seed) in CASES.items():
        prefixes = [_corpus(name, folder) for name in ([corpus] if isinstance(corpus, str) else corpus)]
        config = MLMDatasetConfig(random_seed=seed, sequence_length=seq, split=split, tokenizer=tok,
                                  blend=(prefixes, None if len(prefixes) == 1 else [0.6, 0.4]),
                                  path_to_cache=os.path.join(folder, "cache"), packed=packed, mask_scheme=scheme)
        datasets = build_mlm_datasets(config, samples)
        out[case] = {str(i): [_digest(d[j]) for j in range(len(d))] for i, d in enumerate(datasets) if d}
    for case, packed in MOCK.items():
        config = MLMDatasetConfig(random_seed=1234, sequence_length=64, blend=None, tokenizer=tok, packed=packed)
        train = build_mlm_datasets(config, [500, None, None])[0]
        out[case] = {"0": [_digest(train[j]) for j in range(MOCK_SAMPLES)]}
    return out


def test_samples_equal_those_of_layout_3(tmp_path):
    with open(FIXTURE) as f:
        want = json.load(f)
    got = digests(str(tmp_path))
    assert got.keys() == want.keys()
    for case in want:
        for split in want[case]:
            a, b = got[case][split], want[case][split]
            first = next((i for i, (x, y) in enumerate(zip(a, b)) if x != y), None)
            assert len(a) == len(b) and first is None, (case, split, len(a), len(b), first)


if __name__ == "__main__":
    import tempfile
    with tempfile.TemporaryDirectory() as tmp:
        result = digests(tmp)
    with open(sys.argv[1], "w") as f:
        json.dump(result, f, indent=0)
    print({case: {s: len(v) for s, v in splits.items()} for case, splits in result.items()})
