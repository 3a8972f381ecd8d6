"""Tokenize RefinedWeb-style text into megatron-core ``.bin/.idx`` datasets.

The library side of ``neobert-preprocess-data``. Output names and contents follow Megatron-LM's
tool: ``{output_prefix}_{key}_document.bin/.idx``, one sequence per document (whole, never
truncated: the MLM dataset cuts them into samples), and a document for every input record, so
document i is record i. A text that gives no token (an empty one) is kept as an empty document,
as Megatron-LM keeps it; ``--append-eod`` appends the tokenizer's EOD to each non-empty document.
Only records that cannot be read at all (not JSON, not UTF-8, null) are skipped and counted.

With ``split_sentences`` (Megatron-LM's ``--split-sentences``, ``sentences.py``) each text is
split into sentences by NLTK punkt, each sentence is tokenized on its own and is one sequence
(sentences without tokens are dropped), a document holds its sentences, the EOD goes on its last
sentence, and the output is ``{output_prefix}_{key}_sentence``.

Each input file becomes one *shard* per key in ``{output_prefix}_shards/`` (written under
``.partial`` names, checked, renamed, then marked complete by its record, reused only while
its input has the same path, size, modification time and SHA-256), so a killed job
resumes where it stopped, and several nodes can share the files (``rank``/``world_size``: file i
goes to rank ``i % world_size``). With one rank the shards are merged into the output pair and
removed; with several, ``neobert-merge-datasets`` merges them once every rank is done. An input
that yields no document never replaces an existing dataset.

Documents are tokenized in batches by worker processes (BERT WordPiece tokenizers encode each
distinct piece of text once, ``tokenizer.WordPieceCache``; others use the Rust backend's batch
encoding) but written in input order, so the output does not depend on the number of workers or
partitions.
"""

import collections
import hashlib
import itertools
import json
import logging
import multiprocessing
import os
import re
import shlex
import time
from concurrent.futures import ProcessPoolExecutor, ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Dict, Iterator, List, NamedTuple, Optional, Sequence, Tuple

import numpy
from megatron.core.datasets.indexed_dataset import get_idx_path

from megatron_neobert.atomic_write import write_json_atomic
from megatron_neobert.data.indexed import check_indexed, discard_partial, partial_paths, token_dtype
from megatron_neobert.data.preprocessing.index_writer import IndexedWriter
from megatron_neobert.data.preprocessing.merge import merge_datasets
from megatron_neobert.data.preprocessing.preprocess_settings import PreprocessSettings
from megatron_neobert.data.preprocessing.readers import Record, count_records, expand_inputs, iter_records
from megatron_neobert.data.preprocessing.sentences import SentenceSplitter
from megatron_neobert.data.records import publish, read_record, record_path, tokenizer_record
from megatron_neobert.data.tokenizer import MLMTokenizer, build_tokenizer

logger = logging.getLogger(__name__)

_MAX_SKIP_WARNINGS = 20
MANIFEST = "manifest.json"


@dataclass
class PreprocessStats:
    documents: int = 0
    tokens: int = 0
    skipped: collections.Counter = field(default_factory=collections.Counter)
    seconds: float = 0.0
    outputs: Dict[str, str] = field(default_factory=dict)  # json key -> dataset prefix
    shards_done_before: int = 0  # shards found complete (resumed) and not redone
    world_size: int = 1  # ranks sharing the input: with more than one, outputs are their shard folders

    @property
    def tokens_per_second(self) -> float:
        return self.tokens / self.seconds if self.seconds > 0 else 0.0

    def add(self, other: "PreprocessStats") -> None:
        self.documents += other.documents
        self.tokens += other.tokens
        self.skipped.update(other.skipped)

    def summary(self) -> str:
        skipped = sum(self.skipped.values())
        reasons = ", ".join(f"{k}: {v}" for k, v in sorted(self.skipped.items()))
        resumed = f", {self.shards_done_before} shards already done" if self.shards_done_before else ""
        return (f"{self.documents:,} documents, {self.tokens:,} tokens, {skipped:,} skipped"
                f"{f' ({reasons})' if reasons else ''}, {self.seconds:.1f} s, "
                f"{self.tokens_per_second:,.0f} tokens/s{resumed}")


@dataclass
class _Settings:
    json_keys: List[str]
    tokenizer: MLMTokenizer
    workers: int
    chunk_documents: int
    append_eod: bool
    log_interval: int
    progress: bool
    splitter: Optional[SentenceSplitter]


# ---- worker side -------------------------------------------------------------------------------
_worker_tokenizer: Optional[MLMTokenizer] = None
_worker_splitter = None


def _init_worker(tokenizer: MLMTokenizer, splitter) -> None:
    # One thread per worker: parallelism comes from the processes, not from the Rust thread pool,
    # which would otherwise oversubscribe the cores.
    os.environ["TOKENIZERS_PARALLELISM"] = "false"
    global _worker_tokenizer, _worker_splitter
    # Forked workers inherit the parent's loaded tokenizer (it has not encoded anything yet, so
    # no Rust thread pool is copied) and splitter; under spawn they arrive pickled and are rebuilt.
    _worker_tokenizer, _worker_splitter = tokenizer, splitter


class EncodedChunk(NamedTuple):
    """The documents of a chunk for one key, as the writer takes them."""
    tokens: numpy.ndarray  # every token of the chunk, document after document
    sequence_lengths: numpy.ndarray  # int64: tokens per sequence (document, or sentence)
    document_sequences: numpy.ndarray  # int64 [documents + 1]: document d is sequences [d]:[d+1]


def _encode(tokenizer: MLMTokenizer, columns: List[List[str]], dtype, append_eod: bool,
            splitter=None) -> List[EncodedChunk]:
    """Per key, the chunk's texts tokenized in one batch call: whole, or (with a splitter) as
    sentences, a sentence without tokens dropped as Megatron-LM drops it."""
    out = []
    for texts in columns:
        pieces = [splitter.split(text) for text in texts] if splitter else [[t] for t in texts]
        flat = list(itertools.chain.from_iterable(pieces))
        ids = tokenizer.tokenize_documents(flat) if flat else []  # a chunk of empty texts
        lengths = numpy.fromiter(map(len, ids), numpy.int64, len(ids))
        tokens = (numpy.concatenate([numpy.asarray(i, dtype) for i in ids]) if ids
                  else numpy.zeros(0, dtype))
        owner = numpy.repeat(numpy.arange(len(texts)), [len(p) for p in pieces])[lengths > 0]
        lengths = lengths[lengths > 0]
        document_sequences = numpy.zeros(len(texts) + 1, numpy.int64)
        numpy.cumsum(numpy.bincount(owner, minlength=len(texts)), out=document_sequences[1:])
        if append_eod:  # Megatron-LM: on the last sentence of each non-empty document
            last = document_sequences[1:][document_sequences[1:] > document_sequences[:-1]] - 1
            ends = numpy.cumsum(lengths)[last]
            tokens = numpy.insert(tokens, ends, numpy.asarray(tokenizer.eod_id, dtype))
            lengths[last] += 1
        out.append(EncodedChunk(tokens, lengths, document_sequences))
    return out


def _encode_in_worker(columns: List[List[str]], dtype, append_eod: bool):
    return _encode(_worker_tokenizer, columns, dtype, append_eod, _worker_splitter)


# ---- one shard ---------------------------------------------------------------------------------
def _chunks(records: Iterator[Record], keys: Sequence[str], size: int, stats: PreprocessStats
            ) -> Iterator[Tuple[List[str], List[List[str]]]]:
    """Group usable records into (where-list, per-key text columns); count skipped ones."""
    wheres: List[str] = []
    columns: List[List[str]] = [[] for _ in keys]
    for record in records:
        if record.skip is not None:
            _skip(stats, record.skip, record.where)
            continue
        wheres.append(record.where)
        for column, key in zip(columns, keys):
            column.append(record.texts[key])
        if len(wheres) == size:
            yield wheres, columns
            wheres, columns = [], [[] for _ in keys]
    if wheres:
        yield wheres, columns


def _skip(stats: PreprocessStats, reason: str, where: str) -> None:
    stats.skipped[reason] += 1
    if sum(stats.skipped.values()) <= _MAX_SKIP_WARNINGS:
        logger.warning("skipping %s: %s", where, reason)
    elif sum(stats.skipped.values()) == _MAX_SKIP_WARNINGS + 1:
        logger.warning("more records skipped; the final summary counts them")


def _input_identity(path: str) -> Dict:
    st = os.stat(path)
    return {"path": os.path.abspath(path), "size": st.st_size, "mtime_ns": st.st_mtime_ns}


def file_fingerprint(path: str) -> str:
    """The SHA-256 of a whole file: an edit that keeps its size and modification time changes it
    wherever it is. 1.6 GB per CPU-second with the CPU's SHA instructions (BLAKE2b: 0.95), a small
    share of tokenizing the same bytes (docs/data.md); hashlib releases the GIL while hashing."""
    with open(path, "rb") as f:
        return hashlib.file_digest(f, "sha256").hexdigest()


def _shard_prefixes(shard_dir: str, index: int, path: str, keys: Sequence[str]) -> Dict[str, str]:
    name = re.sub(r"[^A-Za-z0-9._-]", "_", os.path.basename(os.path.normpath(path)))
    return {key: os.path.join(shard_dir, f"{index:06d}-{name}_{key}") for key in keys}


def shards_of(shard_dir: str, key: str) -> List[str]:
    """The shard prefixes of ``key`` listed by a run's manifest, in ``shard_dir``, once all are
    complete. The manifest names shards relative to its folder, so a folder merges wherever the
    merge runs and wherever it was moved or copied to. A manifest without ``version`` (older
    runs) holds the paths the preprocessing command was given: each is taken by its name in
    ``shard_dir``, never from where it points, and refused when that shard is not complete there."""
    path = os.path.join(shard_dir, MANIFEST)
    if not os.path.isfile(path):
        raise ValueError(f"{shard_dir} has no {MANIFEST}: not a preprocess_data.py shard folder")
    with open(path, encoding="utf-8") as f:
        manifest = json.load(f)
    if key not in manifest["keys"]:
        raise ValueError(f"{shard_dir} holds shards of {manifest['keys']}, not of {key!r}")
    entries = [shard[manifest["keys"].index(key)] for shard in manifest["shards"]]
    if "version" not in manifest:
        prefixes = [os.path.join(shard_dir, os.path.basename(os.path.normpath(e))) for e in entries]
        for entry, prefix in zip(entries, prefixes):
            if read_record(prefix) is None:
                raise ValueError(
                    f"{path} (an older version's, with paths as given) lists {entry!r}, not "
                    f"complete in {shard_dir}: run preprocess_data.py again with --shard-dir "
                    f"{shard_dir} to rewrite it (complete shards are skipped)")
        return prefixes
    for entry in entries:
        if entry in ("", ".", "..") or os.path.basename(entry) != entry:
            raise ValueError(f"{path} lists {entry!r}, outside its folder: a shard manifest names "
                             f"only files of its own folder")
    prefixes = [os.path.join(shard_dir, entry) for entry in entries]
    missing = [p for p in prefixes if read_record(p) is None]
    if missing:
        raise ValueError(f"{len(missing)} of {len(prefixes)} shards are not complete yet (e.g. "
                         f"{missing[0]}): wait for every rank, or run it again to resume")
    return prefixes


def _shard_is_complete(path: str, prefixes: Dict[str, str], record: Dict) -> bool:
    for prefix in prefixes.values():
        found = read_record(prefix)
        if found is None or {k: found.get(k) for k in record} != record:
            return False
        try:
            check_indexed(prefix)
        except ValueError:
            return False
    if isinstance(record["input"], dict):  # a file of the same path, size and time: its content?
        recorded = found.get("input_sha256")
        if recorded != file_fingerprint(path):
            logger.warning("%s: %s: tokenizing it again", path, "its shard records no content "
                           "fingerprint (an older version wrote it)" if recorded is None else
                           "same size and modification time as its shard's input, other content")
            return False
    return True


def _write_shard(path: str, prefixes: Dict[str, str], record: Dict, s: _Settings,
                 bar=None) -> PreprocessStats:
    """Tokenize one input file into one pair per key, published with its record."""
    stats = PreprocessStats()
    dtype = token_dtype(s.tokenizer.vocab_size)
    writers = {key: IndexedWriter(partial_paths(prefixes[key])[0], dtype) for key in s.json_keys}
    max_id = {key: -1 for key in s.json_keys}
    start = time.perf_counter()
    pool = (multiprocessing.get_context("fork").Pool(
        s.workers, initializer=_init_worker, initargs=(s.tokenizer, s.splitter))
        if s.workers > 1 else None)
    # Hashed on a thread while the file is tokenized (started after the fork): a separate pass
    # before tokenizing would add its reading time to the shard's.
    hasher = ThreadPoolExecutor(1)
    fingerprint = (hasher.submit(file_fingerprint, path) if isinstance(record["input"], dict)
                   else None)

    def write(wheres, encoded: List[EncodedChunk]):
        for key, chunk in zip(s.json_keys, encoded):
            stats.tokens += chunk.tokens.size
            if chunk.tokens.size:
                max_id[key] = max(max_id[key], int(chunk.tokens.max()))
            writers[key].write_tokens(chunk.tokens)
            writers[key].add_documents(chunk.sequence_lengths, chunk.document_sequences)
        logged = stats.documents // s.log_interval if s.log_interval else 0
        stats.documents += len(wheres)
        if s.log_interval and stats.documents // s.log_interval > logged:
            elapsed = time.perf_counter() - start
            logger.info("%s: processed %d documents (%.0f docs/s, %.0f tokens/s)", path,
                        stats.documents, stats.documents / elapsed, stats.tokens / elapsed)
        if bar is not None:
            bar.update(len(wheres))

    try:
        chunks = _chunks(iter_records(path, s.json_keys), s.json_keys, s.chunk_documents, stats)
        if pool is None:
            for wheres, columns in chunks:
                write(wheres, _encode(s.tokenizer, columns, dtype, s.append_eod, s.splitter))
        else:
            # Bounded look-ahead: results are consumed in submission order, so the output is
            # identical to the single-process one, and memory stays flat on huge files.
            pending = collections.deque()
            for wheres, columns in chunks:
                pending.append((wheres, pool.apply_async(
                    _encode_in_worker, (columns, dtype, s.append_eod))))
                if len(pending) >= 4 * s.workers:
                    wheres_done, result = pending.popleft()
                    write(wheres_done, result.get())
            while pending:
                wheres_done, result = pending.popleft()
                write(wheres_done, result.get())
        for key in s.json_keys:
            writers[key].finalize(partial_paths(prefixes[key])[1])
        for key in s.json_keys:
            publish(prefixes[key], {**record, "max_token_id": max_id[key],
                                    "documents": stats.documents,
                                    "input_sha256": fingerprint.result() if fingerprint else None})
    except BaseException:
        for prefix in prefixes.values():
            discard_partial(prefix)
        raise
    finally:
        hasher.shutdown(cancel_futures=True)
        if pool is not None:
            pool.terminate()
            pool.join()
    return stats


def _write_shard_in_process(path, prefixes, record, settings):
    logging.basicConfig(level=logging.INFO, format="%(levelname)s %(message)s")
    return _write_shard(path, prefixes, record, settings)


# ---- the whole run -----------------------------------------------------------------------------
def preprocess_data(inputs: Sequence[str], output_prefix: str, *, progress: bool = True,
                    **settings) -> PreprocessStats:
    """Tokenize ``inputs`` (files, globs, folders, saved datasets) into indexed datasets.

    ``settings``: fields of ``PreprocessSettings`` (preprocess_settings.py, which declares their defaults and
    neobert-preprocess-data's flags); without ``rank`` / ``world_size``, one process (0 of 1): the environment's
    are the command's to read, as a process of a launched job may hold others'. The WordPiece types read their
    vocab.txt from ``tokenizer_model``, where ``resolve_tokenizer_flags`` puts the command's ``--vocab-file``.
    ``partitions`` shards (input files) are written at once, each with ``workers // partitions``
    tokenizer processes, and merged in input order. ``split_sentences``, ``keep_newlines`` and
    ``lang`` are Megatron-LM's ``--split-sentences``, ``--keep-newlines`` and ``--lang``.
    Returns the counts and the output prefix per key (shards when ``world_size > 1``).
    Raises ``DataInputError`` (bad input, named by file and record) or ``ValueError`` (bad
    tokenizer, nothing to write) after removing anything half written; existing outputs are
    replaced only once the new pair is complete and checked.
    """
    from tqdm import tqdm

    s = PreprocessSettings(**settings)
    if s.vocab_file not in (None, s.tokenizer_model):
        raise ValueError("vocab_file is the command's --vocab-file: pass the vocab.txt as tokenizer_model")
    rank = 0 if s.rank is None else s.rank
    world_size = 1 if s.world_size is None else s.world_size
    json_keys, workers, partitions, append_eod = list(s.json_keys), s.workers, s.partitions, s.append_eod
    if workers < 1 or partitions < 1 or not 0 <= rank < world_size:
        raise ValueError(f"need workers >= 1, partitions >= 1 and 0 <= rank < world_size; got "
                         f"workers={workers}, partitions={partitions}, rank={rank} of {world_size}")
    if s.keep_newlines and not s.split_sentences:
        raise ValueError("--keep-newlines keeps the newlines after sentences and needs "
                         "--split-sentences; without it documents are never split")
    files = expand_inputs(inputs)
    tokenizer = build_tokenizer(s.tokenizer_type, s.tokenizer_model)  # fail fast, before any output
    splitter = SentenceSplitter(s.lang, s.keep_newlines) if s.split_sentences else None  # nltk: only here
    shard_dir = s.shard_dir or f"{output_prefix}_shards"
    os.makedirs(shard_dir, exist_ok=True)
    settings = _Settings(json_keys, tokenizer, max(1, workers // partitions), s.chunk_documents,
                         append_eod, s.log_interval, progress, splitter)
    # Part of what a complete shard must match: a resumed run never reuses other splitting.
    base = {**tokenizer_record(tokenizer, append_eod), "split_sentences": {
        "lang": s.lang, "keep_newlines": s.keep_newlines} if splitter else None}
    shards = [(path, _shard_prefixes(shard_dir, i, path, json_keys),
               {**base, "input": _input_identity(path) if os.path.isfile(path) else path})
              for i, path in enumerate(files)]
    # Every rank writes the same list, names in the folder whatever the working directory: the
    # merge refuses to run while a shard is missing.
    write_json_atomic(os.path.join(shard_dir, MANIFEST), {
        "version": 2, "keys": json_keys,
        "shards": [[os.path.basename(p) for p in prefixes.values()] for _, prefixes, _ in shards]})
    stats = PreprocessStats()
    mine = shards[rank::world_size]
    # Checking a complete shard hashes its input again: on threads, as hashing releases the GIL.
    with ThreadPoolExecutor(workers) as checker:
        complete = list(checker.map(lambda shard: _shard_is_complete(*shard), mine))
    todo = [shard for shard, done in zip(mine, complete) if not done]
    stats.shards_done_before = len(mine) - len(todo)
    start = time.perf_counter()
    try:
        if partitions == 1:
            counts = [count_records(path) for path, _, _ in todo]
            with tqdm(total=sum(counts) if None not in counts else None, unit="doc",
                      disable=not progress, desc="tokenizing") as bar:
                for path, prefixes, record in todo:
                    stats.add(_write_shard(path, prefixes, record, settings, bar))
        else:
            with ProcessPoolExecutor(partitions, mp_context=multiprocessing.get_context("fork")) as ex, \
                    tqdm(total=len(todo), unit="shard", disable=not progress, desc="shards") as bar:
                for done in [ex.submit(_write_shard_in_process, *t, settings) for t in todo]:
                    stats.add(done.result())
                    bar.update(1)
    except BaseException:
        if os.listdir(shard_dir) == [MANIFEST]:  # nothing to resume from: leave no trace
            os.remove(os.path.join(shard_dir, MANIFEST))
            os.rmdir(shard_dir)
        raise
    finally:
        stats.seconds = time.perf_counter() - start
    datasets = {key: f"{output_prefix}_{key}_{'sentence' if splitter else 'document'}"
                for key in json_keys}
    stats.world_size = world_size
    if world_size > 1:
        stats.outputs = {key: shard_dir for key in json_keys}
        # The merge tool writes the prefix it is given, as Megatron-LM's does: give it the names
        # a single-rank run writes.
        merges = "; ".join(shlex.join(["neobert-merge-datasets", "--shard-dir", shard_dir, "--json-key", key,
                                       "--output-prefix", dataset])
                           for key, dataset in datasets.items())
        logger.info("rank %d of %d: %s; merge the shards once every rank is done: %s",
                    rank, world_size, stats.summary(), merges)
        return stats
    stats.outputs = datasets
    for key, dataset in datasets.items():
        merge_datasets([prefixes[key] for _, prefixes, _ in shards], dataset)
    for _, prefixes, _ in shards:
        for prefix in prefixes.values():
            for path in (prefix + ".bin", get_idx_path(prefix), record_path(prefix)):
                os.remove(path)
    os.remove(os.path.join(shard_dir, MANIFEST))
    if not os.listdir(shard_dir):
        os.rmdir(shard_dir)
    logger.info("preprocessed: %s", stats.summary())
    return stats

