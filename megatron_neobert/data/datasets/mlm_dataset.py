"""NeoBERT's masked-language-model dataset on megatron-core's dataset machinery.

``MLMDataset`` is a ``MegatronDataset`` over an ``IndexedDataset`` of whole documents, split into
train/valid/test by document and blended by ``BlendedMegatronDatasetBuilder``. Each epoch shuffles
the split's documents and lays them out (``packing.py``): *packed* samples of exactly
``seq_length`` tokens with ``cu_seqlens`` per document piece, or *padded* samples of one document
chunk each. The layout (each epoch's document order, where each sample starts in it, the sample
shuffle) is computed once, cached as ``.npy`` files (rank 0 first when distributed) and
memory-mapped; a sample's pieces are derived from where it starts when it is read.

With no data at all (``--mock-data``: megatron-core's mock mode, blend and blend_per_split None),
the low-level dataset is ``MockDocuments``: synthetic documents, packed and masked like real ones.

Masking happens when a sample is read, from a generator seeded by (seed, dataset, index): sample i
is a pure function of (seed, data, split, sequence length, layout mode, i), so tensor-parallel
ranks agree, a resumed run sees exactly the samples it would have seen, and asking for more
samples (a larger --train-iters) only appends epochs.
"""

import bisect
import glob
import hashlib
import json
import logging
import os
import time
from dataclasses import dataclass
from typing import Callable, Dict, List, Optional, Tuple

import numpy
import torch
from megatron.core.datasets.blended_megatron_dataset_builder import BlendedMegatronDatasetBuilder
from megatron.core.datasets.blended_megatron_dataset_config import BlendedMegatronDatasetConfig
from megatron.core.datasets.indexed_dataset import IndexedDataset, get_bin_path, get_idx_path
from megatron.core.datasets.megatron_dataset import MegatronDataset
from megatron.core.datasets.utils import Split

from megatron_neobert.atomic_write import commit, temporary_sibling, write_text_atomic
from megatron_neobert.data.datasets.checks import check_vocabulary, split_as_corpus, unknown_token_error
from megatron_neobert.data.datasets import native
from megatron_neobert.data.datasets.documents import corpus_documents
from megatron_neobert.data.datasets.packing import PAD_PIECE, chunk_piece, chunk_starts, pack_starts, packed_pieces
from megatron_neobert.data.indexed import IndexArrays, open_indexed
from megatron_neobert.megatron_core_compat import rank_zero_without_process_group

logger = logging.getLogger(__name__)

MASK_SCHEMES = ("mask", "80/10/10")
IGNORE_INDEX = -100


@dataclass
class MLMDatasetConfig(BlendedMegatronDatasetConfig):
    """megatron-core dataset config plus the MLM settings.

    ``sequence_length`` (alias ``seq_length``) is the sample length including [CLS]/[SEP];
    ``tokenizer`` is a ``megatron_neobert.data.tokenizer.MLMTokenizer``.
    """

    mask_rate: float = 0.20
    """Probability that a non-special token is selected for prediction (NeoBERT: 20%)."""

    mask_scheme: str = "mask"
    """'mask': every selected token becomes [MASK] (NeoBERT); '80/10/10': BERT's replacement."""

    packed: bool = True
    """Packed samples with cu_seqlens (default) or one padded document chunk per sample."""

    @property
    def seq_length(self) -> int:
        return self.sequence_length

    def __post_init__(self) -> None:
        with rank_zero_without_process_group():  # megatron-core logs the split it derives, on rank 0
            super().__post_init__()
        if self.tokenizer is None:
            raise ValueError("MLMDatasetConfig needs a tokenizer (data.tokenizer.build_tokenizer)")
        if not 0.0 < self.mask_rate < 1.0:
            raise ValueError(f"mask_rate must be in (0, 1), got {self.mask_rate}")
        if self.mask_scheme not in MASK_SCHEMES:
            raise ValueError(f"mask_scheme must be one of {MASK_SCHEMES}, got {self.mask_scheme!r}")
        if self.sequence_length < 8:
            raise ValueError(f"sequence_length must be >= 8, got {self.sequence_length}")


# Part of the cache file names: a cache of another layout or seeding is never read as this one's. Layout 3 held every
# piece (four arrays, about 2.5 pieces a sample); layout 4 has the same samples from two integers a sample.
LAYOUT_VERSION = 4
# The layout's arrays, each epoch's part after the one before: the documents with tokens of each epoch in its order,
# each sample's start (stream position in its epoch's order, token offset), the sample shuffle, and each epoch's
# first sample and first document (one more entry: the totals).
LAYOUT_FIELDS = ("documents", "sample_position", "sample_offset", "shuffle_index", "epoch_samples", "epoch_documents")


def sample_stream(unique_identifiers: Dict) -> int:
    """The random stream of a dataset's layouts and masks: its identity (data set, split, seed,
    length, layout mode, tokenizer) without the number of samples asked for, so that sample i
    does not depend on --train-iters and a run extended by resuming sees the samples of a run
    planned longer from the start. Distinct per dataset and split: blends do not mask two
    datasets' sample i identically. Where the files lie is no part of it: the data set counts by
    its file name and size, the tokenizer by its type and vocabulary size, not their folders, so the
    same run from another working directory or checkout reads the same samples."""
    identity = {k: v for k, v in unique_identifiers.items() if k not in ("num_samples", "dataset_path")}
    path = unique_identifiers["dataset_path"]
    if path is not None:  # None: mock data
        identity["dataset"] = [os.path.basename(path), os.path.getsize(get_bin_path(path))]
    identity["tokenizer"] = {k: v for k, v in unique_identifiers["tokenizer"].unique_identifiers.items()
                             if k != "tokenizer_model"}
    text = json.dumps(identity, indent=4)
    return int(hashlib.md5(text.encode("utf-8"), usedforsecurity=False).hexdigest()[:8], 16)


class MockDocuments:
    """Megatron-LM's mock data idea for MLM: `size` synthetic documents, the same for every seed
    and run. Lengths are uniform in [1, 2 x seq_length) (so packing splits and fills); a document
    counts up through the tokenizer's non-special ids from a random start (as Megatron-LM's
    mock documents count up), so every id is as frequent as another."""

    size = 100_000
    seed = 0

    def __init__(self, tokenizer, seq_length: int) -> None:
        rng = numpy.random.default_rng(self.seed)
        self.sequence_lengths = rng.integers(1, 2 * seq_length, self.size, dtype=numpy.int32)
        self.document_indices = numpy.arange(self.size + 1, dtype=numpy.int64)
        # megatron-core's index reader's fields, which document lengths are read from (8-byte ids)
        self.index = _MockIndex(self.sequence_lengths, self.document_indices,
                                8 * numpy.concatenate([[0], numpy.cumsum(self.sequence_lengths[:-1])]))
        self._starts = rng.integers(0, 2**31, self.size, dtype=numpy.int64)
        special = numpy.zeros(tokenizer.vocab_size, bool)
        special[[i for i in tokenizer.special_ids if i < tokenizer.vocab_size]] = True
        self._ids = numpy.flatnonzero(~special).astype(numpy.int64)

    def get(self, idx: int, offset: int = 0, length: Optional[int] = None) -> numpy.ndarray:
        if length is None:
            length = int(self.sequence_lengths[idx]) - offset
        return self._ids[(self._starts[idx] + offset + numpy.arange(length)) % self._ids.shape[0]]


@dataclass(frozen=True)
class _MockIndex:
    sequence_lengths: numpy.ndarray
    document_indices: numpy.ndarray
    sequence_pointers: numpy.ndarray
    dtype = numpy.int64
    dtype_size = 8


class MLMDataset(MegatronDataset):
    """Samples: ``tokens`` and ``labels`` (int64 [S]) plus ``cu_seqlens`` (int32, packed) or
    ``attention_mask`` (bool [S], padded)."""

    def __init__(self, indexed_dataset: IndexedDataset, dataset_path: Optional[str],
                 indexed_indices: numpy.ndarray, num_samples: Optional[int], index_split: Split,
                 config: MLMDatasetConfig) -> None:
        super().__init__(indexed_dataset, dataset_path, indexed_indices, num_samples,
                         index_split, config)
        tok = config.tokenizer
        # Nothing here reads or copies per document once the caches exist: the trims come from the corpus's
        # cache (a single value unless its documents differ) and the layout is memory-mapped.
        self._documents = corpus_documents(indexed_dataset.index, dataset_path, tok, self._cache_dir(), _is_rank0())
        self._doc_lead = self._documents.lead
        self._doc_first_sequence = indexed_dataset.document_indices[:-1]
        self._special = numpy.zeros(max(tok.vocab_size, max(tok.special_ids) + 1), bool)
        self._special[list(tok.special_ids)] = True
        self._random_ids = numpy.flatnonzero(~self._special[:tok.vocab_size])
        self._stream = sample_stream(self.unique_identifiers)
        (self.documents, self.sample_position, self.sample_offset, self.shuffle_index, self.epoch_samples,
         self.epoch_documents) = self._build_layout()
        self._epoch_samples, self._epoch_documents = self.epoch_samples.tolist(), self.epoch_documents.tolist()
        # The split's document ids (megatron-core's arange, 4 bytes a document) only serve to build the layout.
        self.indices = None

    # ---- megatron-core hooks ---------------------------------------------------------------
    @staticmethod
    def numel_low_level_dataset(low_level_dataset: IndexedDataset) -> int:
        # Split by document, as BERT does: a document never spans two splits.
        return low_level_dataset.document_indices.shape[0] - 1

    @staticmethod
    def build_low_level_dataset(dataset_path: Optional[str], config: MLMDatasetConfig) -> IndexedDataset:
        if dataset_path is None:  # megatron-core's mock mode
            return MockDocuments(config.tokenizer, config.sequence_length)
        dataset = open_indexed(dataset_path, mmap=config.mmap_bin_files)
        check_vocabulary(dataset_path, config.tokenizer)
        return dataset

    @staticmethod
    def _key_config_attributes() -> List[str]:
        # Masking settings are applied on read and do not change the cached layout.
        return MegatronDataset._key_config_attributes() + ["packed"]

    def __len__(self) -> int:
        return int(self.shuffle_index.shape[0])

    # ---- samples ---------------------------------------------------------------------------
    def pieces(self, idx: int) -> List[List[int]]:
        """Sample idx's pieces: [document id, first token, tokens], padding as [PAD_PIECE, 0, tokens]."""
        j = int(self.shuffle_index[idx])
        epoch = bisect.bisect_right(self._epoch_samples, j) - 1
        first, n = self._epoch_documents[epoch], self._epoch_documents[epoch + 1] - self._epoch_documents[epoch]
        position, offset = int(self.sample_position[j]), int(self.sample_offset[j])
        ids = {}  # stream position -> document id (past the order: re-reads of its start)

        def lengths_at(lo: int, hi: int) -> List[int]:
            docs = self.documents[first + numpy.arange(lo, hi) % n]
            ids.update(zip(range(lo, hi), docs.tolist()))
            return self._documents.lengths_of(self.dataset.index, docs).tolist()

        if self.config.packed:
            pieces = packed_pieces(position, offset, self.config.sequence_length, lengths_at)
        else:
            pieces = chunk_piece(position, offset, self.config.sequence_length, lengths_at(position, position + 1)[0])
        for piece in pieces:
            if piece[0] != PAD_PIECE:
                piece[0] = ids[piece[0]]
        return pieces

    def __getitem__(self, idx: int) -> Dict[str, torch.Tensor]:
        cfg, tok = self.config, self.config.tokenizer
        parts, seqlens = [], []
        for doc, start, length in self.pieces(idx):
            if doc == PAD_PIECE:
                parts.append(numpy.full(length, tok.pad_id, numpy.int64))
                seqlens.append(length)
                continue
            # The sequences of one document are contiguous in the .bin, so one read from the
            # first sequence covers documents written as several sequences (split sentences).
            body = self.dataset.get(int(self._doc_first_sequence[doc]), start + int(self._doc_lead[doc]), length)
            if length and body.max() >= self._special.shape[0]:  # an id no embedding row (or mask) has
                raise unknown_token_error(self.dataset_path, doc, body, self._special.shape[0], tok)
            parts += [[tok.cls_id], body, [tok.sep_id]]
            seqlens.append(length + 2)
        tokens = numpy.concatenate(parts).astype(numpy.int64)
        sample = {}
        if cfg.packed:
            sample["cu_seqlens"] = torch.from_numpy(
                numpy.concatenate([[0], numpy.cumsum(seqlens)]).astype(numpy.int32))
        else:
            real = tokens.shape[0]
            tokens = numpy.concatenate(
                [tokens, numpy.full(cfg.sequence_length - real, tok.pad_id, numpy.int64)])
            mask = numpy.zeros(cfg.sequence_length, bool)
            mask[:real] = True
            sample["attention_mask"] = torch.from_numpy(mask)
        assert tokens.shape[0] == cfg.sequence_length
        tokens, labels = self._mask(tokens, idx)
        return {"tokens": torch.from_numpy(tokens), "labels": torch.from_numpy(labels), **sample}

    def _mask(self, tokens: numpy.ndarray, idx: int) -> Tuple[numpy.ndarray, numpy.ndarray]:
        cfg, tok = self.config, self.config.tokenizer
        rng = numpy.random.default_rng([cfg.random_seed, self._stream, int(idx)])
        candidates = ~self._special[tokens]  # never [CLS] [SEP] [PAD] [UNK] [MASK]
        selected = (rng.random(tokens.shape[0]) < cfg.mask_rate) & candidates
        labels = numpy.full_like(tokens, IGNORE_INDEX)
        labels[selected] = tokens[selected]
        tokens = tokens.copy()
        if cfg.mask_scheme == "mask":
            tokens[selected] = tok.mask_id
        else:  # BERT: 80% [MASK], 10% a random non-special token, 10% unchanged
            draw = rng.random(tokens.shape[0])
            tokens[selected & (draw < 0.8)] = tok.mask_id
            randomize = selected & (draw >= 0.8) & (draw < 0.9)
            tokens[randomize] = self._random_ids[
                rng.integers(0, self._random_ids.shape[0], int(randomize.sum()))]
        return tokens, labels

    # ---- layout and its cache --------------------------------------------------------------
    def _cache_dir(self) -> Optional[str]:
        """--data-cache-path, else a cache/ folder beside the data (None for mock data without one)."""
        if self.config.path_to_cache is None and self.dataset_path is not None:
            return os.path.join(os.path.dirname(os.path.abspath(self.dataset_path)), "cache",
                                f"{type(self).__name__}_indices")
        return self.config.path_to_cache

    def _build_layout(self):
        cache = self._cache_dir()
        if cache is None:  # mock data without --data-cache-path: nothing on disk to cache beside
            parts = list(self._layout_parts())
            return tuple(numpy.concatenate([part[name] for part in parts if name in part]) for name in LAYOUT_FIELDS)
        # The corpus's key in the name: a layout of data since rewritten at the same path is never read.
        prefix = os.path.join(cache, f"{self.unique_description_hash}-{self._documents.key[:12]}-{type(self).__name__}-"
                                     "layout")
        suffix = f"-{self.index_split.name}"
        paths = {name: f"{prefix}{LAYOUT_VERSION}{suffix}-{name}.npy" for name in LAYOUT_FIELDS}
        description = f"{prefix}{LAYOUT_VERSION}{suffix}-description.txt"
        # Non-zero ranks load after the builder's barrier, when rank 0 has written.
        if _is_rank0() and (not os.path.isfile(description) or self._load_layout(paths, description) is None):
            if not os.path.isfile(description):
                self._say_why_built(prefix, suffix)
            self._write_layout(cache, paths, description)
        logger.info("load the %s %s layout from %s", type(self).__name__, self.index_split.name, cache)
        return tuple(numpy.load(paths[name], mmap_mode="r") for name in LAYOUT_FIELDS)

    def _load_layout(self, paths: Dict[str, str], description: str):
        """The cached layout, or None (with a line saying why) where a file is missing or does not fit the others
        (a cache folder copied in part, a file cut short)."""
        try:
            layout = tuple(numpy.load(paths[name], mmap_mode="r") for name in LAYOUT_FIELDS)
        except (OSError, ValueError) as error:  # a file missing, or its header or length wrong
            logger.warning("rebuild the %s %s layout in %s: %s", type(self).__name__, self.index_split.name,
                           os.path.dirname(description), error)
            return None
        documents, position, offset, shuffle, epoch_samples, epoch_documents = layout
        if not (position.shape == offset.shape == shuffle.shape == (int(epoch_samples[-1]),)
                and documents.shape == (int(epoch_documents[-1]),)):
            logger.warning("rebuild the %s %s layout in %s: its arrays do not fit each other (%s)",
                           type(self).__name__, self.index_split.name, os.path.dirname(description),
                           ", ".join(f"{name} {array.shape[0]:,}" for name, array in zip(LAYOUT_FIELDS, layout)))
            return None
        return layout

    def _say_why_built(self, prefix: str, suffix: str) -> None:
        """One line where the cache holds this dataset's layout in another version's files: they are not read."""
        others = sorted(glob.glob(f"{glob.escape(prefix)}*{glob.escape(suffix)}-description.txt"))
        if others:
            logger.warning("the data cache holds the %s %s layout as an earlier version of this package wrote it "
                           "(%s): building layout %d beside it, with the same samples; the old files can be deleted",
                           type(self).__name__, self.index_split.name, os.path.basename(others[0]), LAYOUT_VERSION)

    def _write_layout(self, cache: str, paths: Dict[str, str], description: str) -> None:
        """Each epoch's arrays appended to the cache files as it is laid out, so that building holds one epoch
        at a time; the files get their final names only when complete (readers never see half a file), and the
        description, which says the layout is there, last. Builders at once (two jobs) write the same bytes under
        names of their own: the last rename wins, with a complete file."""
        start = time.time()
        os.makedirs(cache, exist_ok=True)
        tmp = {name: temporary_sibling(path) for name, path in paths.items()}
        files = {name: StreamedNpy(path) for name, path in tmp.items()}
        try:
            for part in self._layout_parts():
                for name, array in part.items():
                    files[name].append(array)
            for name in LAYOUT_FIELDS:
                files[name].close()
                commit(tmp[name], paths[name])
        finally:
            for name in LAYOUT_FIELDS:
                files[name].discard()
        write_text_atomic(description, self.unique_description)
        logger.info("built the %s %s layout: %d samples in %.1f s (cached in %s)", type(self).__name__,
                    self.index_split.name, files["shuffle_index"].size, time.time() - start, cache)

    def _layout_parts(self):
        """The layout arrays a part at a time: the epoch tables' leading 0, then each epoch's part of every array."""
        yield {"epoch_samples": numpy.zeros(1, numpy.int64), "epoch_documents": numpy.zeros(1, numpy.int64)}
        samples = documents = 0
        for order, starts, shuffle in self._epochs():
            samples, documents = samples + shuffle.shape[0], documents + order.shape[0]
            yield {"documents": order, "sample_position": starts.position, "sample_offset": starts.offset,
                   "shuffle_index": shuffle, "epoch_samples": numpy.array([samples], numpy.int64),
                   "epoch_documents": numpy.array([documents], numpy.int64)}

    def _epochs(self):
        """As many epochs as ``num_samples`` needs (one when None), each as its documents with tokens in epoch order,
        where each of its samples starts (``packing.SampleStarts``) and its sample shuffle, offset by the epochs
        before it. Positions and sample ids are int32 where every epoch's fit, as megatron-core's indices are."""
        docs = self.indices  # megatron-core's int32 ids: half the memory of int64 in the orders below
        if self.dataset_path is not None:
            docs = split_as_corpus(self.dataset_path, docs, self.config.split_matrix, self.index_split.value)
        # Through a mapping of the .idx of its own, dropped with it: megatron-core's stays for the run, and the
        # pages read here would stay counted in this process's memory with it.
        lengths = self._documents.lengths(self.dataset.index if self.dataset_path is None
                                          else IndexArrays(get_idx_path(self.dataset_path)))
        split_lengths = lengths[docs]
        tokens, has_empty = int(split_lengths.sum(dtype=numpy.int64)), not split_lengths.all()
        del split_lengths
        if tokens == 0:
            raise ValueError(f"{self.dataset_path}: the {self.index_split.name} split has no "
                             "tokens; give it a larger share in --split or more data")
        seq = self.config.sequence_length
        # Bounds: a packed sample holds >= (seq - 2) / 3 tokens of its epoch; the stream re-reads >= 2 samples' worth.
        per_epoch = 3 * tokens // (seq - 2) + 2 if self.config.packed else docs.size + tokens // (seq - 2) + 1
        sample_id = numpy.int32 if (self.num_samples or 0) + per_epoch < 2**31 else numpy.int64
        positions = docs.size + 2 * seq + 1 + (docs.size * -(-2 * seq // tokens) if tokens < 2 * seq else 0)
        position = numpy.int32 if positions < 2**31 else numpy.int64
        samples = epoch = 0
        while True:
            rng = numpy.random.default_rng([self.config.random_seed, self._stream, epoch])
            order = docs.copy()
            native.shuffle(rng, order)  # docs[rng.permutation(docs.size)]'s order, without an int64 permutation
            if has_empty:  # documents without tokens take no place in the stream
                order = order[lengths[order] > 0]
            # The packer reads the lengths in epoch order itself (a copy of them in that order is as large as the
            # sample shuffle below, and one pass more).
            starts = (pack_starts(lengths, seq, order, tokens) if self.config.packed
                      else chunk_starts(lengths[order], seq))
            n = starts.position.shape[0]
            # Shuffle samples within the epoch so one long document's chunks spread over batches.
            shuffle = numpy.arange(samples, samples + n, dtype=sample_id)
            native.shuffle(rng, shuffle)
            yield order, starts._replace(position=starts.position.astype(position, copy=False)), shuffle
            samples, epoch = samples + n, epoch + 1
            if self.num_samples is None or samples >= self.num_samples:
                return


class StreamedNpy:
    """A 1-D ``.npy`` file written in parts: the data after a header of fixed size (128 bytes for any 1-D shape),
    the header written last, when the length is known."""

    HEADER_BYTES, CHUNK = 128, 1 << 22

    def __init__(self, path: str) -> None:
        self.path, self.size, self.dtype = path, 0, None
        self.file = open(path, "wb")
        self.file.seek(self.HEADER_BYTES)

    def append(self, array: numpy.ndarray) -> None:
        """The file's dtype is the first array's; values of later ones that do not fit it are the caller's error:
        the cast does not check them."""
        if self.dtype is None:
            self.dtype = array.dtype
        for at in range(0, array.shape[0], self.CHUNK):  # cast a slice at a time: no copy as large as the array
            numpy.ascontiguousarray(array[at:at + self.CHUNK], self.dtype).tofile(self.file)
        self.size += array.shape[0]

    def close(self) -> None:
        self.file.seek(0)
        numpy.lib.format.write_array_header_1_0(self.file, {
            "descr": numpy.lib.format.dtype_to_descr(self.dtype), "fortran_order": False, "shape": (self.size,)})
        if self.file.tell() != self.HEADER_BYTES:
            raise RuntimeError(f"{self.path}: a .npy header of {self.file.tell()} bytes, not {self.HEADER_BYTES}")
        self.file.close()

    def discard(self) -> None:
        """Close and remove the file unless it was completed and moved."""
        if not self.file.closed:
            self.file.close()
        if os.path.exists(self.path):
            os.remove(self.path)


def _is_rank0() -> bool:
    return not torch.distributed.is_initialized() or torch.distributed.get_rank() == 0


def build_mlm_datasets(config: MLMDatasetConfig,
                       train_valid_test_num_samples: List[Optional[int]],
                       is_built_on_rank: Optional[Callable[[], bool]] = None):
    """Build (train, valid, test) through megatron-core's ``BlendedMegatronDatasetBuilder``.

    ``train_valid_test_num_samples``: samples wanted per split (None: one epoch; weighted blends
    need numbers). Call on every rank: when torch.distributed is initialised rank 0 builds and
    caches the layouts first and the other ranks load them after a barrier. ``is_built_on_rank``
    defaults to every rank (the dataset is cheap once cached; the trainer may restrict it to
    tensor-parallel rank 0 and broadcast, as Megatron-LM does).
    """
    # A single process without a process group (a data tool, a notebook) is rank 0: it writes the index caches and
    # logs megatron-core's lines.
    with rank_zero_without_process_group():
        return BlendedMegatronDatasetBuilder(MLMDataset, list(train_valid_test_num_samples),
                                             is_built_on_rank or (lambda: True), config).build()
