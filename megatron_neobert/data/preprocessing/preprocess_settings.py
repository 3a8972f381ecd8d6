"""The preprocessor's settings, declared once for `preprocess_data` (data/preprocessing/preprocess.py) and the
neobert-preprocess-data flags; kept free of megatron-core, so that --help answers at once."""

import dataclasses
from typing import List, Optional

from megatron_neobert.data.tokenizer import TokenizerSettings
from megatron_neobert.flags import setting


@dataclasses.dataclass(frozen=True)
class InputSettings:
    json_keys: List[str] = setting(["text"], "text field(s) to tokenize, one output dataset per key; as Megatron-LM's "
                                             "default (RefinedWeb's field is content)")
    split_sentences: bool = setting(False, "as Megatron-LM's: split each text into sentences with NLTK punkt (needs "
                                           "nltk and its punkt_tab model for --lang), tokenize each on its own, one "
                                           "sequence per non-empty sentence; writes {prefix}_{key}_sentence instead "
                                           "of _document")
    keep_newlines: bool = setting(False, "as Megatron-LM's: keep the newlines after sentences in the sentences (only "
                                         "with --split-sentences)")
    lang: str = setting("english", "as Megatron-LM's: the punkt model (language) of --split-sentences")


@dataclasses.dataclass(frozen=True)
class PreprocessTokenizerSettings(TokenizerSettings):
    append_eod: bool = setting(False, "append the end-of-document token (EOS, else [SEP]) to each non-empty document "
                                      "(with --split-sentences: to its last sentence)")


@dataclasses.dataclass(frozen=True)
class OutputSettings:
    shard_dir: Optional[str] = setting(None, "where per-file shards are kept until merged (default: "
                                             "OUTPUT_PREFIX_shards)")


@dataclasses.dataclass(frozen=True)
class RuntimeSettings:
    workers: int = setting(1, "tokenizer worker processes")
    partitions: int = setting(1, "input files (shards) tokenized at once, each by workers // partitions processes, "
                                 "merged in input order: the bytes never depend on it. Megatron-LM's instead deals "
                                 "its input lines into this many partition files, round-robin (another document "
                                 "order) unless --keep-sequential-samples; so ours equals its output with "
                                 "--partitions 1 or --keep-sequential-samples (docs/data.md)")
    log_interval: int = setting(1000, "log progress every this many documents of a file (0: never)")
    chunk_documents: int = setting(64, "documents per task sent to a worker")
    rank: Optional[int] = setting(None, "this node's share of the files (default: SLURM array task or torchrun RANK, "
                                        "else 0)")
    world_size: Optional[int] = setting(None, "nodes sharing the files (default: SLURM_ARRAY_TASK_COUNT or torchrun "
                                              "WORLD_SIZE, else 1); with more than one, shards are not merged")


@dataclasses.dataclass(frozen=True)
class PreprocessSettings(RuntimeSettings, OutputSettings, PreprocessTokenizerSettings, InputSettings):
    """Every setting of `preprocess_data`."""
