"""Where checkpoints are: the marker, the iteration folders, finding the one to load, pruning.

    {root}/iter_0000200/                       megatron-core distributed checkpoint (any TP/PP/VPP)
    {root}/latest_checkpointed_iteration.txt   "200", written last, atomically

A loader follows only the marker: a folder it does not name (a save cut short) is not a checkpoint.
"""

import glob
import logging
import os
import re
import shutil
from typing import List, Optional

from megatron_neobert.atomic_write import write_text_atomic
from megatron_neobert.errors import InputError, TrainingError

logger = logging.getLogger(__name__)

LATEST_MARKER = "latest_checkpointed_iteration.txt"


def iteration_dir(root: str, iteration: int) -> str:
    return os.path.join(root, f"iter_{iteration:07d}")


def is_complete(folder: str) -> bool:
    """Whether megatron-core finished the folder (it writes metadata.json last)."""
    return os.path.isfile(os.path.join(folder, "metadata.json"))


def write_latest_marker(root: str, iteration: int) -> None:
    """Atomically point the root at a complete iteration folder (call only once it is complete)."""
    write_text_atomic(os.path.join(root, LATEST_MARKER), str(iteration))


def read_latest_iteration(root: str) -> Optional[int]:
    """The iteration the marker names, or None when the root has no complete checkpoint."""
    marker = os.path.join(root, LATEST_MARKER)
    if not os.path.isfile(marker):
        return None
    text = open(marker).read().strip()
    if not text.isdigit():
        raise ValueError(f"{marker}: expected an iteration number, found {text!r}")
    return int(text)


def saved_iterations(root: str) -> List[int]:
    """Every iteration folder under `root`, complete or not."""
    found = []
    for p in glob.glob(os.path.join(root, "iter_*")):
        m = re.fullmatch(r"iter_(\d+)", os.path.basename(p))
        if m and os.path.isdir(p):
            found.append(int(m.group(1)))
    return sorted(found)


def complete_iterations(root: str) -> List[int]:
    """Iteration folders the marker has reached; one past it is still being written."""
    latest = read_latest_iteration(root) if os.path.isdir(root) else None
    return [] if latest is None else [it for it in saved_iterations(root) if it <= latest]


def prune_checkpoints(root: str, keep: int) -> None:
    """Delete all but the `keep` newest iteration folders up to the marked one."""
    older = complete_iterations(root)
    for it in older[:-keep] if keep > 0 else []:
        shutil.rmtree(iteration_dir(root, it), ignore_errors=True)


def find_checkpoint(root: str, step: Optional[int] = None) -> Optional[str]:
    """The complete iteration folder to load from a checkpoint root: the marker's, or iteration `step`
    (--ckpt-step); None when the root has no marker.

    Folders without a marker (a first save cut short) are ignored with a warning; a marker or a `step`
    that names a missing or incomplete folder is an error, not something to silently start over from.
    """
    if step is not None:
        path = iteration_dir(root, step)
        if not is_complete(path):
            raise TrainingError(f"--ckpt-step {step}: {path} is missing or incomplete (no metadata.json)")
        return path
    iteration = read_latest_iteration(root) if os.path.isdir(root) else None
    if iteration is None:
        leftovers = saved_iterations(root) if os.path.isdir(root) else []
        if leftovers:
            logger.warning("%s: no %s, so iteration folders %s are incomplete and ignored",
                           root, LATEST_MARKER, leftovers)
        return None
    path = iteration_dir(root, iteration)
    if not is_complete(path):
        raise TrainingError(f"{root}/{LATEST_MARKER} names iteration {iteration}, but {path} is missing "
                            f"or incomplete (no metadata.json); refusing to load or to start over")
    return path


def find_pretrained_checkpoint(root: str) -> str:
    """--pretrained-checkpoint's iteration folder. One that holds none is an error: the run would otherwise train
    from scratch and exit 0, which is not what the flag asked for."""
    path = find_checkpoint(root)
    if path is None:
        raise InputError(f"--pretrained-checkpoint {root} holds no checkpoint (no {LATEST_MARKER}): give the "
                         f"folder a run saved with --save, or a converted checkpoint's")
    return path


def resolve_checkpoint_dir(path: str) -> str:
    """An iteration folder from either a checkpoint root (`find_checkpoint`) or an iteration folder (the
    converters and tools take either)."""
    if not os.path.isdir(path):
        raise FileNotFoundError(f"checkpoint {path!r} does not exist")
    folder = find_checkpoint(path) or path
    if not is_complete(folder):
        raise ValueError(f"{path!r} is not a megatron-core distributed checkpoint "
                         f"(no metadata.json, and no {LATEST_MARKER} pointing at one)")
    return folder
