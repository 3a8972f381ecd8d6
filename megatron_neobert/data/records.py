"""The record written beside a dataset's ``.idx``: ``{prefix}.tokenizer.json``.

It names the tokenizer the tokens came from, its vocabulary size, the largest token id written
and whether an end-of-document token ends each document (``--append-eod``), so the trainer can
refuse data made for another vocabulary before training starts and the MLM dataset can drop the
EOD instead of doubling it with its own [SEP]. Shards also record the input file they came from
(path, size, modification time, and the SHA-256 of its bytes as ``input_sha256``): the record is
written last and marks the shard complete.

Datasets written by other tools (Megatron-LM) have no record; checks that need it are skipped
with a warning.
"""

import json
import os
from typing import Dict, Optional

from megatron_neobert.atomic_write import write_json_atomic
from megatron_neobert.data.indexed import commit_pair

RECORD_SUFFIX = ".tokenizer.json"
# Beside a length subset: the source corpus's id of each of its documents (the split follows the source's).
SOURCE_IDS_SUFFIX = ".source_ids.npy"


def record_path(prefix: str) -> str:
    return prefix + RECORD_SUFFIX


def tokenizer_record(tokenizer, append_eod: bool) -> Dict:
    return {"tokenizer_type": tokenizer.tokenizer_type, "tokenizer_model": tokenizer.tokenizer_model,
            "vocab_size": int(tokenizer.vocab_size), "append_eod": bool(append_eod),
            "eod_id": int(tokenizer.eod_id) if append_eod else None}


def read_record(prefix: str) -> Optional[Dict]:
    path = record_path(prefix)
    if not os.path.isfile(path):
        return None
    with open(path, encoding="utf-8") as f:
        return json.load(f)


def publish(prefix: str, record: Optional[Dict]) -> None:
    """Move a checked ``.partial`` pair to its final names, then write its record (if any). The
    old record goes first, so a record never describes another pair."""
    if os.path.exists(record_path(prefix)):
        os.remove(record_path(prefix))
    commit_pair(prefix)
    if record is not None:
        write_json_atomic(record_path(prefix), record)
