"""Checks and corrections the MLM dataset applies to each indexed dataset it opens.

- ``check_vocabulary``: token ids the trainer's tokenizer (hence the model) cannot embed stop the
  run before training, naming the dataset; read from the record beside the ``.idx``. Data without
  a record (another tool's) is checked as samples are read: ``unknown_token_error``.
- ``split_as_corpus``: a length subset takes the documents of the corpus's split, so a blend of
  a corpus and its subsets never trains on a validation document.
"""

import logging
import os

import numpy

from megatron_neobert.data.records import SOURCE_IDS_SUFFIX, read_record, record_path

logger = logging.getLogger(__name__)


def check_vocabulary(prefix: str, tokenizer) -> None:
    record = read_record(prefix)
    if record is None or "vocab_size" not in record:
        logger.warning("%s has no tokenizer record (%s): its token ids are checked as samples are read "
                       "rather than against the tokenizer %s before training", prefix, record_path(prefix),
                       tokenizer.tokenizer_model)
        return
    # Data tokenized without Megatron-LM's two appended BERT specials ([BOS] [EOS]) has the same ids below them.
    same_vocabulary = record["vocab_size"] in (tokenizer.vocab_size, getattr(tokenizer, "base_vocab_size", None))
    if record["max_token_id"] >= tokenizer.vocab_size or not same_vocabulary:
        raise ValueError(
            f"dataset {prefix} was tokenized with {record['tokenizer_type']} "
            f"{record['tokenizer_model']!r} (vocabulary {record['vocab_size']:,}, largest id "
            f"{record['max_token_id']:,}) but training uses {tokenizer.tokenizer_model!r} with "
            f"{tokenizer.vocab_size:,} entries: preprocess it again with the training tokenizer")


def unknown_token_error(prefix: str, document: int, tokens: numpy.ndarray, known: int, tokenizer) -> ValueError:
    """The error for a document holding an id at or above `known` (one line: a worker's error reaches
    the log as its last line)."""
    bad = int(tokens.max())
    return ValueError(f"dataset {prefix}: document {document} holds token id {bad:,}, beyond the {known:,} ids "
                      f"of the tokenizer {tokenizer.tokenizer_model!r} (tokenized with another vocabulary, or "
                      f"Megatron-LM's --append-eod [EOS] at vocab + 1): preprocess it with the training tokenizer")


def split_as_corpus(prefix: str, indices: numpy.ndarray, split_matrix, split_index: int
                    ) -> numpy.ndarray:
    """A length subset's documents in the corpus's range for this split (megatron-core's own
    rounding); other datasets, and datasets named per split (no split matrix), keep ``indices``."""
    record = read_record(prefix)
    if split_matrix is None or record is None or not os.path.isfile(prefix + SOURCE_IDS_SUFFIX):
        return indices
    n = record["source_documents"]
    lo, hi = (int(round(x * float(n))) for x in split_matrix[split_index])
    source = numpy.load(prefix + SOURCE_IDS_SUFFIX, mmap_mode="r")
    return numpy.flatnonzero((source >= lo) & (source < hi)).astype(indices.dtype)
