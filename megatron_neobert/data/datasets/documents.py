"""What the MLM dataset needs of a corpus beyond its ``.idx``, worked out once per corpus and cached.

Every rank opens every corpus on every start, and at RefinedWeb's 1B documents anything it reads or copies per
document costs hours and gigabytes per rank. So one process (the trainer's rank 0, or ``tools/build_data_cache.py``
ahead of the job) reads the whole index once to check it, and works out which special tokens the documents
already carry: a [CLS] at the start, a [SEP] or EOD at the end (each piece of a sample gets its own, so these are
dropped). The result is cached beside the layouts under a key of the files' sizes and modification times and the
tokenizer's special ids; a later start reads one small JSON file.

The special tokens, without reading every document where the corpus's convention is known:
- our own data: its record says whether an EOD ends each document (``--append-eod``); none starts with [CLS];
- another tool's data (Megatron-LM's ``preprocess_data.py`` with or without ``--append-eod``, with a tokenizer
  that adds [CLS]/[SEP] or not) writes every document the same way: ``SAMPLED_DOCUMENTS`` documents spread evenly
  over the corpus show the convention, and it is logged;
- where those documents disagree (a merge of corpora written differently), every document is read once, in
  chunks, with progress; the chunks done are kept, so an interrupted scan resumes where it stopped. Only then are
  there per-document arrays, two int8 ``.npy`` files that every rank memory-maps.
"""

import hashlib
import json
import logging
import mmap
import os
from dataclasses import dataclass
from typing import Optional, Tuple

import numpy
from megatron.core.datasets.indexed_dataset import get_bin_path, get_idx_path

from megatron_neobert.atomic_write import commit, write_json_atomic
from megatron_neobert.data.indexed import IndexArrays, check_indexed_files, raw_lengths
from megatron_neobert.data.records import read_record
from megatron_neobert.progress import progress_bar

logger = logging.getLogger(__name__)

SAMPLED_DOCUMENTS = 4096
# Documents per chunk of a scan: its unit of progress and resumption, and what it maps of the .bin at once
# (about 85 MB of web text).
SCAN_CHUNK = 1 << 16
# Part of the cache file names: a cache written by another version of this file is never read.
DOCUMENTS_VERSION = 1


@dataclass(frozen=True)
class CorpusDocuments:
    """``lead[d]`` / ``trail[d]``: tokens dropped at the start / end of document d (int8; a read-only view of one
    value when the whole corpus agrees, so no memory per document). ``key`` names the corpus's files and the
    tokenizer's special ids: caches built from it (the layouts) are never reused for other data.

    The functions here read a corpus through its index: megatron-core's reader (``IndexedDataset.index``),
    ``indexed.IndexArrays`` (a mapping of its own that goes when dropped) or the mock documents' index."""

    key: str
    lead: numpy.ndarray
    trail: numpy.ndarray

    def lengths(self, index) -> numpy.ndarray:
        """Tokens per document without the dropped ones (int32), computed a million documents at a time. A
        uniform lead or trail only applies where there are tokens to drop."""
        n, chunk = _document_count(index), 1 << 20
        out = numpy.empty(n, numpy.int32)
        for lo in range(0, n, chunk):
            hi = min(n, lo + chunk)
            first_sequence = index.document_indices[lo:hi + 1]
            if first_sequence[-1] - first_sequence[0] == hi - lo and (numpy.diff(first_sequence) == 1).all():
                raw = index.sequence_lengths[first_sequence[0]:first_sequence[-1]]  # one sequence a document
            else:
                raw = raw_lengths(index, numpy.arange(lo, hi))
            out[lo:hi] = _trimmed(raw, self.lead[lo:hi], self.trail[lo:hi])
        return out

    def lengths_of(self, index, docs: numpy.ndarray) -> numpy.ndarray:
        """``lengths`` of the given documents only (a sample's, when it is read)."""
        return _trimmed(raw_lengths(index, docs), self.lead[docs], self.trail[docs])


def _trimmed(raw: numpy.ndarray, lead: numpy.ndarray, trail: numpy.ndarray) -> numpy.ndarray:
    """Tokens left of documents of `raw` tokens once their lead and trail are dropped (none where none are)."""
    lead = numpy.minimum(lead, raw)
    return raw - lead - numpy.minimum(trail, raw - lead)


def uniform(value: int, n: int) -> numpy.ndarray:
    return numpy.broadcast_to(numpy.int8(value), (n,))


def _document_count(index) -> int:
    return index.document_indices.shape[0] - 1


def special_tokens_of(index, prefix: str, docs: numpy.ndarray, tokenizer, read) -> Tuple[numpy.ndarray, ...]:
    """(lead, trail) of the given documents, reading their first and last tokens with `read` (`tokens_at` or
    `tokens_in_span`): lead 1 where a document starts with [CLS]; trail 1 where what is left of it ends with
    [SEP] or EOD."""
    lead, trail = numpy.zeros(docs.shape[0], numpy.int8), numpy.zeros(docs.shape[0], numpy.int8)
    raw, pointers, itemsize = raw_lengths(index, docs), index.sequence_pointers, index.dtype_size
    full = raw > 0
    if not full.any():
        return lead, trail
    first = pointers[numpy.minimum(index.document_indices[docs], pointers.shape[0] - 1)] // itemsize
    ends = numpy.concatenate([first[full], first[full] + raw[full] - 1])
    found = read(get_bin_path(prefix), index.dtype, ends)
    lead[full] = found[:ends.shape[0] // 2] == tokenizer.cls_id
    last = numpy.zeros(docs.shape[0], found.dtype)
    last[full] = found[ends.shape[0] // 2:]
    tail = raw - lead > 0
    trail[tail] = numpy.isin(last[tail], [tokenizer.sep_id, tokenizer.eod_id])
    return lead, trail


def tokens_at(path: str, dtype, positions: numpy.ndarray) -> numpy.ndarray:
    """A few tokens anywhere in a ``.bin``: one read each. (Through a memory map, each would map a whole
    read-ahead window into the process: a few thousand reads showed as 1.6 GB.)"""
    size = numpy.dtype(dtype).itemsize
    with open(path, "rb") as f:
        return numpy.frombuffer(b"".join(os.pread(f.fileno(), size, int(p) * size) for p in positions), dtype)


def tokens_in_span(path: str, dtype, positions: numpy.ndarray) -> numpy.ndarray:
    """Many tokens close together: the span they cover is mapped, read and unmapped, so what the process holds is
    that span at most (the scan keeps spans short by going through the documents in order)."""
    size = numpy.dtype(dtype).itemsize
    lo = int(positions.min()) * size // mmap.ALLOCATIONGRANULARITY * mmap.ALLOCATIONGRANULARITY
    hi = (int(positions.max()) + 1) * size
    with open(path, "rb") as f, mmap.mmap(f.fileno(), hi - lo, access=mmap.ACCESS_READ, offset=lo) as span:
        view = numpy.frombuffer(span, dtype)
        found = view[positions - lo // size]
        del view  # the map closes only once no array looks into it
    return found


def corpus_key(prefix: str, tokenizer) -> str:
    """The files (path, size, modification time) and what decides the trims: a rewritten corpus, a record that
    changed or another tokenizer's special ids give another key."""
    files = [(os.path.abspath(path), os.stat(path).st_size, os.stat(path).st_mtime_ns)
             for path in (get_idx_path(prefix), get_bin_path(prefix))]
    record = read_record(prefix)
    identity = {"files": files, "append_eod": None if record is None else record.get("append_eod"),
                "special_ids": [int(tokenizer.cls_id), int(tokenizer.sep_id), int(tokenizer.eod_id)],
                "version": DOCUMENTS_VERSION}
    return hashlib.md5(json.dumps(identity).encode(), usedforsecurity=False).hexdigest()


def corpus_documents(index, prefix: Optional[str], tokenizer, cache_dir: Optional[str],
                     build: bool) -> CorpusDocuments:
    """The corpus's `CorpusDocuments`: from the cache in `cache_dir`, else worked out and cached when `build`
    (one process: the others load what it wrote)."""
    n = _document_count(index)
    if prefix is None:  # megatron-core's mock documents carry no special tokens
        return CorpusDocuments("mock", uniform(0, n), uniform(0, n))
    key = corpus_key(prefix, tokenizer)
    base = os.path.join(cache_dir, f"{key}-documents{DOCUMENTS_VERSION}")
    if not os.path.isfile(base + ".json"):
        if not build:
            raise FileNotFoundError(f"{base}.json not found: the data cache (--data-cache-path) must be a folder "
                                    "that every rank sees, since rank 0 writes it for the others")
        # Through a mapping of the .idx of its own, dropped after: the pages this reads would otherwise stay in
        # the process's memory with the reader's mapping (a few thousand scattered reads map hundreds of MB).
        _work_out(IndexArrays(get_idx_path(prefix)), prefix, tokenizer, key, base)
    with open(base + ".json", encoding="utf-8") as f:
        description = json.load(f)
    lead, trail = (uniform(description[name], n) if isinstance(description[name], int)
                   else numpy.load(f"{base}-{name}.npy", mmap_mode="r") for name in ("lead", "trail"))
    return CorpusDocuments(key, lead, trail)


def _work_out(index, prefix: str, tokenizer, key: str, base: str) -> None:
    """Check the whole index, find the special tokens the documents carry, write the cache (JSON last)."""
    check_indexed_files(get_idx_path(prefix), get_bin_path(prefix))
    os.makedirs(os.path.dirname(base), exist_ok=True)
    n = _document_count(index)
    record = read_record(prefix)
    description = {"prefix": os.path.abspath(prefix), "documents": n}
    if record is not None and "append_eod" in record:  # our own data: only an EOD to drop
        description.update(lead=0, trail=int(record["append_eod"]), how="the tokenizer record")
    else:
        sample = numpy.unique(numpy.linspace(0, n - 1, min(n, SAMPLED_DOCUMENTS)).astype(numpy.int64))
        lead, trail = special_tokens_of(index, prefix, sample, tokenizer, tokens_at)
        raw = raw_lengths(index, sample)
        conventions = [_agreed(lead[raw > 0]), _agreed(trail[raw - lead > 0])]
        if None not in conventions:
            description.update(lead=conventions[0], trail=conventions[1],
                               how=f"{sample.shape[0]:,} documents spread over the corpus")
            if any(conventions):
                logger.info("%s: its %s sampled documents all %s: dropped from every document (each piece gets "
                            "its own)", prefix, f"{sample.shape[0]:,}",
                            " and ".join(w for w, c in zip(("start with [CLS]", "end with [SEP]/EOD"), conventions)
                                         if c))
        else:
            logger.info("%s: documents differ in the [CLS] / [SEP] / EOD they carry: reading each one's first and "
                        "last token once (cached)", prefix)
            _scan(index, prefix, tokenizer, base, key)
            description.update(lead="per-document", trail="per-document", how="a scan of every document")
    write_json_atomic(base + ".json", description)


def _agreed(values: numpy.ndarray) -> Optional[int]:
    """The value every element has (0 when there are none), or None when they differ."""
    if values.size == 0:
        return 0
    return int(values[0]) if (values == values[0]).all() else None


def _scan(index, prefix: str, tokenizer, base: str, key: str) -> None:
    """Every document's (lead, trail) into ``{base}-lead.npy`` / ``-trail.npy``, `SCAN_CHUNK` documents at a time.
    The arrays are written in place under ``.partial`` names and ``{base}-scan.json`` says how many documents are
    done after each chunk, so a scan that is killed resumes at its last chunk."""
    from numpy.lib.format import open_memmap

    n = _document_count(index)
    state_path, partial = base + "-scan.json", {name: f"{base}-{name}.partial.npy" for name in ("lead", "trail")}
    done = 0
    if os.path.isfile(state_path) and all(os.path.isfile(p) for p in partial.values()):
        with open(state_path, encoding="utf-8") as f:
            state = json.load(f)
        done = state["done"] if state.get("key") == key else 0
    mode = "r+" if done else "w+"
    arrays = {name: open_memmap(path, mode, numpy.int8, (n,)) for name, path in partial.items()}
    bar = progress_bar(desc=f"special tokens in {os.path.basename(base)}", total=n, unit="doc")
    bar.update(done)
    for lo in range(done, n, SCAN_CHUNK):
        hi = min(n, lo + SCAN_CHUNK)
        arrays["lead"][lo:hi], arrays["trail"][lo:hi] = special_tokens_of(index, prefix, numpy.arange(lo, hi),
                                                                          tokenizer, tokens_in_span)
        for array in arrays.values():
            array.flush()
        write_json_atomic(state_path, {"key": key, "done": hi})
        bar.update(hi - lo)
    bar.close()
    del arrays
    for name, path in partial.items():
        commit(path, f"{base}-{name}.npy")
    os.remove(state_path)
