"""Files and folders that readers never see half-written and that a crash of the machine does not leave half-written:
the content is written under a temporary sibling name, flushed to disk (fsync), renamed over the final name, and the
rename itself made durable (fsync of the parent folder). The one way this package writes a file or a folder that
something else reads.

    write_text_atomic(path, text) / write_json_atomic(path, obj)
    with atomic_file(path, "wb") as f: ...                # an open file
    with atomic_path(path) as tmp: numpy.save(tmp, ...)   # a file or folder that another library writes
"""

import contextlib
import json
import os
import shutil
import uuid
from pathlib import Path
from typing import IO, Iterator, Union

PathLike = Union[str, os.PathLike]


def temporary_sibling(path: PathLike) -> Path:
    """A unique name beside `path` that no reader takes for it (a leading dot, `.tmp-`), with the same suffix, which
    writers such as numpy.save and matplotlib read the format from. Concurrent writers never share one."""
    path = Path(path)
    return path.parent / f".{path.stem}.tmp-{uuid.uuid4().hex[:8]}{path.suffix}"


def fsync_folder(folder: PathLike) -> None:
    """Make the folder's entries (a file created, renamed or removed in it) durable."""
    fd = os.open(folder, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _fsync_tree(path: Path) -> None:
    """Every file of a folder written by another library (save_pretrained, ...), and its folders, to disk."""
    for folder, _, files in os.walk(path):
        for name in files:
            with open(os.path.join(folder, name), "rb") as f:
                os.fsync(f.fileno())
        fsync_folder(folder)


def commit(tmp: PathLike, path: PathLike) -> None:
    """Put the finished `tmp` (a file, or a folder) at `path`, durably, replacing what is there. A folder cannot be
    renamed over a non-empty one: the old one is moved aside first and deleted once the new one is in place."""
    tmp, path = Path(tmp), Path(path)
    if tmp.is_dir():
        _fsync_tree(tmp)
    else:
        with open(tmp, "rb") as f:
            os.fsync(f.fileno())
    old = None
    if path.is_dir() and not path.is_symlink():
        old = temporary_sibling(path)
        os.replace(path, old)
    os.replace(tmp, path)
    fsync_folder(path.parent)
    if old is not None:
        shutil.rmtree(old)


def _discard(tmp: Path) -> None:
    if tmp.is_dir() and not tmp.is_symlink():
        shutil.rmtree(tmp, ignore_errors=True)
    elif tmp.exists() or tmp.is_symlink():
        tmp.unlink()


@contextlib.contextmanager
def atomic_path(path: PathLike) -> Iterator[Path]:
    """A temporary sibling of `path` for the block to create (a file or a folder); committed to `path` when the block
    ends, deleted when it raises."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = temporary_sibling(path)
    try:
        yield tmp
        commit(tmp, path)
    except BaseException:
        _discard(tmp)
        raise


@contextlib.contextmanager
def atomic_file(path: PathLike, mode: str = "w", **open_kwargs) -> Iterator[IO]:
    """`open(path, mode)` for writing, atomically and durably (see the module's doc)."""
    with atomic_path(path) as tmp, open(tmp, mode, **open_kwargs) as f:
        yield f


def write_text_atomic(path: PathLike, text: str) -> None:
    with atomic_file(path, "w", encoding="utf-8") as f:
        f.write(text)


def write_json_atomic(path: PathLike, obj) -> None:
    write_text_atomic(path, json.dumps(obj, indent=2) + "\n")
