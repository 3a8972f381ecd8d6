"""Checks at the start of a run that would otherwise fail deep inside a step or a load."""

import dataclasses
from typing import Optional

from megatron_neobert.model import NeoBERTArch
from megatron_neobert.training.checkpointing import checkpoint_args
from megatron_neobert.training.errors import TrainingError
from megatron_neobert.training.train_log import print_rank_0

# Settings that decide the layout of the optimizer state in a checkpoint.
OPTIMIZER_SETUP = {"bf16": "--bf16", "use_distributed_optimizer": "--use-distributed-optimizer"}


def trained_length(args, arch: NeoBERTArch, common: Optional[dict]) -> NeoBERTArch:
    """The architecture the run records: with RoPE, `max_sequence_length` becomes the longest
    length the model was trained at (this run's --seq-length, or a loaded checkpoint's record),
    so that the export announces it; learned positions cannot go beyond their table."""
    if arch.position_embedding_type != "rope":
        if args.seq_length > arch.max_sequence_length:
            raise TrainingError(f"--seq-length {args.seq_length} is longer than the {arch.max_sequence_length} "
                                f"learned positions of --model-preset {args.model_preset} "
                                f"({arch.position_embedding_type}); lower --seq-length or raise "
                                f"--max-position-embeddings (a new position table)")
        return arch
    loaded = checkpoint_args(common).get("arch", {}).get("max_sequence_length", 0) if common else 0
    longest = max(arch.max_sequence_length, args.seq_length, loaded)
    if args.seq_length > arch.max_sequence_length:
        print_rank_0(f"--seq-length {args.seq_length} is above the preset's {arch.max_sequence_length} positions: "
                     f"allowed with RoPE; the checkpoint records {longest} as the model's length")
    return dataclasses.replace(arch, max_sequence_length=longest)


def check_optimizer_setup(args, checkpoint: str, common: dict) -> None:
    """A checkpoint's optimizer state loads only into the optimizer setup that saved it."""
    saved = checkpoint_args(common)
    on_off = lambda value: "on" if value else "off"
    differs = [f"{flag} {on_off(saved.get(key))} there, {on_off(getattr(args, key))} here"
               for key, flag in OPTIMIZER_SETUP.items() if bool(saved.get(key)) != bool(getattr(args, key))]
    if differs:
        raise TrainingError(f"checkpoint {checkpoint} holds optimizer state of another setup ({'; '.join(differs)}); "
                            f"start with a fresh optimizer state with --no-load-optim (the weights, iteration, "
                            f"schedule and data position still load)")
