"""Expensive fixture results (trainer runs, preprocessed data, converted checkpoints) computed once per test
session and shared by the xdist workers, which would otherwise each compute them again for their share of a
module's tests."""

import fcntl
import os
import pickle
import shutil
from pathlib import Path
from typing import Any, Callable


def session_folder(tmp_path_factory) -> Path:
    """A folder every xdist worker of this session sees: the parent of the workers' base temps under xdist."""
    base = tmp_path_factory.getbasetemp()
    root = (base.parent if os.environ.get("PYTEST_XDIST_WORKER") else base) / "shared"
    root.mkdir(exist_ok=True)
    return root


def run_once(tmp_path_factory, name: str, compute: Callable[[Path], Any]) -> Any:
    """`compute(folder)` in the first worker that asks for `name`; the others wait for it and get the result
    it returned (which must pickle). Files it writes into `folder` are shared: a test must not change them
    (copy them first). The folder is computed in place, since results may hold paths into it; the result is
    written last (beside the folder), so a killed worker leaves a folder without one, computed again by the next
    to ask."""
    root = session_folder(tmp_path_factory)
    folder, result = root / name, root / f"{name}.pkl"
    with open(root / f"{name}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # released when the file is closed, or its process dies
        if not result.is_file():
            shutil.rmtree(folder, ignore_errors=True)
            folder.mkdir()
            value = compute(folder)
            partial = root / f"{name}.pkl.tmp{os.getpid()}"
            partial.write_bytes(pickle.dumps(value))
            os.replace(partial, result)
        return pickle.loads(result.read_bytes())
