"""Checkpoint layout shared by the trainer and the converters.

A checkpoint root (`--save` / `--load`) holds one folder per saved iteration and a marker:

    {root}/iter_0000200/                 megatron-core distributed checkpoint (any TP/PP/VPP)
    {root}/latest_checkpointed_iteration.txt   "200", written last, atomically

Inside an iteration folder the model's tensors come from `model_sharded_state_dict(chunks)`:
under "model" (one chunk) or "model0", "model1", ... (virtual pipeline stages), as Megatron-LM
does. Sharded-tensor keys are global (layer numbers included), so a checkpoint loads at any
other TP/PP/VPP layout. The common (unsharded) state holds "iteration", "checkpoint_version" and
"args" as Megatron-LM saves them: an `argparse.Namespace` with the model's sizes at top level
(what Megatron-LM's load_args_from_checkpoint and its tools read) plus "arch", the `NeoBERTArch`
fields. Older checkpoints of this project hold a dict instead; `checkpoint_args` reads both.
"""

import argparse
import dataclasses
import os
from typing import List, Optional

import torch

LATEST_MARKER = "latest_checkpointed_iteration.txt"
CHECKPOINT_VERSION = 3.0  # Megatron-LM's: args a Namespace, TP and PP sizes in them

# torch.load(weights_only=True), also inside megatron-core's load_common_state_dict, refuses any
# class it does not know; a Namespace of plain values is safe to rebuild.
torch.serialization.add_safe_globals([argparse.Namespace])


def megatron_lm_args(arch, padded_vocab_size: int, **settings) -> argparse.Namespace:
    """A checkpoint's args: `settings` (the run's flags) with the model's shape at top level under
    Megatron-LM's names, and "arch"."""
    learned = arch.position_embedding_type == "learned_absolute"
    shape = dict(
        num_layers=arch.num_layers, hidden_size=arch.hidden_size, ffn_hidden_size=arch.ffn_hidden_size,
        num_attention_heads=arch.num_attention_heads, kv_channels=arch.kv_channels,
        num_query_groups=arch.num_attention_heads, group_query_attention=False,
        max_position_embeddings=arch.max_sequence_length, position_embedding_type=arch.position_embedding_type,
        add_position_embedding=learned, use_rotary_position_embeddings=not learned,
        rotary_base=arch.rotary_base, rotary_percent=1.0, rotary_interleaved=False,
        add_bias_linear=arch.add_bias_linear, add_qkv_bias=arch.add_bias_linear,
        swiglu=arch.activation == "swiglu", squared_relu=False, normalization=arch.normalization,
        norm_epsilon=arch.norm_epsilon, apply_layernorm_1p=False, untie_embeddings_and_output_weights=True,
        attention_dropout=settings.get("attention_dropout", 0.0), hidden_dropout=settings.get("hidden_dropout", 0.0),
        num_experts=None, expert_model_parallel_size=1,
        vocab_size=arch.vocab_size, padded_vocab_size=padded_vocab_size, ckpt_format="torch_dist")
    return argparse.Namespace(**{**settings, **shape, "arch": dataclasses.asdict(arch)})


def checkpoint_args(common: dict) -> dict:
    """A checkpoint's args as a dict (a live view of a Namespace), from either form."""
    args = common["args"]
    return vars(args) if isinstance(args, argparse.Namespace) else args


def rotary_layout_problem(args: dict) -> Optional[str]:
    """Why this version cannot read a checkpoint's Q/K rows, or None.

    RoPE models keep each head's Q and K rows in rotate-half order, so that megatron-core's fused
    RoPE applies, and say so with Megatron-LM's `rotary_interleaved=False`. Earlier versions wrote
    the rows interleaved without recording it: loaded as they are, every attention score would be
    wrong without an error. Their Hugging Face export has the same layout as this version's.
    """
    if args.get("arch", {}).get("position_embedding_type") == "learned_absolute" or args.get("rotary_interleaved") is False:
        return None
    return ("its args do not record rotary_interleaved=False: its Q/K rows are in the interleaved RoPE order of "
            "earlier megatron_neobert versions, which this version does not read; export it to Hugging Face with "
            "the version that wrote it (tools/convert_checkpoint.py) and import that folder with this one")


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
