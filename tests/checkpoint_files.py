"""Changing a saved checkpoint's common state, as older versions or other tools wrote it."""

import json
import os
from typing import Callable

import torch

from megatron_neobert.megatron_core_compat import COMMON_STATE_FILE, load_common_state
from megatron_neobert.model import get_arch, padded_vocab_size
from megatron_neobert.checkpoint.layout import iteration_dir, write_latest_marker
from megatron_neobert.checkpoint.state import CHECKPOINT_VERSION, megatron_lm_args


def rewrite_common_state(folder, change: Callable[[dict], None]) -> None:
    """Apply `change` to the common state of the checkpoint in `folder` and save it as a common.pt: the layout every
    supported megatron-core reads (0.19, which keeps it in the .distcp files, reads a common.pt first)."""
    common = load_common_state(str(folder))
    change(common)
    torch.save(common, os.path.join(folder, COMMON_STATE_FILE))


def args_only_checkpoint(root, **args) -> str:
    """A checkpoint root whose one iteration holds a common state alone, its args those of the neobert-tiny preset's
    model updated with `args`: what a run reads before its settings are resolved (its tokenizer, with
    --use-checkpoint-args its shape and length), for tests that stop there. Returns the root."""
    folder = iteration_dir(str(root), 0)
    os.makedirs(folder)
    with open(os.path.join(folder, "metadata.json"), "w") as f:
        json.dump({"sharded_backend": "torch_dist", "sharded_backend_version": 1, "common_backend": "torch",
                   "common_backend_version": 1}, f)
    arch = args.pop("arch", get_arch("neobert-tiny"))
    saved = megatron_lm_args(arch, padded_vocab_size(arch.vocab_size), model_preset=None, **args)
    torch.save({"args": saved, "iteration": 0, "checkpoint_version": CHECKPOINT_VERSION},
               os.path.join(folder, COMMON_STATE_FILE))
    write_latest_marker(str(root), 0)
    return str(root)
