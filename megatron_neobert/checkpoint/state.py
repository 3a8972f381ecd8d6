"""What an iteration folder holds, and saving and loading it: the whole training state, and the
Megatron-LM args that describe the model.

An iteration folder (see `layout.py`) holds, as one megatron-core distributed checkpoint:
- "model" / "modelN": the weights, from `model_sharded_state_dict(chunks)`: under "model" (one chunk)
  or "model0", "model1", ... (virtual pipeline stages), as Megatron-LM does. Sharded-tensor keys are
  global (layer numbers included), so a checkpoint loads at any other TP/PP/VPP layout;
- "optimizer": `optimizer.sharded_state_dict(...)`. The distributed optimizer saves in
  megatron-core 0.16's "fully_reshardable" format: at save, DP rank 0 of each model-parallel
  group gathers the Adam moments and fp32 master weights and writes them per parameter, keyed like
  the parameter, so they load at any other TP / PP / DP layout (each rank reads what it owns).
  The faster "dp_reshardable" format only reshards across DP, and "fully_sharded_model_space"
  (the 0.16 default) needs flattened sharded tensors that 0.16's dist_checkpointing rejects.
  The non-distributed optimizers map their state onto the model's sharded tensors, reshardable too;
- "opt_param_scheduler" (counted in samples, as Megatron-LM's), "num_floating_point_operations_so_far",
  "train_state" (iteration, data position, skipped steps), "checkpoint_version" 3.0 and megatron-core's
  "content_metadata" naming the optimizer-state format, as Megatron-LM writes them (common state,
  written by rank 0);
- "args", as Megatron-LM saves them: an `argparse.Namespace` with the model's sizes at top level
  (what Megatron-LM's load_args_from_checkpoint and its tools read) plus "arch", the `NeoBERTArch`
  fields (`megatron_lm_args`);
- "rng_state": each rank's RNG states; restored only at the saved layout (other layouts
  have other ranks).

A save writes the folder, waits for every rank, and only then rank 0 moves the marker (atomic
rename); older folders are pruned after that. With --async-save the writing happens in a process
per rank while training goes on, and the same sealing, marker and pruning follow once every rank's
writer is done (`AsyncSaves`). A save cut short therefore leaves the marker on
the previous complete checkpoint, and a loader follows only the marker.

`read_checkpoint` is the one way to a checkpoint's common state (args included), for the trainer and the
converters alike: it locates the folder (`layout.find_checkpoint` / `resolve_checkpoint_dir`), verifies
it when asked (`integrity.py`) and checks that this version can read it.
"""

import argparse
import contextlib
import dataclasses
import json
import logging
import os
import random
import shutil
import warnings
from typing import List, Optional, Tuple

import numpy
import torch
from megatron.core import dist_checkpointing, parallel_state, tensor_parallel
from megatron.core.dist_checkpointing.mapping import ShardedObject
from megatron.core.dist_checkpointing.serialization import get_default_save_sharded_strategy
from megatron.core.dist_checkpointing.strategies.fully_parallel import FullyParallelSaveStrategyWrapper
from megatron.core.utils import unwrap_model
from torch.distributed.checkpoint import CheckpointException

from megatron_neobert.megatron_core_compat import (CheckpointReleaseError, async_calls_queue, async_save_arguments,
                                                     async_save_strategy, ignore_no_process_group_warnings,
                                                     load_common_state, placeholders_without_strides,
                                                     prepare_torch_adam_for_state_load)
from megatron_neobert.checkpoint.integrity import (check_space, require_manifest, seal_folder,
                                                            verify_checkpoint, write_verified_folder)
from megatron_neobert.checkpoint.layout import (find_checkpoint, iteration_dir, prune_checkpoints,
                                                         read_latest_iteration, write_latest_marker)
from megatron_neobert.errors import InputError, TrainingError

logger = logging.getLogger(__name__)

# Every checkpoint read of the package's (the trainer's, the converter's, the watcher's) comes through this module:
# its import is where megatron-core learns to read the tensor metadata of torch 2.15 and later.
placeholders_without_strides()

# Megatron-LM's: args a Namespace, TP and PP sizes in them. torch.load(weights_only=True), inside megatron-core's
# loads too, rebuilds the Namespace because megatron-core allows it at its own import (megatron/core/safe_globals.py).
CHECKPOINT_VERSION = 3.0


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
    """A checkpoint's args as a dict (a live view of its Namespace)."""
    return vars(common["args"])


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


def model_sharded_state_dict(chunks: List[torch.nn.Module]) -> dict:
    if len(chunks) == 1:
        return {"model": unwrap_model(chunks[0]).sharded_state_dict()}
    return {f"model{i}": unwrap_model(c).sharded_state_dict() for i, c in enumerate(chunks)}


def load_model_state(chunks: List[torch.nn.Module], state: dict) -> None:
    """Copy the "model"/"modelN" entries of a loaded checkpoint into the chunks."""
    keys = ["model"] if len(chunks) == 1 else [f"model{i}" for i in range(len(chunks))]
    for key, chunk in zip(keys, chunks):
        unwrap_model(chunk).load_state_dict(state[key], strict=True)


# The sharded-state-dict metadata, saved as megatron-core's content metadata so that Megatron-LM's
# loader uses the same optimizer-state format (without it, it assumes an older one).
OPTIMIZER_METADATA = {"distrib_optim_sharding_type": "fully_reshardable", "singleton_local_shards": False,
                      "chained_optim_avoid_prefix": True}


def _layout():
    return (parallel_state.get_pipeline_model_parallel_world_size(),
            parallel_state.get_tensor_model_parallel_world_size(),
            parallel_state.get_data_parallel_world_size())


def _rng_sharded_object() -> ShardedObject:
    state = {"random": random.getstate(), "numpy": numpy.random.get_state(),
             "torch": torch.get_rng_state(),
             "cuda": torch.cuda.get_rng_state() if torch.cuda.is_available() else None,
             "tracker": tensor_parallel.get_cuda_rng_tracker().get_states()}
    rank = (parallel_state.get_pipeline_model_parallel_rank(),
            parallel_state.get_tensor_model_parallel_rank(),
            parallel_state.get_data_parallel_rank())
    return ShardedObject("rng_state", state, _layout(), rank, replica_id=0)


def _restore_rng(state: dict) -> None:
    random.setstate(state["random"])
    numpy.random.set_state(state["numpy"])
    torch.set_rng_state(state["torch"])
    if state["cuda"] is not None and torch.cuda.is_available():
        torch.cuda.set_rng_state(state["cuda"])
    tensor_parallel.get_cuda_rng_tracker().set_states(state["tracker"])


def _full_state(chunks, optimizer, is_loading: bool, with_optimizer: bool, with_rng: bool):
    state = model_sharded_state_dict(chunks)
    if with_optimizer:
        if is_loading:
            prepare_torch_adam_for_state_load(optimizer)
        state["optimizer"] = optimizer.sharded_state_dict(state, is_loading=is_loading,
                                                          metadata=OPTIMIZER_METADATA)
    if with_rng:
        state["rng_state"] = _rng_sharded_object()
    return state


def save_checkpoint(root: str, iteration: int, chunks, optimizer, scheduler, train_state: dict,
                    args, keep_last_n: Optional[int] = None, save_optimizer: bool = True,
                    save_rng: bool = True, floating_point_operations: float = 0.0,
                    async_saves: Optional["AsyncSaves"] = None) -> str:
    """Save the training state at `iteration` under `root`; returns the iteration folder.
    `save_optimizer=False` (--no-save-optim): a resume from it starts a fresh optimizer;
    `save_rng=False` (--no-save-rng): with new random streams. `floating_point_operations`: the run's
    training FLOPs so far, saved as Megatron-LM's num_floating_point_operations_so_far. With
    `async_saves` (--async-save) the files are written in the background: the checkpoint is complete
    (marker moved) when `async_saves.finish` returns its iteration."""
    path = iteration_dir(root, iteration)
    rank0 = torch.distributed.get_rank() == 0
    if rank0:
        if os.path.isdir(path):  # left by a save that was cut short, or an older run
            shutil.rmtree(path)
        os.makedirs(path)
    torch.distributed.barrier()
    state = _full_state(chunks, optimizer, is_loading=False, with_optimizer=save_optimizer,
                        with_rng=save_rng)
    state.update(args=args, iteration=iteration, train_state={**train_state, "schedule_in_samples": True},
                 opt_param_scheduler=scheduler.state_dict(), checkpoint_version=CHECKPOINT_VERSION,
                 num_floating_point_operations_so_far=floating_point_operations)
    # Data-parallel replicas split the writing instead of DP rank 0 writing everything.
    strategy = FullyParallelSaveStrategyWrapper(
        get_default_save_sharded_strategy(),
        parallel_state.get_data_parallel_group(with_context_parallel=True))
    if async_saves is None:
        # Every rank's shards on disk, checksummed, or the partial folder removed and an error raised.
        write_verified_folder(lambda: dist_checkpointing.save(state, path, sharded_strategy=strategy,
                                                              content_metadata=dict(OPTIMIZER_METADATA)),
                              root, path, iteration)
        _publish(root, iteration, keep_last_n)
        return path
    check_space(root, path, iteration)
    request = dist_checkpointing.save(state, path, sharded_strategy=strategy, async_sharded_save=True,
                                      content_metadata=dict(OPTIMIZER_METADATA), **async_save_arguments())

    def seal_and_publish():  # on every rank, once every rank's writer is done
        seal_folder(None, root, path, iteration)
        _publish(root, iteration, keep_last_n)

    request.add_finalize_fn(seal_and_publish)
    async_saves.schedule(request, root, path, iteration)
    return path


def _publish(root: str, iteration: int, keep_last_n: Optional[int]) -> None:
    """Point the marker at a complete, sealed folder; then prune the older ones."""
    if torch.distributed.get_rank() == 0:
        write_latest_marker(root, iteration)
        if keep_last_n:
            prune_checkpoints(root, keep_last_n)
    torch.distributed.barrier()


ASYNC_WRITERS = {"mcore": "megatron-core's own writer", "nvrx": "nvidia-resiliency-ext"}


class AsyncSaves:
    """--async-save, megatron-core's asynchronous distributed-checkpoint save. A save stages the
    tensors in host memory and returns; a process forked by each rank writes them while training goes
    on. `finish` (collective, called every step) seals the folder, moves the marker and prunes once
    every rank's writer is done, so the marker never names a folder still being written: a job killed
    meanwhile resumes from the checkpoint before."""

    def __init__(self):
        self.queue = async_calls_queue()
        logger.info("asynchronous saves through %s (async_strategy=%r: one writer process forked by each rank per "
                    "save)", ASYNC_WRITERS[async_save_strategy()], async_save_strategy())
        self.pending: Optional[Tuple[str, str, int]] = None  # (root, folder, iteration) being written

    def schedule(self, request, root: str, folder: str, iteration: int) -> None:
        self.queue.schedule_async_request(request)
        self.pending = (root, folder, iteration)

    def finish(self, blocking: bool) -> Optional[int]:
        """Collective: the iteration whose checkpoint is now complete (waiting for it when
        `blocking`), or None."""
        if self.pending is None:
            return None
        root, folder, iteration = self.pending
        try:
            done = self.queue.maybe_finalize_async_calls(blocking=blocking)
        except TrainingError:  # raised by seal_and_publish, alike on every rank
            self.pending = None
            raise
        except (Exception, CheckpointException) as err:  # a writer's failure, raised on every rank
            self.pending = None
            seal_folder(err, root, folder, iteration)
            raise
        if not done:
            return None
        self.pending = None
        return iteration


def holds_training_state(common: dict) -> bool:
    """Whether a checkpoint can be resumed: the trainer's hold the schedule and the data position;
    those of tools/convert_checkpoint.py (hf-to-mcore) hold only the model and its args."""
    return "opt_param_scheduler" in common and "train_state" in common


SCHEDULE_STEP_FIELDS = ("num_steps", "lr_warmup_steps", "lr_decay_steps", "wd_incr_steps")


def _schedule_in_samples(common: dict) -> dict:
    """The checkpoint's scheduler state counted in samples, as Megatron-LM's: earlier versions of this trainer
    counted the schedule of a --train-iters run in iterations."""
    state, args = common["opt_param_scheduler"], checkpoint_args(common)
    if common["train_state"].get("schedule_in_samples") or args.get("train_samples") is not None:
        return state
    return {**state, **{k: state[k] * args["global_batch_size"] for k in SCHEDULE_STEP_FIELDS}}


@contextlib.contextmanager
def megatron_deprecations_hidden():
    """megatron-core's checkpointing calls torch APIs that torch has deprecated (torch.distributed.checkpoint's
    load_state_dict, ShardedTensor): their FutureWarnings are for megatron-core, not for whoever loads or converts."""
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", category=FutureWarning, module=r"megatron\.core\.dist_checkpointing\.")
        # Raised inside torch and attributed to whichever frame dispatched the call (on CPU, our CUDA-to-CPU mode).
        warnings.filterwarnings("ignore", "Please use DTensor instead and we are deprecating ShardedTensor",
                                FutureWarning)
        # 0.19's single-process load (a converter's) reads as if without a process group, and torch says so.
        ignore_no_process_group_warnings()
        yield


def load_checkpoint(path: str, common: dict, chunks, optimizer, scheduler, load_optimizer: bool = True,
                    load_rng: bool = True, finetune: bool = False, strict: str = "assume_ok_unexpected") -> None:
    """Load the checkpoint `read_checkpoint` found into the model, optimizer and scheduler.

    `finetune`: weights only (required for a checkpoint without training state).
    `load_optimizer=False`: a fresh optimizer state, but the schedule position is kept (it
    follows the iteration, not the optimizer). `strict`: megatron-core's StrictHandling of keys
    the model and the checkpoint do not share (--dist-ckpt-strictness).
    """
    if not (finetune or holds_training_state(common)):
        raise InputError(f"{path} holds no training state (model weights only): load it with --finetune")
    saved_layout = tuple(checkpoint_args(common)[k] for k in ("pipeline_model_parallel_size",
                                                     "tensor_model_parallel_size", "data_parallel_size"))
    with_optimizer = load_optimizer and not finetune and "optimizer" in common
    saved_format = (common.get("content_metadata") or OPTIMIZER_METADATA)["distrib_optim_sharding_type"]
    if with_optimizer and saved_format != OPTIMIZER_METADATA["distrib_optim_sharding_type"]:
        raise InputError(f"{path}: optimizer state in the {saved_format!r} format; this trainer reads "
                         f"{OPTIMIZER_METADATA['distrib_optim_sharding_type']!r} (load with --no-load-optim)")
    saved_rng = not checkpoint_args(common).get("no_save_rng", False)
    with_rng = load_rng and not finetune and saved_rng and saved_layout == _layout()
    if load_rng and not finetune and not saved_rng:
        logger.info("%s was saved with --no-save-rng: RNG states not restored", path)
    elif load_rng and not finetune and not with_rng:
        logger.info("checkpoint layout (PP, TP, DP) %s differs from this run's %s: RNG states not "
                    "restored", saved_layout, _layout())
    state = _full_state(chunks, optimizer, is_loading=True,
                        with_optimizer=with_optimizer, with_rng=with_rng)
    with megatron_deprecations_hidden():
        loaded = dist_checkpointing.load(state, path, strict=strict)
    load_model_state(chunks, loaded)
    if with_optimizer:
        optimizer.load_state_dict(loaded["optimizer"])
    else:
        optimizer.reload_model_params()  # master copies from the loaded weights
    if not finetune:
        scheduler.load_state_dict(_schedule_in_samples(common))
    if with_rng:
        _restore_rng(loaded["rng_state"])
    logger.info("loaded %s (iteration %d; optimizer %s)", path, common["iteration"],
                "restored" if with_optimizer else "fresh")


def read_common_state(folder: str) -> dict:
    """The common state of a complete iteration folder, refused in one line when this version cannot
    load it: another sharded backend, no megatron_neobert args, Q/K rows in an older order."""
    with open(os.path.join(folder, "metadata.json")) as f:
        backend = json.load(f).get("sharded_backend")
    if backend != "torch_dist":
        raise InputError(f"checkpoint {folder}: sharded backend {backend!r} is not supported (torch_dist only)")
    try:
        common = load_common_state(folder)
    except CheckpointReleaseError as err:
        raise InputError(f"checkpoint {folder}: {err}") from None
    except Exception as err:  # a missing or unreadable common state
        raise InputError(f"checkpoint {folder}: cannot read the common state: {err}") from None
    args = (checkpoint_args(common) if isinstance(common, dict) and isinstance(common.get("args"), argparse.Namespace)
            else None)
    if not isinstance(args, dict) or not isinstance(args.get("arch"), dict):
        raise InputError(f"checkpoint {folder}: the common state has no args['arch']: not a megatron_neobert "
                         f"checkpoint (expected the trainer's layout)")
    problem = rotary_layout_problem(args)
    if problem:
        raise InputError(f"checkpoint {folder}: {problem}")
    return common


def read_checkpoint(root: str, step: Optional[int] = None, verify: bool = True) -> Tuple[Optional[str], Optional[dict]]:
    """Collective: (iteration folder, common state) of the checkpoint to load from `root` (the marker's, or
    iteration `step`), checked against its manifest when `verify` (a trainer's checkpoint without one is refused);
    (None, None) when the root holds none.
    The common state is read before the model is built (its args decide the model's vocabulary size), and
    after the check, so that a damaged common state is named too."""
    path = find_checkpoint(root, step)
    if path is None:
        return None, None
    if verify:
        verify_checkpoint(path, root, read_latest_iteration(root) if step is None else step)
    common = read_common_state(path)
    if verify:
        require_manifest(path, holds_training_state(common))
    return path, common
