"""Checkpoint layout shared by the trainer and the converters.

A checkpoint root (`--save` / `--load`) holds one folder per saved iteration and a marker:

    {root}/iter_0000200/                 megatron-core distributed checkpoint (any TP/PP/VPP)
    {root}/latest_checkpointed_iteration.txt   "200", written last, atomically

Inside an iteration folder the model's tensors come from `model_sharded_state_dict(chunks)`:
under "model" (one chunk) or "model0", "model1", ... (virtual pipeline stages), as Megatron-LM
does. Sharded-tensor keys are global (layer numbers included), so a checkpoint loads at any
other TP/PP/VPP layout. The common (unsharded) state holds "args" (a dict that includes
"arch", the `NeoBERTArch` fields) and "iteration".
"""

import os
from typing import List, Optional

import torch

LATEST_MARKER = "latest_checkpointed_iteration.txt"


def iteration_dir(root: str, iteration: int) -> str:
    return os.path.join(root, f"iter_{iteration:07d}")


def model_sharded_state_dict(chunks: List[torch.nn.Module]) -> dict:
    from megatron_neobert.training.model_setup import unwrap

    if len(chunks) == 1:
        return {"model": unwrap(chunks[0]).sharded_state_dict()}
    return {f"model{i}": unwrap(c).sharded_state_dict() for i, c in enumerate(chunks)}


def load_model_state(chunks: List[torch.nn.Module], state: dict) -> None:
    """Copy the "model"/"modelN" entries of a loaded checkpoint into the chunks."""
    from megatron_neobert.training.model_setup import unwrap

    keys = ["model"] if len(chunks) == 1 else [f"model{i}" for i in range(len(chunks))]
    for key, chunk in zip(keys, chunks):
        unwrap(chunk).load_state_dict(state[key], strict=True)


def write_latest_marker(root: str, iteration: int) -> None:
    """Atomically point the root at a complete iteration folder (call only once it is complete)."""
    tmp = os.path.join(root, f".{LATEST_MARKER}.tmp")
    with open(tmp, "w") as f:
        f.write(str(iteration))
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, os.path.join(root, LATEST_MARKER))


def read_latest_iteration(root: str) -> Optional[int]:
    """The iteration the marker names, or None when the root has no complete checkpoint."""
    marker = os.path.join(root, LATEST_MARKER)
    if not os.path.isfile(marker):
        return None
    text = open(marker).read().strip()
    if not text.isdigit():
        raise ValueError(f"{marker}: expected an iteration number, found {text!r}")
    return int(text)


def resolve_checkpoint_dir(path: str) -> str:
    """An iteration folder from either a checkpoint root (its latest) or an iteration folder."""
    if not os.path.isdir(path):
        raise FileNotFoundError(f"checkpoint {path!r} does not exist")
    iteration = read_latest_iteration(path)
    if iteration is not None:
        path = iteration_dir(path, iteration)
    if not os.path.isfile(os.path.join(path, "metadata.json")):
        raise ValueError(f"{path!r} is not a megatron-core distributed checkpoint "
                         f"(no metadata.json, and no {LATEST_MARKER} pointing at one)")
    return path
