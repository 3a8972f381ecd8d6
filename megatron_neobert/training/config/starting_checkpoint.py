"""The checkpoint a run starts from, read before its settings are resolved and checked (as Megatron-LM loads the
checkpoint's args before validating its own): with --use-checkpoint-args its sequence length, and without a tokenizer
flag its tokenizer, become the run's, so that every check sees them. The model's shape is taken from the same record
by `model.resolve_model_shape`.

Reads files only (the marker and the common state): every rank reads alike, before any process group exists."""

import os
from typing import Optional, Set, Tuple

from megatron_neobert.checkpoint.layout import find_checkpoint, find_pretrained_checkpoint
from megatron_neobert.data.tokenizer import NULL_TOKENIZER
from megatron_neobert.errors import InputError

TOKENIZER_SETTINGS = ("tokenizer_type", "tokenizer_model", "vocab_file")


def _same_folder(a: Optional[str], b: Optional[str]) -> bool:
    return bool(a and b) and os.path.abspath(a) == os.path.abspath(b)


def starting_checkpoint(values: dict) -> Optional[Tuple[str, dict]]:
    """(iteration folder, args) of the checkpoint the run will load: --load's, else --pretrained-checkpoint's; None
    when neither holds one, or when the run takes nothing from its args (--use-checkpoint-args not given, a
    tokenizer flag given): the trainer reads and verifies it then. A --load folder that does not exist is refused
    unless it is --save too (Megatron-LM's resume idiom, `--save X --load X`, starts from scratch the first time):
    elsewhere it is a typo that would train from scratch and exit 0."""
    load, pretrained = values.get("load"), values.get("pretrained_checkpoint")
    if load and not os.path.exists(load) and not _same_folder(load, values.get("save")):
        raise InputError(f"--load {load}: no checkpoint in {load} (the folder does not exist); give the folder that "
                         f"holds the checkpoint, the same folder as --save to resume the run there once it has saved, "
                         f"or no --load to start from scratch")
    if pretrained and not os.path.isdir(pretrained):
        raise InputError(f"--pretrained-checkpoint {pretrained}: no such folder")
    needed = values.get("use_checkpoint_args") or not any(name in values for name in TOKENIZER_SETTINGS)
    if not (load or pretrained) or not needed:  # the trainer reads and verifies it, collectively
        return None
    from megatron_neobert.kernels import import_megatron_core  # quietly, before the checkpoint code imports it

    import_megatron_core()
    from megatron_neobert.checkpoint.integrity import size_problem
    from megatron_neobert.checkpoint.state import checkpoint_args, read_common_state

    folder = find_checkpoint(load, values.get("ckpt_step")) if load and os.path.isdir(load) else None
    if folder is None and pretrained:
        folder = find_pretrained_checkpoint(pretrained)
    if folder is None:
        return None
    try:
        return folder, checkpoint_args(read_common_state(folder))
    except InputError:
        problem = size_problem(folder)  # a truncated file says more than the reader's error
        if problem:
            raise InputError(f"checkpoint {folder}: {problem} (--ckpt-step N loads an older iteration)") from None
        raise


def apply_checkpoint_args(values: dict, explicit: Set[str], found: Optional[Tuple[str, dict]]) -> Set[str]:
    """Puts into `values` what the run takes from the args of the checkpoint `found` (`starting_checkpoint`), unless
    given: its tokenizer (the one its weights were trained with; a NullTokenizer's ids are the data's and need
    --vocab-size, so it is not taken) and, with --use-checkpoint-args, its --seq-length. Returns their names."""
    if values.get("use_checkpoint_args") and not (values.get("load") or values.get("pretrained_checkpoint")):
        raise InputError("--use-checkpoint-args reads the checkpoint the run starts from: give --load (or "
                         "--pretrained-checkpoint)")
    if values.get("use_checkpoint_args") and found is None:
        raise InputError(f"--use-checkpoint-args: no checkpoint in --load {values.get('load')}"
                         + (f" or --pretrained-checkpoint {values['pretrained_checkpoint']}"
                            if values.get("pretrained_checkpoint") else ""))
    if found is None:
        return set()
    _, args = found
    taken = {}
    if (not explicit & set(TOKENIZER_SETTINGS) and args.get("tokenizer_model")
            and args.get("tokenizer_type") not in (None, NULL_TOKENIZER)):
        taken.update({name: args.get(name) for name in TOKENIZER_SETTINGS})
    if values.get("use_checkpoint_args") and "seq_length" not in explicit and args.get("seq_length"):
        taken["seq_length"] = args["seq_length"]  # a converted checkpoint has none: the command line's stays
    values.update(taken)
    return set(taken)
