"""Read RefinedWeb-style text records: Parquet, JSON lines (plain, .gz, .zst), HF datasets folders.

Every input path is expanded into *partitions* (one file, or one saved ``datasets`` folder);
``iter_records`` yields ``Record``s carrying the file and record number so errors and skip
warnings can name them. A record that cannot be used is yielded with ``skip`` set to the reason
(the caller counts it); a problem that would make the whole run wrong (a missing text field, an
unreadable file) raises ``DataInputError``.
"""

import glob
import gzip
import io
import json
import os
from dataclasses import dataclass
from typing import Dict, Iterator, List, Optional, Sequence

from megatron_neobert.extras import require_extra

JSON_SUFFIXES = (".jsonl", ".json", ".jsonl.gz", ".json.gz", ".jsonl.zst", ".json.zst")
PARQUET_SUFFIXES = (".parquet",)


class DataInputError(ValueError):
    """An input problem that stops preprocessing (names the file and, if any, the record)."""


@dataclass
class Record:
    source: str
    index: int  # 0-based row (Parquet, datasets) or line number - 1 (JSON lines)
    texts: Optional[Dict[str, str]]  # key -> text; None when skipped
    skip: Optional[str] = None  # reason, e.g. "not JSON", "not UTF-8", "null text"

    @property
    def where(self) -> str:
        return f"{self.source}, record {self.index + 1}"


def _is_hf_dataset_dir(path: str) -> bool:
    return os.path.isdir(path) and any(
        os.path.isfile(os.path.join(path, name))
        for name in ("dataset_dict.json", "state.json", "dataset_info.json"))


def _is_data_file(path: str) -> bool:
    return path.endswith(JSON_SUFFIXES + PARQUET_SUFFIXES)


def expand_inputs(inputs: Sequence[str]) -> List[str]:
    """Files, globs and folders -> the sorted list of partitions (data files or HF folders)."""
    partitions: List[str] = []
    for spec in inputs:
        matches = sorted(glob.glob(spec)) if glob.has_magic(spec) else [spec]
        if not matches:
            raise DataInputError(f"input {spec!r} matches no file")
        for path in matches:
            if _is_hf_dataset_dir(path):
                partitions.append(path)
            elif os.path.isdir(path):
                found = sorted(os.path.join(root, f) for root, _, files in os.walk(path)
                               for f in files if _is_data_file(f))
                if not found:
                    raise DataInputError(f"folder {path!r} holds no {JSON_SUFFIXES + PARQUET_SUFFIXES}"
                                         " file and is not a saved Hugging Face dataset")
                partitions.extend(found)
            elif os.path.isfile(path):
                if not _is_data_file(path):
                    raise DataInputError(f"input {path!r}: unknown format; expected one of "
                                         f"{JSON_SUFFIXES + PARQUET_SUFFIXES} or a datasets folder")
                partitions.append(path)
            else:
                raise DataInputError(f"input {path!r} does not exist")
    return partitions


def count_records(partition: str) -> Optional[int]:
    """Rows in a partition when cheap to know (Parquet metadata, datasets), else None."""
    if partition.endswith(PARQUET_SUFFIXES):
        import pyarrow.parquet as pq
        try:
            return pq.ParquetFile(partition).metadata.num_rows
        except Exception:
            return None
    return None


def _check_text(source: str, index: int, key: str, value) -> Optional[str]:
    """Return a skip reason for a text value, or None if it is usable."""
    if value is None:
        return "null text"
    if not isinstance(value, str):
        raise DataInputError(f"{source}, record {index + 1}: field {key!r} is a "
                             f"{type(value).__name__}, not text")
    return None  # an empty text is kept: it becomes an empty document, as in Megatron-LM


def _make_record(source: str, index: int, row: Dict, keys: Sequence[str]) -> Record:
    texts = {}
    for key in keys:
        if key not in row:
            raise DataInputError(f"{source}, record {index + 1}: no field {key!r} (the record has "
                                 f"{sorted(row)[:20]}); pass the text field with --json-keys")
        reason = _check_text(source, index, key, row[key])
        if reason is not None:
            return Record(source, index, None, reason)
        texts[key] = row[key]
    return Record(source, index, texts)


def _open_binary(path: str):
    if path.endswith(".gz"):
        return gzip.open(path, "rb")
    if path.endswith(".zst"):
        import zstandard
        raw = open(path, "rb")
        return io.BufferedReader(zstandard.ZstdDecompressor().stream_reader(raw, closefd=True))
    return open(path, "rb")


def _iter_json_lines(path: str, keys: Sequence[str]) -> Iterator[Record]:
    try:
        with _open_binary(path) as f:
            for index, raw in enumerate(f):
                if not raw.strip():
                    yield Record(path, index, None, "blank line")
                    continue
                try:
                    line = raw.decode("utf-8")
                except UnicodeDecodeError:
                    yield Record(path, index, None, "not UTF-8")
                    continue
                try:
                    row = json.loads(line)
                except json.JSONDecodeError:
                    yield Record(path, index, None, "not JSON")
                    continue
                if not isinstance(row, dict):
                    yield Record(path, index, None, "not a JSON object")
                    continue
                yield _make_record(path, index, row, keys)
    except (OSError, EOFError) as err:  # truncated .gz, corrupt .zst
        raise DataInputError(f"{path}: cannot read: {err}") from err


def _iter_parquet(path: str, keys: Sequence[str], batch_rows: int = 1024) -> Iterator[Record]:
    import pyarrow.parquet as pq
    try:
        pf = pq.ParquetFile(path)
    except Exception as err:
        raise DataInputError(f"{path}: not a readable Parquet file: {err}") from err
    names = pf.schema_arrow.names
    missing = [k for k in keys if k not in names]
    if missing:
        raise DataInputError(f"{path}: no column {missing[0]!r} (columns: {names}); "
                             "RefinedWeb keeps its text in 'content'; pass --json-keys")
    index = 0
    try:
        for batch in pf.iter_batches(batch_size=batch_rows, columns=list(keys)):
            columns = {k: batch.column(k).to_pylist() for k in keys}
            for i in range(batch.num_rows):
                yield _make_record(path, index, {k: columns[k][i] for k in keys}, keys)
                index += 1
    except DataInputError:
        raise
    except Exception as err:  # arrow errors on corrupt pages or invalid UTF-8
        raise DataInputError(f"{path}: cannot read after record {index}: {err}") from err


def _iter_hf_dataset(path: str, keys: Sequence[str], batch_rows: int = 1024) -> Iterator[Record]:
    require_extra("eval", f"{path} (a saved Hugging Face dataset)", ("datasets",))
    import datasets

    ds = datasets.load_from_disk(path)
    if isinstance(ds, datasets.DatasetDict):
        if "train" not in ds:
            raise DataInputError(f"{path}: a DatasetDict without a 'train' split ({list(ds)})")
        ds = ds["train"]
    missing = [k for k in keys if k not in ds.column_names]
    if missing:
        raise DataInputError(f"{path}: no column {missing[0]!r} (columns: {ds.column_names}); "
                             "pass --json-keys")
    index = 0
    for batch in ds.select_columns(list(keys)).iter(batch_size=batch_rows):
        for i in range(len(batch[keys[0]])):
            yield _make_record(path, index, {k: batch[k][i] for k in keys}, keys)
            index += 1


def iter_records(partition: str, keys: Sequence[str]) -> Iterator[Record]:
    """Yield the records of one partition in file order."""
    if _is_hf_dataset_dir(partition):
        return _iter_hf_dataset(partition, keys)
    if partition.endswith(PARQUET_SUFFIXES):
        return _iter_parquet(partition, keys)
    return _iter_json_lines(partition, keys)
