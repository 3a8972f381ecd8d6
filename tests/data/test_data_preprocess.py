"""tools/preprocess_data.py and its library: formats, parallel equality, bad input, safe output."""

import gzip
import json
import os
import re

import numpy
import pytest
from data_helpers import file_bytes, listing, megatron_lm_pair, read_documents, write_jsonl

from megatron_neobert.atomic_write import write_json_atomic
from megatron_neobert.data.assets import SAMPLE_TOKENIZER
from megatron_neobert.data.indexed import IndexedDataError, check_indexed
from megatron_neobert.data.preprocessing.preprocess import preprocess_data
from megatron_neobert.data.preprocessing.readers import DataInputError


def _run(inputs, prefix, **kw):
    kw.setdefault("tokenizer_model", SAMPLE_TOKENIZER)
    kw.setdefault("json_keys", ["content"])  # the sample corpus's field (Megatron-LM's default is text)
    return preprocess_data(inputs, prefix, progress=False, **kw)


def test_readback_equals_the_tokenizer_and_reads_with_megatron_core(indexed_prefix, expected_ids):
    from megatron.core.datasets.indexed_dataset import IndexedDataset
    assert indexed_prefix.endswith("slice_content_document")
    ds = IndexedDataset(indexed_prefix)  # megatron-core's own reader, no check of ours
    assert len(ds) == len(expected_ids) and ds.index.dtype == numpy.uint16  # 8192 < 65500
    for i, ids in enumerate(expected_ids):
        numpy.testing.assert_array_equal(ds[i], ids)


def test_two_workers_write_the_same_bytes_as_one(corpus_slice, indexed_prefix, tmp_path):
    stats = _run([corpus_slice[0]], str(tmp_path / "w2"), workers=2, chunk_documents=16)
    assert file_bytes(stats.outputs["content"]) == file_bytes(indexed_prefix)
    assert stats.documents == 240 and stats.tokens > 100_000 and stats.tokens_per_second > 0
    assert "tokens/s" in stats.summary()


def test_jsonl_gz_zst_folder_and_datasets_inputs_agree(corpus_slice, expected_ids, tmp_path):
    import datasets
    import zstandard
    texts = corpus_slice[1]
    rows = [{"content": t, "url": f"u{i}"} for i, t in enumerate(texts)]
    src = tmp_path / "src"
    src.mkdir()
    # Three partitions in three formats; sorted file order = a.jsonl, b.jsonl.gz, c.jsonl.zst.
    write_jsonl(src / "a.jsonl", rows[:50])
    write_jsonl(src / "b.jsonl.gz", rows[50:120], opener=gzip.open)
    with open(src / "c.jsonl.zst", "wb") as f:
        f.write(zstandard.ZstdCompressor().compress(
            "".join(json.dumps(r) + "\n" for r in rows[120:]).encode()))
    stats = _run([str(src)], str(tmp_path / "folder"))
    docs = read_documents(stats.outputs["content"])
    assert len(docs) == len(texts)
    assert all(numpy.array_equal(a, b) for a, b in zip(docs, expected_ids))
    assert not [name for name in listing(tmp_path) if name.startswith(".preprocess-")]

    hf_dir = str(tmp_path / "hf")
    datasets.Dataset.from_dict({"content": texts[:30], "url": ["x"] * 30}).save_to_disk(hf_dir)
    stats = _run([hf_dir], str(tmp_path / "hf_out"))
    assert all(numpy.array_equal(a, b)
               for a, b in zip(read_documents(stats.outputs["content"]), expected_ids[:30]))

    stats = _run([str(src / "*.jsonl")], str(tmp_path / "glob"))  # a glob
    assert stats.documents == 50


def test_skippable_records_are_counted_and_named(corpus_slice, expected_ids, tmp_path, caplog):
    path = tmp_path / "messy.jsonl"
    good = corpus_slice[1][:3]
    with open(path, "wb") as f:
        f.write((json.dumps({"content": good[0]}) + "\n").encode())
        f.write(b'{"content": "broken\n')  # not JSON
        f.write(b'{"content": "caf\xe9 latin-1"}\n')  # not UTF-8
        f.write((json.dumps({"content": "   "}) + "\n").encode())  # kept: an empty document
        f.write((json.dumps({"content": None}) + "\n").encode())
        f.write((json.dumps({"content": good[1]}) + "\n").encode())
        f.write((json.dumps({"content": good[2]}) + "\n").encode())
    with caplog.at_level("WARNING"):
        stats = _run([str(path)], str(tmp_path / "messy"))
    assert stats.documents == 4
    assert stats.skipped == {"not JSON": 1, "not UTF-8": 1, "null text": 1}
    assert f"{path}, record 2: not JSON" in caplog.text
    assert f"{path}, record 3: not UTF-8" in caplog.text
    docs = read_documents(stats.outputs["content"])
    assert [len(d) for d in docs][1] == 0
    assert all(numpy.array_equal(a, b) for a, b in zip(docs[:1] + docs[2:], expected_ids[:3]))


def test_missing_text_field_fails_without_touching_existing_output(corpus_slice, tmp_path):
    out_dir = tmp_path / "out"
    prefix = str(out_dir / "out")
    stats = _run([corpus_slice[0]], prefix)
    before, files = file_bytes(stats.outputs["content"]), listing(out_dir)
    with pytest.raises(DataInputError, match=r"slice.parquet: no column 'contnt'.*content"):
        _run([corpus_slice[0]], prefix, json_keys=["contnt"])
    jsonl = tmp_path / "rows.jsonl"
    write_jsonl(jsonl, [{"content": "fine text"}, {"text": "field renamed"}])
    with pytest.raises(DataInputError, match=r"rows.jsonl, record 2: no field 'content'"):
        _run([str(jsonl)], prefix)
    assert file_bytes(stats.outputs["content"]) == before
    assert listing(out_dir) == files  # no .partial file, no scratch folder left


def test_interrupted_run_leaves_no_pair_that_looks_complete(corpus_slice, tmp_path, monkeypatch):
    import megatron_neobert.data.preprocessing.preprocess as pre
    calls = {"n": 0}
    real = pre._encode

    def interrupt(*args):
        calls["n"] += 1
        if calls["n"] == 10:  # in the second partition, after the first is written
            raise KeyboardInterrupt
        return real(*args)

    monkeypatch.setattr(pre, "_encode", interrupt)
    with pytest.raises(KeyboardInterrupt):
        _run([corpus_slice[0], corpus_slice[0]], str(tmp_path / "cut"), chunk_documents=32)
    assert listing(tmp_path) == ["cut_shards"]  # no output pair; the first shard, complete
    assert listing(tmp_path / "cut_shards") == [
        "000000-slice.parquet_content.bin", "000000-slice.parquet_content.idx",
        "000000-slice.parquet_content.tokenizer.json", "manifest.json"]


def test_cli_exit_codes(corpus_slice, tmp_path, capsys):
    from tools.preprocess_data import main
    prefix = str(tmp_path / "cli")
    assert main(["--json-keys", "content", "--input", corpus_slice[0], "--output-prefix", prefix, "--tokenizer-model",
                 SAMPLE_TOKENIZER, "--workers", "1", "--no-progress"]) == 0
    assert "240 documents" in capsys.readouterr().out
    check_indexed(prefix + "_content_document")
    assert main(["--json-keys", "content", "--input", corpus_slice[0], "--output-prefix", prefix, "--tokenizer-model",
                 str(tmp_path / "nope"), "--no-progress"]) == 1
    assert "nope" in capsys.readouterr().err
    assert main(["--json-keys", "content", "--input", str(tmp_path / "missing.parquet"), "--output-prefix", prefix,
                 "--tokenizer-model", SAMPLE_TOKENIZER, "--no-progress"]) == 1
    assert "missing.parquet" in capsys.readouterr().err


def test_truncated_bin_and_mismatched_idx_are_detected(indexed_prefix, tmp_path):
    import shutil
    bad = str(tmp_path / "bad")
    shutil.copy(indexed_prefix + ".idx", bad + ".idx")
    with open(indexed_prefix + ".bin", "rb") as src, open(bad + ".bin", "wb") as dst:
        dst.write(src.read()[:-100])
    with pytest.raises(IndexedDataError, match=r"bad.bin is \d+ bytes .* truncated"):
        check_indexed(bad)
    with open(bad + ".idx", "r+b") as f:  # an index cut short
        f.truncate(os.path.getsize(bad + ".idx") - 8)
    with pytest.raises(IndexedDataError, match="bad.idx .* truncated or corrupt"):
        check_indexed(bad)
    os.remove(bad + ".bin")
    with pytest.raises(IndexedDataError, match="bad.bin not found"):
        check_indexed(bad)


# ---- Megatron-LM's behaviour, shards, resume, nodes ---------------------------------------------
@pytest.mark.parametrize("append_eod", [False, True])
def test_bytes_equal_megatron_lm_with_empty_documents(corpus_slice, sample_tokenizer, append_eod,
                                                      tmp_path):
    texts = corpus_slice[1][:20]
    texts = texts[:5] + ["", " \n "] + texts[5:]
    path = tmp_path / "in.jsonl"
    write_jsonl(path, [{"content": t} for t in texts])
    stats = _run([str(path)], str(tmp_path / "ours"), append_eod=append_eod, workers=2,
                 chunk_documents=4)
    megatron_lm_pair([[t] for t in texts], str(tmp_path / "theirs"), append_eod,
                     sample_tokenizer.eod_id)
    assert file_bytes(stats.outputs["content"]) == file_bytes(str(tmp_path / "theirs"))
    docs = read_documents(stats.outputs["content"])
    assert len(docs) == len(texts) and len(docs[5]) == len(docs[6]) == 0  # document i = record i
    assert (docs[0][-1] == sample_tokenizer.eod_id) == append_eod


@pytest.mark.integration
def test_wordpiece_append_eod_is_megatron_lms_and_trains(corpus_slice, tmp_path):
    """Megatron-LM's BERT tokenizers append [BOS] [EOS] to a vocab.txt and end documents with that [EOS]:
    our BertWordPiece output is its bytes, and its tool's output (no record beside it) trains."""
    from megatron_neobert.data.tokenizer import build_tokenizer
    from megatron_neobert.parallel.launch import run_on_ranks
    from pretrain_cases import run_train

    vocab = os.path.join(SAMPLE_TOKENIZER, "vocab.txt")
    wordpiece = build_tokenizer("BertWordPieceLowerCase", vocab)
    assert (wordpiece.base_vocab_size, wordpiece.vocab_size, wordpiece.eod_id) == (8192, 8194, 8193)
    texts = corpus_slice[1][:60]
    path = tmp_path / "in.jsonl"
    write_jsonl(path, [{"content": t} for t in texts])
    ours = _run([str(path)], str(tmp_path / "ours"), append_eod=True, tokenizer_type="BertWordPieceLowerCase",
                tokenizer_model=vocab).outputs["content"]
    theirs = str(tmp_path / "theirs")
    megatron_lm_pair([[t] for t in texts], theirs, append_eod=True, eod=8193)
    assert file_bytes(ours) == file_bytes(theirs)
    history = run_on_ranks(run_train, 1, [
        "--model-preset", "neobert-tiny", "--num-layers", "1", "--data-path", theirs, "--vocab-file", vocab,
        "--seq-length", "64", "--micro-batch-size", "2", "--global-batch-size", "2", "--train-iters", "3",
        "--lr-warmup-iters", "0", "--eval-interval", "0", "--num-workers", "1", "--split", "100,0,0",
        "--data-cache-path", str(tmp_path / "cache")])[0]
    assert history["iteration"] == 3 and all(numpy.isfinite(r["loss"]) for r in history["train"])


def _three_files(corpus_slice, folder):
    folder.mkdir()
    texts = corpus_slice[1]
    for i, part in enumerate((texts[:40], texts[40:41], texts[41:90])):
        write_jsonl(folder / f"part{i}.jsonl", [{"content": t} for t in part])
    return str(folder)


def test_partitions_and_workers_do_not_change_the_bytes(corpus_slice, tmp_path):
    src = _three_files(corpus_slice, tmp_path / "src")
    one = _run([src], str(tmp_path / "one"))
    many = _run([src], str(tmp_path / "many"), partitions=2, workers=2)
    assert file_bytes(one.outputs["content"]) == file_bytes(many.outputs["content"])
    assert listing(tmp_path) == sorted(["src"] + [f"{n}_content_document{ext}" for n in ("one", "many")
                                                  for ext in (".bin", ".idx", ".tokenizer.json")])


def test_a_killed_run_resumes_from_its_complete_shards(corpus_slice, tmp_path, monkeypatch):
    import megatron_neobert.data.preprocessing.preprocess as pre
    src = _three_files(corpus_slice, tmp_path / "src")
    reference = _run([src], str(tmp_path / "reference"))
    real, calls = pre._encode, []

    def killed_in_the_third_file(tokenizer, columns, *args):
        calls.append(columns[0][0])
        if columns[0][0] == corpus_slice[1][41]:
            raise KeyboardInterrupt
        return real(tokenizer, columns, *args)

    monkeypatch.setattr(pre, "_encode", killed_in_the_third_file)
    with pytest.raises(KeyboardInterrupt):
        _run([src], str(tmp_path / "out"))
    monkeypatch.setattr(pre, "_encode", real)
    resumed = _run([src], str(tmp_path / "out"))
    assert resumed.shards_done_before == 2
    assert resumed.documents == 49  # only the third file was tokenized again
    assert file_bytes(resumed.outputs["content"]) == file_bytes(reference.outputs["content"])


def test_nodes_write_shards_and_the_merge_tool_joins_them(corpus_slice, tmp_path, capsys, caplog):
    import shlex

    from tools.merge_datasets import main as merge
    src = _three_files(corpus_slice, tmp_path / "src")
    reference = _run([src], str(tmp_path / "reference"))
    shards = str(tmp_path / "rw_shards")
    rank1 = _run([src], str(tmp_path / "rw"), rank=1, world_size=2)
    assert rank1.documents == 1 and not os.path.exists(str(tmp_path / "rw_content_document.idx"))
    out = str(tmp_path / "merged")
    assert merge(["--shard-dir", shards, "--output-prefix", out]) == 1  # rank 0 not done yet
    assert "2 of 3 shards are not complete" in capsys.readouterr().err
    with caplog.at_level("INFO"):
        _run([src], str(tmp_path / "rw"), rank=0, world_size=2)
    hint = re.search(r"merge the shards once every rank is done: (.*)", caplog.text).group(1)
    command = shlex.split(hint)
    assert command[0] == "neobert-merge-datasets" and ";" not in hint
    assert merge(command[1:]) == 0
    # The names a single-rank run writes and docs/data.md gives, with the same bytes.
    assert listing(tmp_path) == ["reference_content_document.bin", "reference_content_document.idx",
                                 "reference_content_document.tokenizer.json", "rw_content_document.bin",
                                 "rw_content_document.idx", "rw_content_document.tokenizer.json",
                                 "rw_shards", "src"]
    assert file_bytes(str(tmp_path / "rw_content_document")) == file_bytes(reference.outputs["content"])


def test_an_input_edited_with_its_size_and_time_kept_is_tokenized_again(corpus_slice, tmp_path,
                                                                       caplog):
    from megatron_neobert.data.preprocessing.merge import merge_datasets
    from megatron_neobert.data.preprocessing.preprocess import shards_of
    src = _three_files(corpus_slice, tmp_path / "src")
    before = file_bytes(_run([src], str(tmp_path / "before")).outputs["content"])
    for rank in (0, 1):
        _run([src], str(tmp_path / "rw"), rank=rank, world_size=2)
    part0 = os.path.join(src, "part0.jsonl")
    data, st = open(part0, "rb").read(), os.stat(part0)
    at = data.index(b" the ", len(data) // 2)  # mid-file: neither the first nor the last block
    with open(part0, "r+b") as f:
        f.seek(at)
        f.write(b" thy ")
    os.utime(part0, ns=(st.st_atime_ns, st.st_mtime_ns))
    assert (os.stat(part0).st_size, os.stat(part0).st_mtime_ns) == (st.st_size, st.st_mtime_ns)
    after = file_bytes(_run([src], str(tmp_path / "after")).outputs["content"])
    assert after != before
    with caplog.at_level("WARNING"):
        rank0 = _run([src], str(tmp_path / "rw"), rank=0, world_size=2)
    assert rank0.shards_done_before == 1 and rank0.documents == 40  # part2 kept, part0 redone
    assert caplog.messages == [f"{part0}: same size and modification time as its shard's input, "
                               "other content: tokenizing it again"]
    merge_datasets(shards_of(str(tmp_path / "rw_shards"), "content"), str(tmp_path / "merged"))
    assert file_bytes(str(tmp_path / "merged")) == after

    record = str(tmp_path / "rw_shards" / "000002-part2.jsonl_content.tokenizer.json")
    with open(record) as f:
        older = {k: v for k, v in json.load(f).items() if k != "input_sha256"}
    write_json_atomic(record, older)  # as an older version wrote it: nothing proves its content
    caplog.clear()
    with caplog.at_level("WARNING"):
        rank0 = _run([src], str(tmp_path / "rw"), rank=0, world_size=2)
    assert rank0.shards_done_before == 1 and rank0.documents == 49  # part0 kept, part2 redone
    assert caplog.messages == [f"{os.path.join(src, 'part2.jsonl')}: its shard records no content "
                               "fingerprint (an older version wrote it): tokenizing it again"]


def test_a_shard_folder_merges_from_anywhere_moved_or_copied(corpus_slice, tmp_path, monkeypatch,
                                                             capsys):
    import shutil

    from tools.merge_datasets import main as merge
    src = _three_files(corpus_slice, tmp_path / "src")
    reference = file_bytes(_run([src], str(tmp_path / "reference")).outputs["content"])
    (tmp_path / "job").mkdir()
    monkeypatch.chdir(tmp_path / "job")  # ranks given relative paths, as a job array's are
    for rank in (0, 1):
        _run([src], "B/B", rank=rank, world_size=2)
    monkeypatch.chdir(tmp_path)
    shards = str(tmp_path / "job" / "B" / "B_shards")
    assert merge(["--shard-dir", shards, "--output-prefix", "here"]) == 0
    assert file_bytes(str(tmp_path / "here")) == reference
    moved = str(tmp_path / "moved_shards")
    shutil.move(shards, moved)
    assert merge(["--shard-dir", moved, "--output-prefix", "moved"]) == 0
    assert file_bytes(str(tmp_path / "moved")) == reference
    copy = str(tmp_path / "copy_shards")
    shutil.copytree(moved, copy)
    os.remove(os.path.join(moved, "000001-part1.jsonl_content.bin"))  # the copy never reads it
    assert merge(["--shard-dir", copy, "--output-prefix", "copy"]) == 0
    assert file_bytes(str(tmp_path / "copy")) == reference

    manifest = os.path.join(copy, "manifest.json")
    with open(manifest) as f:
        listed = json.load(f)
    outside = "../moved_shards/000000-part0.jsonl_content"
    write_json_atomic(manifest, {**listed, "shards": [[outside]] + listed["shards"][1:]})
    assert merge(["--shard-dir", copy, "--output-prefix", "outside"]) == 1
    assert capsys.readouterr().err == (f"error: {manifest} lists {outside!r}, outside its folder: "
                                       "a shard manifest names only files of its own folder\n")
    # An older version's manifest: the paths the ranks were given, taken by name in the folder.
    write_json_atomic(manifest, {"keys": ["content"], "shards": [
        [f"B/B_shards/{shard[0]}"] for shard in listed["shards"]]})
    assert merge(["--shard-dir", copy, "--output-prefix", "older"]) == 0
    assert file_bytes(str(tmp_path / "older")) == reference
    os.remove(os.path.join(copy, "000002-part2.jsonl_content.tokenizer.json"))
    assert merge(["--shard-dir", copy, "--output-prefix", "older"]) == 1
    assert "lists 'B/B_shards/000002-part2.jsonl_content', not complete in" in capsys.readouterr().err


def test_an_empty_input_never_replaces_a_dataset(corpus_slice, tmp_path):
    prefix = str(tmp_path / "out")
    good = _run([corpus_slice[0]], prefix)
    before = file_bytes(good.outputs["content"])
    (tmp_path / "empty.jsonl").write_text("")
    with pytest.raises(ValueError, match="holds no document: .*out_content_document is left as it was"):
        _run([str(tmp_path / "empty.jsonl")], prefix)
    assert file_bytes(good.outputs["content"]) == before


def test_a_huge_document_is_encoded_in_slices_with_the_same_ids(corpus_slice, sample_tokenizer,
                                                               monkeypatch):
    import megatron_neobert.data.tokenizer as tokenizer_module
    text = " ".join(corpus_slice[1][:30])
    whole = sample_tokenizer.tokenize(text)
    monkeypatch.setattr(tokenizer_module, "HUGE_TEXT", 2000)
    assert len(text) > 20 * 2000
    assert list(sample_tokenizer.tokenize_documents(["short", text])[1]) == whole


def test_a_huge_document_does_not_take_gigabytes(tmp_path):
    import subprocess
    import sys
    script = f"""
import resource, numpy, sys
sys.path.insert(0, {os.getcwd()!r})
from megatron_neobert.data.tokenizer import build_tokenizer
tok = build_tokenizer("HuggingFaceTokenizer", {SAMPLE_TOKENIZER!r})
text = "the quick brown fox jumps over the lazy dog 12345 " * 100_000  # 5 MB, 1.4M tokens
before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
ids = tok.tokenize_documents([text])[0]
print(len(ids), (resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - before) // 1024)
"""
    out = subprocess.run([sys.executable, "-c", script], check=True, capture_output=True, text=True,
                         env=dict(os.environ, TOKENIZERS_PARALLELISM="false")).stdout.split()
    assert int(out[0]) == 1_400_000
    assert int(out[1]) < 250  # MB; the backend's whole-text encoding takes about 750


def test_bert_word_piece_vocab_file_gives_the_same_ids(corpus_slice, expected_ids, tmp_path):
    from tools.preprocess_data import main
    prefix = str(tmp_path / "wp")
    assert main(["--json-keys", "content", "--input", corpus_slice[0], "--output-prefix", prefix, "--tokenizer-type",
                 "BertWordPieceLowerCase", "--vocab-file", os.path.join(SAMPLE_TOKENIZER, "vocab.txt"),
                 "--no-progress"]) == 0
    docs = read_documents(prefix + "_content_document")
    assert all(numpy.array_equal(a, b) for a, b in zip(docs, expected_ids))


@pytest.mark.integration  # fresh processes build datasets (the trainer's path), 30-90 s
def test_the_data_benchmark_runs_its_parts_on_the_same_tokens(corpus_slice, capsys):
    """tools/benchmark_data.py end to end on a slice: the plain loop, Megatron-LM's loop and
    preprocess_data must count the same tokens (the script asserts it) before any ratio is printed."""
    from tools.benchmark_data import main
    main(["--corpus", corpus_slice[0], "--repeats", "1", "--layout-documents", "20000", "--seq-length", "256",
          "--blend-prefixes", "3", "--merge-documents", "4000"])
    out = capsys.readouterr().out
    assert f"({len(corpus_slice[1]):,} documents," in out
    assert re.search(r"speed-up: \d+\.\d\dx Megatron-LM's loop", out)
    assert re.search(r"RefinedWeb's 600B tokens at [\d,]+ tokens/s per worker: [\d,]+ worker-hours", out)
    for mode in ("packed", "padded"):  # the layout table: seconds, MB, MB, samples, us/doc, 1B docs
        assert re.search(rf"^   {mode} +\d+\.\d +[\d,]+ +[\d,]+ +[\d,]+ +\d+\.\d\d +\d+\.\d min$", out, re.M), out
    # the trainer's build beside it: cold and warm, Megatron-LM's data and ours; then the blend's start
    for data in ("Megatron-LM's", "ours"):
        assert re.search(rf"^   {data} +cold +\d+\.\d{{3}}( +[\d,]+){{3}} +\d+\.\d{{3}}\n +warm ", out, re.M), out
    # megatron-core's GPTDataset build of the same index beside ours: samples, seconds, peak and cache, the ratios
    for build in ("ours \\(MLMDataset, packed\\)", "megatron-core GPTDataset"):
        row = rf"^   {build} +[\d,]+ +\d+\.\d\d +[\d,]+ +[\d,]+ +\d+\.\d min, [\d,]+ GB peak"
        assert re.search(row, out, re.M), out
    assert re.search(r"^   ours / megatron-core +\d\.\d{3}( +\d+\.\d\d){3}$", out, re.M), out
    assert re.search(r"^5\. a --data-args-path blend of 3 corpora .*: first build \d+\.\d s, start with the caches "
                     r"\d+\.\d s", out, re.M), out
    assert re.search(r"^6\. a merge of 4 datasets, 4,000 documents .*\n.*faster, the same bytes$", out, re.M), out


def test_the_benchmark_s_refinedweb_like_corpus(corpus_slice, tmp_path):
    """The corpus that times preprocessing at scale, drawn from a slice of the sample corpus: as many documents as
    asked, the same bytes for a seed and others for another, lengths near RefinedWeb's mean (lognormal(6, 1): 665
    tokens), no document repeated, and distinct pieces growing by the source's Heaps' law past all the source's own
    (the long tail that the word-piece cache meets on a real corpus; reusing the source's pieces would flatter it)."""
    from megatron_neobert.data.tokenizer import build_tokenizer
    from tools.benchmark_data import _sentence_source, refinedweb_like_corpus
    lines = {}
    for name, seed in (("a", 0), ("b", 0), ("c", 1)):
        path = refinedweb_like_corpus(str(tmp_path / f"{name}.jsonl"), 1000, seed=seed, source=corpus_slice[0])
        with open(path) as f:
            lines[name] = f.read().splitlines()
    assert len(lines["a"]) == 1000 and lines["a"] == lines["b"] and lines["a"] != lines["c"]
    texts = [json.loads(line)["content"] for line in lines["a"]]
    assert len(set(texts)) == len(texts)
    tokens = build_tokenizer("HuggingFaceTokenizer", SAMPLE_TOKENIZER).tokenize_documents(texts)
    assert 0.85 < numpy.mean([len(t) for t in tokens]) / numpy.exp(6.5) < 1.15
    pieces = [p for text in texts for p in text.split()]
    source = {p for text in corpus_slice[1] for p in text.split()}
    _, _, log_k, beta, _ = _sentence_source(corpus_slice[0], SAMPLE_TOKENIZER)
    assert len(set(pieces)) > 2 * len(source)
    assert 0.95 < len(set(pieces)) / (numpy.exp(log_k) * len(pieces) ** beta) < 1.05
