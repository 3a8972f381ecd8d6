"""Tokenize RefinedWeb-style text into megatron-core ``.bin/.idx`` datasets.

The library side of ``tools/preprocess_data.py``. Output names follow Megatron-LM's tool:
``{output_prefix}_{key}_document.bin/.idx``, one sequence per document, whole documents (never
truncated; the MLM dataset cuts them into samples). Each input file is a partition written to a
scratch folder and merged at the end; the merged pair is written under ``.partial`` names, checked
and renamed, so an interrupted run never leaves a pair that looks complete.

Documents are tokenized in chunks by worker processes but written in input order, so the output
does not depend on the number of workers.
"""

import collections
import logging
import multiprocessing
import os
import shutil
import tempfile
import time
from dataclasses import dataclass, field
from typing import Dict, Iterator, List, Optional, Sequence, Tuple

import numpy
from megatron.core.datasets.indexed_dataset import IndexedDatasetBuilder, get_idx_path

from megatron_neobert.data.indexed import commit_pair, discard_partial, partial_paths, token_dtype
from megatron_neobert.data.readers import Record, count_records, expand_inputs, iter_records
from megatron_neobert.data.tokenizer import MLMTokenizer, build_tokenizer

logger = logging.getLogger(__name__)

_MAX_SKIP_WARNINGS = 20


@dataclass
class PreprocessStats:
    documents: int = 0
    tokens: int = 0
    skipped: collections.Counter = field(default_factory=collections.Counter)
    seconds: float = 0.0
    outputs: Dict[str, str] = field(default_factory=dict)  # json key -> dataset prefix

    @property
    def tokens_per_second(self) -> float:
        return self.tokens / self.seconds if self.seconds > 0 else 0.0

    def summary(self) -> str:
        skipped = sum(self.skipped.values())
        reasons = ", ".join(f"{k}: {v}" for k, v in sorted(self.skipped.items()))
        return (f"{self.documents:,} documents, {self.tokens:,} tokens, {skipped:,} skipped"
                f"{f' ({reasons})' if reasons else ''}, {self.seconds:.1f} s, "
                f"{self.tokens_per_second:,.0f} tokens/s")


# ---- worker side -------------------------------------------------------------------------------
_worker_tokenizer: Optional[MLMTokenizer] = None


def _init_worker(tokenizer: MLMTokenizer) -> None:
    # One thread per worker: parallelism comes from the processes, not from the Rust thread pool,
    # which would otherwise oversubscribe the cores.
    os.environ["TOKENIZERS_PARALLELISM"] = "false"
    global _worker_tokenizer
    # Forked workers inherit the parent's loaded tokenizer (it has not encoded anything yet, so
    # no Rust thread pool is copied); under spawn it arrives pickled and is rebuilt.
    _worker_tokenizer = tokenizer


def _encode(tokenizer: MLMTokenizer, columns: List[List[str]], dtype) -> List[List[numpy.ndarray]]:
    return [[numpy.asarray(ids, dtype=dtype) for ids in tokenizer.tokenize_batch(texts)]
            for texts in columns]


def _encode_in_worker(columns: List[List[str]], dtype) -> List[List[numpy.ndarray]]:
    return _encode(_worker_tokenizer, columns, dtype)


# ---- main side ---------------------------------------------------------------------------------
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


def preprocess_data(
    inputs: Sequence[str],
    output_prefix: str,
    json_keys: Sequence[str] = ("content",),
    tokenizer_type: str = "HuggingFaceTokenizer",
    tokenizer_model: str = "bert-base-uncased",
    workers: int = 1,
    chunk_documents: int = 64,
    progress: bool = True,
) -> PreprocessStats:
    """Tokenize ``inputs`` (files, globs, folders, saved datasets) into indexed datasets.

    Returns the counts and the output prefix per key. Raises ``DataInputError`` (bad input, named
    by file and record) or ``ValueError`` (bad tokenizer) after removing anything half written;
    existing outputs are replaced only once the new pair is complete and checked.
    """
    from tqdm import tqdm

    if workers < 1:
        raise ValueError(f"workers must be >= 1, got {workers}")
    json_keys = list(json_keys)
    partitions = expand_inputs(inputs)
    tokenizer = build_tokenizer(tokenizer_type, tokenizer_model)  # fail fast, before any output
    dtype = token_dtype(tokenizer.vocab_size)
    stats = PreprocessStats()
    stats.outputs = {key: f"{output_prefix}_{key}_document" for key in json_keys}
    out_dir = os.path.dirname(os.path.abspath(output_prefix))
    os.makedirs(out_dir, exist_ok=True)
    scratch = tempfile.mkdtemp(prefix=".preprocess-", dir=out_dir)
    pool = (multiprocessing.get_context("fork").Pool(
        workers, initializer=_init_worker, initargs=(tokenizer,))
        if workers > 1 else None)
    total = [count_records(p) for p in partitions]
    bar = tqdm(total=sum(total) if None not in total else None, unit="doc", disable=not progress,
               desc="tokenizing")
    start = time.perf_counter()
    try:
        part_prefixes = []
        for p, partition in enumerate(partitions):
            prefixes = {key: os.path.join(scratch, f"part{p:05d}_{key}") for key in json_keys}
            builders = {key: IndexedDatasetBuilder(prefixes[key] + ".bin", dtype=dtype)
                        for key in json_keys}

            def write(wheres, encoded):
                for i, where in enumerate(wheres):
                    docs = [encoded[k][i] for k in range(len(json_keys))]
                    if any(d.size == 0 for d in docs):
                        _skip(stats, "no tokens", where)
                        continue
                    for key, doc in zip(json_keys, docs):
                        builders[key].add_document(doc, [doc.size])
                        stats.tokens += doc.size
                    stats.documents += 1
                bar.update(len(wheres))
                bar.set_postfix(tok_s=f"{stats.tokens / (time.perf_counter() - start):,.0f}")

            chunks = _chunks(iter_records(partition, json_keys), json_keys, chunk_documents, stats)
            if pool is None:
                for wheres, columns in chunks:
                    write(wheres, _encode(tokenizer, columns, dtype))
            else:
                # Bounded look-ahead: results are consumed in submission order, so the output is
                # identical to the single-process one, and memory stays flat on huge files.
                pending = collections.deque()
                for wheres, columns in chunks:
                    pending.append((wheres, pool.apply_async(_encode_in_worker, (columns, dtype))))
                    if len(pending) >= 4 * workers:
                        wheres_done, result = pending.popleft()
                        write(wheres_done, result.get())
                while pending:
                    wheres_done, result = pending.popleft()
                    write(wheres_done, result.get())
            for key in json_keys:
                builders[key].finalize(get_idx_path(prefixes[key]))
            part_prefixes.append(prefixes)

        for key in json_keys:
            bin_tmp, idx_tmp = partial_paths(stats.outputs[key])
            if len(part_prefixes) == 1:
                os.replace(part_prefixes[0][key] + ".bin", bin_tmp)
                os.replace(part_prefixes[0][key] + ".idx", idx_tmp)
            else:
                merged = IndexedDatasetBuilder(bin_tmp, dtype=dtype)
                for prefixes in part_prefixes:
                    merged.add_index(prefixes[key])
                merged.finalize(idx_tmp)
        for key in json_keys:
            commit_pair(stats.outputs[key])
    except BaseException:
        for prefix in stats.outputs.values():
            discard_partial(prefix)
        raise
    finally:
        stats.seconds = time.perf_counter() - start
        bar.close()
        if pool is not None:
            pool.terminate()
            pool.join()
        shutil.rmtree(scratch, ignore_errors=True)
    logger.info("preprocessed: %s", stats.summary())
    return stats
