"""Length subsets, packing, the MLM dataset, blends, loaders (torch and DALI)."""

import os
import re
import subprocess
import sys

import numpy
import pytest
import torch
from data_helpers import read_documents
from packing_layout3 import pack_documents
from packing_reference import reference_pack

from megatron_neobert.data.assets import SAMPLE_TOKENIZER
from megatron_neobert.data.datasets import native
from megatron_neobert.data.datasets.batches import collate_mlm_batch
from megatron_neobert.data.datasets.blend import parse_data_path
from megatron_neobert.data.datasets.loader import build_data_loader
from megatron_neobert.data.datasets.mlm_dataset import MLMDatasetConfig, build_mlm_datasets
from megatron_neobert.data.datasets.packing import PAD_PIECE, chunk_piece, chunk_starts, pack_starts, packed_pieces
from megatron_neobert.data.preprocessing.length_subset import make_length_subset

SEQ = 256


def piece_cost(piece_doc: numpy.ndarray, piece_len: numpy.ndarray) -> numpy.ndarray:
    """Tokens a piece occupies in its sample: its tokens plus [CLS] and [SEP]; padding only its length."""
    return piece_len.astype(numpy.int64) + numpy.where(piece_doc == PAD_PIECE, 0, 2)


def _config(tok, prefixes, weights=None, cache=None, **kw):
    kw.setdefault("split", "1,0,0")
    return MLMDatasetConfig(random_seed=kw.pop("seed", 1234), sequence_length=kw.pop("seq", SEQ),
                            blend=(list(prefixes), weights), tokenizer=tok,
                            path_to_cache=cache, **kw)


def _original(sample):
    """Undo [MASK]-scheme masking: labels hold the original id wherever a token was selected."""
    return torch.where(sample["labels"] != -100, sample["labels"], sample["tokens"])


# ---- length subsets ----------------------------------------------------------------------------
def test_length_subsets_hold_exactly_the_long_documents(indexed_prefix, expected_ids, tmp_path, capsys):
    from tools.make_length_subset import main
    for threshold in (1024, 2048):
        out = str(tmp_path / f"rw{threshold}plus")
        assert main(["--input-prefix", indexed_prefix, "--output-prefix", out,
                     "--min-tokens", str(threshold)]) == 0
        want = [ids for ids in expected_ids if len(ids) >= threshold]
        got = read_documents(out)
        assert len(want) >= 5 and len(got) == len(want)
        assert all(numpy.array_equal(a, b) for a, b in zip(got, want))
        # The progress line counts the documents read and how many were kept (before: "documents >= 1024
        # tokens: 1432/1432" with 371 kept).
        progress = [re.sub(r"\(\d+ s", "(N s", line) for line in capsys.readouterr().err.splitlines()
                    if line.startswith("documents")]
        assert progress == [f"documents read for >= {threshold} tokens: {len(expected_ids)}/{len(expected_ids)} "
                            f"(N s, kept={len(want):,})"]
    assert main(["--input-prefix", str(tmp_path / "missing"), "--output-prefix", out,
                 "--min-tokens", "5"]) == 1


# ---- packing -----------------------------------------------------------------------------------
@pytest.fixture(params=["C", "numpy"])
def walk(request, monkeypatch):
    """The packer's two ways to the same starts: the compiled walk, and numpy's where no C compiler is found."""
    if request.param == "numpy":
        monkeypatch.setattr(native, "library", lambda: None)
    else:
        assert native.library() is not None  # this machine has a C compiler: the walk is tested, not skipped
    return request.param


def _samples(lengths, seq):
    """Every packed sample's pieces (document, start, length, whether it re-reads the order's start), as the
    dataset derives them from where each sample starts."""
    lengths = numpy.asarray(lengths)
    docs = numpy.flatnonzero(lengths > 0)
    starts = pack_starts(lengths, seq, docs)
    at = lambda lo, hi: lengths[docs[numpy.arange(lo, hi) % docs.size]].tolist()  # noqa: E731
    return [[(int(docs[j % docs.size]) if j != PAD_PIECE else PAD_PIECE, start, n, j >= docs.size)
             for j, start, n in packed_pieces(position, offset, seq, at)]
            for position, offset in zip(starts.position.tolist(), starts.offset.tolist())]


def _layout3_samples(lay):
    return [[(int(lay.piece_doc[p]), int(lay.piece_start[p]), int(lay.piece_len[p]),
              bool(lay.piece_wrapped[p])) for p in range(lay.sample_ptr[i], lay.sample_ptr[i + 1])]
            for i in range(lay.sample_ptr.shape[0] - 1)]


def _pieces(samples):
    """The samples as layout 3's arrays, for the checks below."""
    flat = [piece for sample in samples for piece in sample]
    doc, start, n, wrapped = (numpy.array(column) for column in zip(*flat))
    return numpy.cumsum([0] + [len(sample) for sample in samples]), doc, start, n, wrapped


def _check_packed(samples, lengths, seq):
    """Exact filling, every token of the epoch once and in order, padding only where no piece
    can be split to fill the gap (the pieces hold at most one token more than their count)."""
    sample_ptr, piece_doc, piece_start, piece_len, piece_wrapped = _pieces(samples)
    per_sample = numpy.add.reduceat(piece_cost(piece_doc, piece_len), sample_ptr[:-1])
    assert (per_sample == seq).all() and (piece_len >= 1).all()
    own = ~piece_wrapped & (piece_doc != PAD_PIECE)
    order = numpy.lexsort((piece_start[own], piece_doc[own]))
    doc, start, n = piece_doc[own][order], piece_start[own][order], piece_len[own][order]
    assert (numpy.bincount(doc, weights=n, minlength=len(lengths)) == lengths).all()
    first = numpy.concatenate([[True], doc[1:] != doc[:-1]])
    assert (start[first] == 0).all()
    assert (start[~first] == (start + n)[:-1][~first[1:]]).all()  # contiguous pieces
    for i in numpy.flatnonzero(numpy.add.reduceat(piece_doc == PAD_PIECE, sample_ptr[:-1])):
        sizes = piece_len[sample_ptr[i]:sample_ptr[i + 1] - 1]
        assert (sizes - 1).sum() <= 1


@pytest.mark.parametrize("seed", range(4))
def test_packing_equals_the_sequential_reference(seed, walk):
    rng = numpy.random.default_rng(seed)
    for _ in range(150):
        seq = int(rng.integers(8, 80))
        k = int(rng.integers(1, 50))
        # Many 0-4 token documents (the hard cases for exact filling) and some long ones.
        lengths = numpy.where(rng.random(k) < 0.5, rng.integers(0, 5, k), rng.integers(1, 3 * seq, k))
        if lengths.sum() == 0:
            continue
        samples = _samples(lengths, seq)
        assert samples == reference_pack(lengths.tolist(), seq)
        _check_packed(samples, lengths, seq)


@pytest.mark.parametrize("documents, seq", [(60_000, 512), (15_000, 128)])
def test_packing_web_text_lengths_at_scale(documents, seq, walk):
    """Web text's lengths (about 11,000 events, where a sample ends on a document end or a gap, at 512): the
    samples of layout 3's vectorised packer (tests/data/packing_layout3.py), which materialised every piece."""
    rng = numpy.random.default_rng(0)
    lengths = numpy.maximum(1, rng.lognormal(6.0, 1.0, documents)).astype(numpy.int64)
    samples = _samples(lengths, seq)
    assert samples == _layout3_samples(pack_documents(lengths, seq))
    _check_packed(samples, lengths, seq)
    _, piece_doc, _, piece_len, piece_wrapped = _pieces(samples)
    assert not (piece_doc == PAD_PIECE).any()
    assert int(piece_len[piece_wrapped].sum()) < seq and len(samples) == -(-int(
        piece_cost(piece_doc, piece_len).sum()) // seq)


def test_chunking_for_padded_mode():
    starts = chunk_starts(numpy.array([5, 10, 11]), 7)
    assert starts.position.tolist() == [0, 1, 1, 2, 2, 2]
    assert starts.offset.tolist() == [0, 0, 5, 0, 5, 10]
    assert [chunk_piece(p, o, 7, [5, 10, 11][p]) for p, o in zip(starts.position, starts.offset)] == [
        [[0, 0, 5]], [[1, 0, 5]], [[1, 5, 5]], [[2, 0, 5]], [[2, 5, 5]], [[2, 10, 1]]]


def test_packing_refuses_empty_input(walk):
    with pytest.raises(ValueError, match="no non-empty document to pack"):
        pack_starts(numpy.array([], numpy.int32), 16)
    with pytest.raises(ValueError, match="no non-empty document to pack"):
        pack_starts(numpy.array([5], numpy.int32), 16, numpy.array([], numpy.int64))


# ---- the dataset -------------------------------------------------------------------------------
def test_packed_epoch_carries_every_token_once_without_cross_attention(
        sample_tokenizer, indexed_prefix, expected_ids, tmp_path):
    tok = sample_tokenizer
    (train, _, _) = build_mlm_datasets(_config(tok, [indexed_prefix], cache=str(tmp_path)),
                                       [None, None, None])
    total = sum(len(ids) for ids in expected_ids)
    # exactly the samples one pass needs (+1 when the last one wraps around)
    assert len(train) * SEQ >= total + 2 * len(expected_ids)
    assert len(train) <= -(-(total + 2 * len(expected_ids) + 2 * len(train)) // SEQ)
    seen = [numpy.zeros(len(ids), int) for ids in expected_ids]
    for i in range(len(train)):
        sample = train[i]
        assert sample["tokens"].dtype == torch.int64 and sample["tokens"].shape == (SEQ,)
        cu = sample["cu_seqlens"]
        assert cu.dtype == torch.int32 and cu[0] == 0 and cu[-1] == SEQ
        original = _original(sample).numpy()
        pieces = train.pieces(i)
        assert len(pieces) == len(cu) - 1
        for (doc, start, _), a, b in zip(pieces, cu[:-1].tolist(), cu[1:].tolist()):
            seg = original[a:b]
            # Each attention segment is one document piece: [CLS] body [SEP], nothing else.
            assert seg[0] == tok.cls_id and seg[-1] == tok.sep_id
            numpy.testing.assert_array_equal(seg[1:-1], expected_ids[doc][start:start + b - a - 2])
            seen[doc][start:start + b - a - 2] += 1
    assert all((s >= 1).all() for s in seen)  # every token of the corpus
    assert sum(int(s.sum()) for s in seen) - total < SEQ  # twice only in the wrapped last sample


def test_masking_rate_and_replacement(sample_tokenizer, indexed_prefix, tmp_path):
    tok = sample_tokenizer
    for scheme in ("mask", "80/10/10"):
        (train, _, _) = build_mlm_datasets(
            _config(tok, [indexed_prefix], cache=str(tmp_path), mask_scheme=scheme), [None] * 3)
        selected = candidates = as_mask = unchanged = randomized = 0
        for i in range(0, len(train), 2):
            s = train[i]
            labels, tokens = s["labels"], s["tokens"]
            sel = labels != -100
            original = torch.where(sel, labels, tokens)
            special = torch.isin(original, torch.tensor(sorted(tok.special_ids)))
            assert not (sel & special).any()  # specials never selected
            assert (tokens[~sel] == original[~sel]).all()  # labels only where selected
            selected += int(sel.sum())
            candidates += int((~special).sum())
            as_mask += int((tokens[sel] == tok.mask_id).sum())
            unchanged += int((tokens[sel] == labels[sel]).sum())
            randomized += int(((tokens[sel] != tok.mask_id) & (tokens[sel] != labels[sel])).sum())
            assert not torch.isin(tokens[sel & (tokens != tok.mask_id)],
                                  torch.tensor(sorted(tok.special_ids))).any()
        assert abs(selected / candidates - 0.20) < 0.01, selected / candidates
        if scheme == "mask":
            assert as_mask == selected
        else:
            assert abs(as_mask / selected - 0.8) < 0.02
            assert abs(randomized / selected - 0.1) < 0.02
            assert abs(unchanged / selected - 0.1) < 0.02


def test_padded_mode_one_chunk_per_sample(sample_tokenizer, indexed_prefix, expected_ids, tmp_path):
    tok = sample_tokenizer
    (train, _, _) = build_mlm_datasets(
        _config(tok, [indexed_prefix], cache=str(tmp_path), packed=False), [None] * 3)
    assert len(train) == sum(-(-len(ids) // (SEQ - 2)) for ids in expected_ids)
    real = 0
    for i in range(0, len(train), 3):
        s = train[i]
        assert set(s) == {"tokens", "labels", "attention_mask"}
        m = s["attention_mask"]
        n = int(m.sum())
        assert m.dtype == torch.bool and m[:n].all() and not m[n:].any()
        assert (s["tokens"][n:] == tok.pad_id).all() and (s["labels"][n:] == -100).all()
        original = _original(s)
        assert original[0] == tok.cls_id and original[n - 1] == tok.sep_id
        assert not torch.isin(original[1:n - 1], torch.tensor([tok.cls_id, tok.sep_id])).any()
        real += n
    assert real > 0


@pytest.mark.integration
def test_same_index_same_sample_in_another_process(sample_tokenizer, indexed_prefix, tmp_path):
    cache = str(tmp_path / "cache")
    (train, _, _) = build_mlm_datasets(_config(sample_tokenizer, [indexed_prefix], cache=cache),
                                       [1000, None, None])
    assert len(train) >= 1000  # several epochs, each shuffled anew
    out = str(tmp_path / "samples.pt")
    script = f"""
import sys, torch
sys.path.insert(0, {os.getcwd()!r}); sys.path.insert(0, {os.path.dirname(__file__)!r})
from test_data_mlm import _config
from megatron_neobert.data.assets import SAMPLE_TOKENIZER
from megatron_neobert.data.datasets.mlm_dataset import build_mlm_datasets
from megatron_neobert.data.tokenizer import build_tokenizer
tok = build_tokenizer("HuggingFaceTokenizer", SAMPLE_TOKENIZER)
train = build_mlm_datasets(_config(tok, [{indexed_prefix!r}], cache={cache!r}), [1000, None, None])[0]
torch.save([train[i] for i in (0, 7, 999)], {out!r})
"""
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(sys.path))
    subprocess.run([sys.executable, "-c", script], check=True, env=env, capture_output=True)
    theirs = torch.load(out)
    for mine, other in zip([train[i] for i in (0, 7, 999)], theirs):
        assert mine.keys() == other.keys()
        assert all(torch.equal(mine[k], other[k]) for k in mine)
    assert not torch.equal(train[0]["tokens"], train[1]["tokens"])
    # a different seed gives different samples
    (other_seed, _, _) = build_mlm_datasets(
        _config(sample_tokenizer, [indexed_prefix], cache=cache, seed=7), [1000, None, None])
    assert not torch.equal(other_seed[0]["tokens"], train[0]["tokens"])


def test_samples_do_not_depend_on_where_the_files_lie(sample_tokenizer, indexed_prefix, tmp_path):
    """The same data set and tokenizer copied to other folders (another working directory or checkout)
    give the same layout and masks."""
    import shutil
    from megatron_neobert.data.tokenizer import build_tokenizer
    (tmp_path / "elsewhere").mkdir()
    moved = _copy_dataset(indexed_prefix, str(tmp_path / "elsewhere" / os.path.basename(indexed_prefix)))
    moved_tok = build_tokenizer("HuggingFaceTokenizer", shutil.copytree(SAMPLE_TOKENIZER, str(tmp_path / "tok")))
    here = build_mlm_datasets(_config(sample_tokenizer, [indexed_prefix], cache=str(tmp_path / "c1")),
                              [300, None, None])[0]
    there = build_mlm_datasets(_config(moved_tok, [moved], cache=str(tmp_path / "c2")), [300, None, None])[0]
    assert numpy.array_equal(here.shuffle_index, there.shuffle_index)
    for i in (0, 7, 299):
        assert all(torch.equal(here[i][k], there[i][k]) for k in here[i])


def test_sample_i_does_not_depend_on_the_number_of_samples(sample_tokenizer, indexed_prefix, tmp_path):
    """Asking for more samples (a run extended by resuming) only appends: single datasets and
    weighted blends, packed and padded."""
    subset = str(tmp_path / "plus1024")
    make_length_subset(indexed_prefix, subset, 1024)
    for blend, weights, packed in (([indexed_prefix], None, True), ([indexed_prefix], None, False),
                                   ([indexed_prefix, subset], [0.7, 0.3], True)):
        config = lambda: _config(sample_tokenizer, blend, weights, cache=str(tmp_path / "c"),
                                 packed=packed, split="90,10,0")
        short = build_mlm_datasets(config(), [900, 100, 0])
        long = build_mlm_datasets(config(), [2600, 300, 0])
        assert len(long[0]) > len(short[0]) and len(long[1]) > len(short[1])  # more epochs
        for a, b in ((short[0], long[0]), (short[1], long[1])):
            for i in range(len(a) - 5, len(a)):
                assert all(torch.equal(torch.as_tensor(a[i][k]), torch.as_tensor(b[i][k])) for k in a[i])


def test_index_cache_is_built_once(sample_tokenizer, indexed_prefix, tmp_path, monkeypatch):
    import megatron_neobert.data.datasets.mlm_dataset as mlm
    cache = str(tmp_path / "cache")
    first = build_mlm_datasets(_config(sample_tokenizer, [indexed_prefix], cache=cache,
                                       split="90,5,5"), [None] * 3)
    assert len([f for f in os.listdir(cache) if f.endswith(".npy")]) == 3 * 6
    monkeypatch.setattr(mlm.MLMDataset, "_epochs",
                        lambda self: pytest.fail("layout recomputed despite the cache"))
    again = build_mlm_datasets(_config(sample_tokenizer, [indexed_prefix], cache=cache,
                                       split="90,5,5"), [None] * 3)
    for a, b in zip(first, again):
        assert len(a) == len(b) and torch.equal(a[3]["tokens"], b[3]["tokens"])
    # the splits hold disjoint documents
    docs = [set(d.documents.tolist()) for d in first]
    assert not (docs[0] & docs[1]) and not (docs[0] & docs[2]) and not (docs[1] & docs[2])


def _layout_files(cache):
    return sorted(f for f in os.listdir(cache) if "-layout" in f)


def test_a_cache_of_another_layout_or_cut_short_is_rebuilt_with_a_line(sample_tokenizer, indexed_prefix, tmp_path,
                                                                      caplog):
    """Layout 3's files (what this package wrote before the per-sample layout) are not read: a line says the layout
    is built beside them. A file of the layout missing or cut short: a line says why it is rebuilt."""
    import logging
    cache = str(tmp_path / "cache")
    config = lambda: _config(sample_tokenizer, [indexed_prefix], cache=cache, seq=128)  # noqa: E731
    want = build_mlm_datasets(config(), [None] * 3)[0]
    names = _layout_files(cache)
    for name in names:  # the same dataset's files, as layout 3 named them
        os.replace(os.path.join(cache, name), os.path.join(cache, name.replace("-layout4-", "-layout3-")))
    with caplog.at_level(logging.INFO, logger="megatron_neobert.data.datasets.mlm_dataset"):
        again = build_mlm_datasets(config(), [None] * 3)[0]
    lines = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert len(lines) == 1 and "as an earlier version of this package wrote it" in lines[0], lines
    assert "-layout3-train-description.txt" in lines[0] and "building layout 4 beside it" in lines[0]
    assert torch.equal(again[5]["tokens"], want[5]["tokens"])
    for damage in ("cut", "missing"):
        offsets = os.path.join(cache, next(n for n in names if n.endswith("-sample_offset.npy")))
        if damage == "cut":
            with open(offsets, "r+b") as f:
                f.truncate(os.path.getsize(offsets) - 4)
        else:
            os.remove(offsets)
        caplog.clear()
        with caplog.at_level(logging.WARNING, logger="megatron_neobert.data.datasets.mlm_dataset"):
            rebuilt = build_mlm_datasets(config(), [None] * 3)[0]
        assert [r.getMessage().split(":")[0] for r in caplog.records] == [
            f"rebuild the MLMDataset train layout in {cache}"], damage
        assert len(rebuilt) == len(want) and torch.equal(rebuilt[5]["tokens"], want[5]["tokens"])


def _build_into(args):
    prefix, cache, tok = args
    return len(build_mlm_datasets(_config(tok, [prefix], cache=cache, seq=64), [3000, None, None])[0])


@pytest.mark.integration
def test_builders_at_once_leave_one_complete_cache(sample_tokenizer, indexed_prefix, tmp_path):
    """Two jobs (or ranks) building the same layout at once: each writes under names of its own and renames, so the
    cache ends complete, with no temporary file left, and reads as one build's."""
    import multiprocessing
    cache = str(tmp_path / "cache")
    # forked by the forkserver, not by this process, whose threads (gloo's, a loader's) a plain fork copies mid-lock
    with multiprocessing.get_context("forkserver").Pool(2) as pool:
        sizes = pool.map(_build_into, [(indexed_prefix, cache, sample_tokenizer)] * 2)
    assert sizes[0] == sizes[1] >= 3000
    assert not [f for f in os.listdir(cache) if ".tmp-" in f]
    names = _layout_files(cache)
    alone = str(tmp_path / "alone")
    _build_into((indexed_prefix, alone, sample_tokenizer))
    assert names == _layout_files(alone)
    for name in names:
        with open(os.path.join(cache, name), "rb") as a, open(os.path.join(alone, name), "rb") as b:
            assert a.read() == b.read(), name


def test_blend_proportions_follow_the_weights(sample_tokenizer, indexed_prefix, tmp_path):
    subsets = []
    for threshold in (1024, 2048):
        out = str(tmp_path / f"plus{threshold}")
        make_length_subset(indexed_prefix, out, threshold)
        subsets.append(out)
    blend = parse_data_path(["0.2", indexed_prefix, "0.4", subsets[0], "0.4", subsets[1]])
    config = MLMDatasetConfig(random_seed=1, sequence_length=512, blend=blend, split="1,0,0",
                              tokenizer=sample_tokenizer, path_to_cache=str(tmp_path / "cache"))
    (train, valid, test) = build_mlm_datasets(config, [2000, 0, 0])
    assert valid is None and test is None and len(train) == 2000
    counts = numpy.bincount(numpy.asarray(train.dataset_index), minlength=3) / len(train)
    numpy.testing.assert_allclose(counts, [0.2, 0.4, 0.4], atol=0.005)
    batch = collate_mlm_batch([train[i] for i in range(8)])
    assert batch["dataset_id"].shape == (8,)


def test_parse_data_path():
    assert parse_data_path("A") == (["A"], None)
    assert parse_data_path(["A", "B"]) == (["A", "B"], None)
    assert parse_data_path("0.2 A 0.4 B 0.4 C") == (["A", "B", "C"], [0.2, 0.4, 0.4])
    for bad in (["0.2", "A", "B"], ["0.5", "A", "B", "0.5"], ["-1", "A"]):
        with pytest.raises(ValueError):
            parse_data_path(bad)


def test_megatron_lm_style_dataset_with_split_sentences_trains(sample_tokenizer, tmp_path):
    """Megatron-LM's tool with --split-sentences writes several sequences per document (int32
    when the vocabulary is large); a document is their concatenation."""
    from megatron.core.datasets.indexed_dataset import IndexedDatasetBuilder
    prefix = str(tmp_path / "mlm_style")
    rng = numpy.random.default_rng(0)
    docs = []
    builder = IndexedDatasetBuilder(prefix + ".bin", dtype=numpy.int32)
    for _ in range(40):
        sentences = [rng.integers(10, 8192, int(rng.integers(1, 30))) for _ in range(int(rng.integers(1, 6)))]
        for s in sentences:
            builder.add_item(torch.from_numpy(s))
        builder.end_document()
        docs.append(numpy.concatenate(sentences))
    builder.finalize(prefix + ".idx")
    (train, _, _) = build_mlm_datasets(_config(sample_tokenizer, [prefix], seq=64), [None] * 3)
    for i in range(len(train)):
        s = train[i]
        original = _original(s).numpy()
        for (d, start, _), a, b in zip(train.pieces(i), s["cu_seqlens"][:-1].tolist(), s["cu_seqlens"][1:].tolist()):
            numpy.testing.assert_array_equal(original[a + 1:b - 1], docs[d][start:start + b - a - 2])


def test_truncated_bin_is_refused_by_the_dataset(sample_tokenizer, indexed_prefix, tmp_path):
    import shutil
    from megatron_neobert.data.indexed import IndexedDataError
    bad = str(tmp_path / "bad")
    shutil.copy(indexed_prefix + ".idx", bad + ".idx")
    with open(indexed_prefix + ".bin", "rb") as src, open(bad + ".bin", "wb") as dst:
        dst.write(src.read()[:1000])
    with pytest.raises(Exception) as info:
        build_mlm_datasets(_config(sample_tokenizer, [bad]), [None] * 3)
    chain = [info.value] + [e for e in (info.value.__cause__, info.value.__context__) if e]
    assert any(isinstance(e, IndexedDataError) and "truncated" in str(e) for e in chain)


# ---- loaders -----------------------------------------------------------------------------------
def test_collate_offsets_cu_seqlens_over_the_flattened_batch():
    a = {"tokens": torch.arange(8), "labels": torch.zeros(8, dtype=torch.long),
         "cu_seqlens": torch.tensor([0, 3, 8], dtype=torch.int32)}
    b = {"tokens": torch.arange(8), "labels": torch.zeros(8, dtype=torch.long),
         "cu_seqlens": torch.tensor([0, 8], dtype=torch.int32)}
    batch = collate_mlm_batch([a, b])
    assert batch["tokens"].shape == (2, 8)
    assert batch["cu_seqlens"].tolist() == [0, 3, 8, 16] and batch["cu_seqlens"].dtype == torch.int32


def _batches(loader):
    return [{k: v for k, v in b.items()} for b in loader]


def test_loader_resumes_and_shards_deterministically(sample_tokenizer, indexed_prefix, tmp_path):
    (train, _, _) = build_mlm_datasets(_config(sample_tokenizer, [indexed_prefix],
                                               cache=str(tmp_path)), [64, None, None])
    full = _batches(build_data_loader(train, 4, 0, num_workers=0))
    resumed = _batches(build_data_loader(train, 4, 12, num_workers=0))
    assert len(full) == len(train) // 4 and len(resumed) == len(full) - 3
    for x, y in zip(full[3:], resumed):
        assert all(torch.equal(x[k], y[k]) if torch.is_tensor(x[k]) else x[k] == y[k] for k in x)
    # two data-parallel ranks split each global batch of 2 x 2 samples
    ranks = [_batches(build_data_loader(train, 2, 0, r, 2, num_workers=0)) for r in (0, 1)]
    for k, batch in enumerate(full):
        assert torch.equal(torch.cat([ranks[0][k]["tokens"], ranks[1][k]["tokens"]]), batch["tokens"])
    two_workers = _batches(build_data_loader(train, 4, 0, num_workers=2))
    assert all(torch.equal(x["tokens"], y["tokens"]) for x, y in zip(full, two_workers))


@pytest.mark.parametrize("packed", [True, False])
def test_dali_loader_yields_the_same_batches_as_torch(sample_tokenizer, indexed_prefix, tmp_path,
                                                      packed):
    pytest.importorskip("nvidia.dali", reason="NVIDIA DALI is not installed "
                        "(pip install nvidia-dali-cuda130; the NGC container has it)")
    (train, _, _) = build_mlm_datasets(_config(sample_tokenizer, [indexed_prefix], packed=packed,
                                               cache=str(tmp_path)), [None] * 3)
    reference = _batches(build_data_loader(train, 3, 6, num_workers=0))
    dali = _batches(build_data_loader(train, 3, 6, num_workers=0, loader="dali"))
    assert len(dali) == len(reference) > 0
    for x, y in zip(reference, dali):
        assert x.keys() == y.keys()
        for k in x:
            if torch.is_tensor(x[k]):
                assert x[k].dtype == y[k].dtype and torch.equal(x[k], y[k]), k
            else:
                assert x[k] == y[k]


# ---- data checks -------------------------------------------------------------------------------
def _copy_dataset(prefix, dst):
    import shutil
    for ext in (".bin", ".idx", ".tokenizer.json"):
        if os.path.exists(prefix + ext):
            shutil.copy(prefix + ext, dst + ext)
    return dst


def test_token_ids_beyond_the_vocabulary_stop_before_training(sample_tokenizer, indexed_prefix,
                                                               tmp_path):
    import json
    bad = _copy_dataset(indexed_prefix, str(tmp_path / "other_vocab"))
    with open(bad + ".tokenizer.json") as f:
        record = json.load(f)
    with open(bad + ".tokenizer.json", "w") as f:
        json.dump({**record, "vocab_size": 30522, "max_token_id": 30000}, f)
    with pytest.raises(ValueError, match=r"dataset .*other_vocab was tokenized with .*vocabulary "
                                         r"30,522, largest id 30,000.* 8,192 entries"):
        build_mlm_datasets(_config(sample_tokenizer, [indexed_prefix, bad], [0.5, 0.5],
                                   cache=str(tmp_path)), [10, 0, 0])


def _segments(dataset, tok):
    """Every attention segment of every sample, as original (unmasked) token arrays."""
    for i in range(len(dataset)):
        sample = dataset[i]
        cu, original = sample["cu_seqlens"].tolist(), _original(sample).numpy()
        yield from (original[a:b] for a, b in zip(cu[:-1], cu[1:]))


@pytest.mark.parametrize("written_with", ["append_eod", "cls_sep_no_record"])
def test_special_tokens_in_the_data_are_not_doubled(written_with, sample_tokenizer, corpus_slice,
                                                     expected_ids, tmp_path):
    from megatron.core.datasets.indexed_dataset import IndexedDatasetBuilder
    from megatron_neobert.data.preprocessing.preprocess import preprocess_data
    tok = sample_tokenizer
    if written_with == "append_eod":
        prefix = preprocess_data([corpus_slice[0]], str(tmp_path / "eod"), tokenizer_model=SAMPLE_TOKENIZER,
                                 append_eod=True, progress=False, json_keys=["content"]).outputs["content"]
    else:  # as a tool whose tokenizer adds [CLS] ... [SEP] writes it, without our record
        prefix = str(tmp_path / "cls_sep")
        builder = IndexedDatasetBuilder(prefix + ".bin", dtype=numpy.uint16)
        for ids in expected_ids:
            builder.add_document([tok.cls_id, *ids, tok.sep_id], [len(ids) + 2])
        builder.finalize(prefix + ".idx")
    train = build_mlm_datasets(_config(tok, [prefix], cache=str(tmp_path / "c")), [None] * 3)[0]
    special = numpy.array(sorted(tok.special_ids | {tok.eod_id}))
    tokens = 0
    for seg in _segments(train, tok):
        assert seg[0] == tok.cls_id and seg[-1] == tok.sep_id
        assert not numpy.isin(seg[1:-1], special).any()
        tokens += len(seg) - 2
    assert tokens >= sum(len(ids) for ids in expected_ids)


def test_a_length_subset_blend_never_trains_on_a_validation_document(sample_tokenizer,
                                                                     indexed_prefix, tmp_path):
    subsets = []
    for threshold in (1024, 2048):
        subsets.append(str(tmp_path / f"plus{threshold}"))
        make_length_subset(indexed_prefix if threshold == 1024 else subsets[0], subsets[-1], threshold)
    config = _config(sample_tokenizer, [indexed_prefix, *subsets], [0.2, 0.4, 0.4],
                     cache=str(tmp_path / "c"), split="80,20,0", seq=512)
    train, valid, _ = build_mlm_datasets(config, [300, 100, 0])

    def corpus_docs(blended):
        docs = set()
        for ds in blended.datasets:
            d = numpy.unique(ds.documents)
            if ds.dataset_path != indexed_prefix:
                d = numpy.load(ds.dataset_path + ".source_ids.npy")[d]
            docs |= set(d.tolist())
        return docs

    held_out = corpus_docs(valid)
    assert len(held_out) >= 20 and not held_out & corpus_docs(train)


def test_cache_built_ahead_is_what_the_trainer_loads(sample_tokenizer, indexed_prefix, tmp_path,
                                                     monkeypatch):
    import json
    import megatron_neobert.data.datasets.mlm_dataset as mlm
    from megatron_neobert.data.datasets.trainer_datasets import build_trainer_datasets
    from megatron_neobert.training.config.arguments import parse_settings
    from tools.build_data_cache import main
    subset = str(tmp_path / "plus1024")
    make_length_subset(indexed_prefix, subset, 1024)
    args_file = tmp_path / "blend.txt"
    args_file.write_text(f"0.7 {indexed_prefix}\n0.3 {subset}\n")
    flags = ["--data-args-path", str(args_file), "--data-cache-path", str(tmp_path / "cache"),
             "--tokenizer-model", SAMPLE_TOKENIZER, "--seq-length", "128", "--train-iters", "20",
             "--global-batch-size", "8", "--micro-batch-size", "8", "--eval-interval", "10",
             "--eval-iters", "2", "--lr-warmup-iters", "2", "--split", "90,10,0"]
    assert main(flags) == 0
    monkeypatch.setattr(mlm.MLMDataset, "_epochs",
                        lambda self: pytest.fail("layout built again"))
    train, valid, _ = build_trainer_datasets(parse_settings(flags), sample_tokenizer)
    assert len(train) == 160 and len(valid) >= 48
    per_split = tmp_path / "per_split.json"  # Megatron-LM's --per-split-data-args-path
    per_split.write_text(json.dumps({"train": [indexed_prefix], "valid": f"1 {subset}", "test": []}))
    monkeypatch.undo()
    train, valid, test = build_trainer_datasets(
        parse_settings([f if f != "--data-args-path" else "--per-split-data-args-path"
                    for f in flags[:1]] + [str(per_split)] + flags[2:]), sample_tokenizer)
    assert valid.dataset_path == subset and test is None
    assert train.dataset_path == indexed_prefix
    with pytest.raises(ValueError, match="exactly one of --data-path, --data-args-path"):
        parse_settings(flags + ["--data-path", indexed_prefix])
