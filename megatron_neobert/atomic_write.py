"""Files that readers never see half-written: write a temporary sibling, then rename it over."""

import json
import os
import uuid
from pathlib import Path
from typing import Union

PathLike = Union[str, os.PathLike]


def write_text_atomic(path: PathLike, text: str) -> None:
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    # A unique name: concurrent writers of the same file never share a temporary.
    tmp = path.parent / f".{path.name}.tmp-{uuid.uuid4().hex[:8]}"
    tmp.write_text(text, encoding="utf-8")
    os.replace(tmp, path)


def write_json_atomic(path: PathLike, obj) -> None:
    write_text_atomic(path, json.dumps(obj, indent=2) + "\n")
