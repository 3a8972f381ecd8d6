"""Changing a saved checkpoint's common state, as older versions or other tools wrote it."""

import os
from typing import Callable

import torch

from megatron_neobert.megatron_core_compat import COMMON_STATE_FILE, load_common_state


def rewrite_common_state(folder, change: Callable[[dict], None]) -> None:
    """Apply `change` to the common state of the checkpoint in `folder` and save it as a common.pt: the layout every
    supported megatron-core reads (0.19, which keeps it in the .distcp files, reads a common.pt first)."""
    common = load_common_state(str(folder))
    change(common)
    torch.save(common, os.path.join(folder, COMMON_STATE_FILE))
