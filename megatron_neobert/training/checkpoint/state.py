"""Save and load the whole training state in the layout of `checkpointing.py`.

An iteration folder holds, as one megatron-core distributed checkpoint:
- "model" / "modelN": the weights (sharded tensors with global keys);
- "optimizer": `optimizer.sharded_state_dict(...)`. The distributed optimizer saves in
  megatron-core 0.16's "fully_reshardable" format: at save, DP rank 0 of each model-parallel
  group gathers the Adam moments and fp32 master weights and writes them per parameter, keyed like
  the parameter, so they load at any other TP / PP / DP layout (each rank reads what it owns).
  The faster "dp_reshardable" format only reshards across DP, and "fully_sharded_model_space"
  (the 0.16 default) needs flattened sharded tensors that 0.16's dist_checkpointing rejects.
  The non-distributed optimizers map their state onto the model's sharded tensors, reshardable too;
- "opt_param_scheduler" (counted in samples, as Megatron-LM's), "num_floating_point_operations_so_far",
  "train_state" (iteration, data position, skipped steps), "args" (an
  argparse.Namespace, see `checkpointing.megatron_lm_args`), "checkpoint_version" 3.0 and
  megatron-core's "content_metadata" naming the optimizer-state format, as Megatron-LM writes them
  (common state, written by rank 0);
- "rng_state": each rank's RNG states; restored only at the saved layout (other layouts
  have other ranks).

A save writes the folder, waits for every rank, and only then rank 0 moves the marker (atomic
rename); older folders are pruned after that. With --async-save the writing happens in a process
per rank while training goes on, and the same sealing, marker and pruning follow once every rank's
writer is done (`AsyncSaves`). A save cut short therefore leaves the marker on
the previous complete checkpoint, and a loader follows only the marker.
"""

import glob
import logging
import os
import random
import re
import shutil
from typing import List, Optional, Tuple

import numpy
import torch
from megatron.core import dist_checkpointing, parallel_state, tensor_parallel
from megatron.core.dist_checkpointing.mapping import ShardedObject
from megatron.core.dist_checkpointing.serialization import get_default_save_sharded_strategy
from megatron.core.dist_checkpointing.strategies.fully_parallel import FullyParallelSaveStrategyWrapper
from torch.distributed.checkpoint import CheckpointException

from megatron_neobert.training.checkpoint_integrity import check_space, seal_folder, write_verified_folder
from megatron_neobert.training.checkpointing import (
    CHECKPOINT_VERSION,
    LATEST_MARKER,
    checkpoint_args,
    iteration_dir,
    load_model_state,
    model_sharded_state_dict,
    read_latest_iteration,
    write_latest_marker,
)
from megatron_neobert.training.errors import InputError, TrainingError

logger = logging.getLogger(__name__)

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


def _init_empty_adam_state(optimizer) -> None:
    """Give a fresh torch AdamW its per-parameter state before a load.

    megatron-core 0.16's distributed optimizer reads "step" from every parameter's state when it
    builds the state dict to load into, and fills in only the moments of a fresh optimizer; with
    TE's or apex's FusedAdam (GPU containers) the step lives in the param groups instead, so only
    the torch fallback (CPU) needs this. The values are overwritten by the load.
    """
    for opt in getattr(optimizer, "chained_optimizers", [optimizer]):
        inner = opt.optimizer
        if isinstance(inner, torch.optim.Adam | torch.optim.AdamW):
            opt.init_state_fn(inner, opt.config)
            for state in inner.state.values():
                state.setdefault("step", torch.tensor(0.0))


def _patch_torch_adam_state_load() -> None:
    """Let megatron-core 0.16's distributed optimizer load per-parameter state into torch's Adam.

    Without TE or apex (CPU) the optimizer is torch's AdamW, whose "step" is per parameter;
    megatron-core sets it from the param groups, then copies every key of the parameter's state
    from the checkpoint tensors, which do not carry "step" (KeyError). Skip "step" in that copy,
    and give each parameter its own step tensor: megatron-core sets one tensor for all of them,
    which torch's Adam would then increment once per parameter at every step.
    """
    from megatron.core.optimizer import distrib_optimizer as d

    if d.HAVE_APEX_OR_TE or getattr(d.DistributedOptimizer, "_step_patch", False):
        return
    original = d.DistributedOptimizer._set_main_param_and_optimizer_states

    def set_states(self, model_param, tensors):
        group_index, group_order = self.model_param_group_index_map[model_param]
        state = self.optimizer.state[self.optimizer.param_groups[group_index]["params"][group_order]]
        step = state.pop("step", None)
        try:
            original(self, model_param, tensors)
        finally:
            if step is not None:
                state["step"] = step.clone()

    d.DistributedOptimizer._set_main_param_and_optimizer_states = set_states
    d.DistributedOptimizer._step_patch = True


def _full_state(chunks, optimizer, scheduler, is_loading: bool, with_optimizer: bool, with_rng: bool):
    state = model_sharded_state_dict(chunks)
    if with_optimizer:
        if is_loading:
            _patch_torch_adam_state_load()
            _init_empty_adam_state(optimizer)
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
    state = _full_state(chunks, optimizer, scheduler, is_loading=False, with_optimizer=save_optimizer,
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
                                      content_metadata=dict(OPTIMIZER_METADATA))

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


class AsyncSaves:
    """--async-save, megatron-core's asynchronous distributed-checkpoint save. A save stages the
    tensors in host memory and returns; a process forked by each rank writes them while training goes
    on. `finish` (collective, called every step) seals the folder, moves the marker and prunes once
    every rank's writer is done, so the marker never names a folder still being written: a job killed
    meanwhile resumes from the checkpoint before."""

    def __init__(self):
        from megatron.core.dist_checkpointing.strategies.async_utils import AsyncCallsQueue

        self.queue = AsyncCallsQueue()
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


def saved_iterations(root: str) -> List[int]:
    found = []
    for p in glob.glob(os.path.join(root, "iter_*")):
        m = re.fullmatch(r"iter_(\d+)", os.path.basename(p))
        if m and os.path.isdir(p):
            found.append(int(m.group(1)))
    return sorted(found)


def prune_checkpoints(root: str, keep: int) -> None:
    """Delete all but the `keep` newest iteration folders up to the marked one."""
    latest = read_latest_iteration(root)
    older = [it for it in saved_iterations(root) if it <= latest]
    for it in older[:-keep] if keep > 0 else []:
        shutil.rmtree(iteration_dir(root, it), ignore_errors=True)


def find_checkpoint(root: str) -> Optional[str]:
    """The complete iteration folder the marker names; None when there is no marker.

    Folders without a marker (a first save cut short) are ignored with a warning; a marker that
    names a missing or incomplete folder is an error, not something to silently start over from.
    """
    iteration = read_latest_iteration(root) if os.path.isdir(root) else None
    if iteration is None:
        leftovers = saved_iterations(root) if os.path.isdir(root) else []
        if leftovers:
            logger.warning("%s: no %s, so iteration folders %s are incomplete and ignored",
                           root, LATEST_MARKER, leftovers)
        return None
    path = iteration_dir(root, iteration)
    if not os.path.isfile(os.path.join(path, "metadata.json")):
        raise RuntimeError(f"{root}/{LATEST_MARKER} names iteration {iteration}, but {path} is missing "
                           f"or incomplete (no metadata.json); refusing to load or to start over")
    return path


def read_checkpoint(root: str) -> Tuple[Optional[str], Optional[dict]]:
    """(iteration folder, common state) of the latest complete checkpoint under `root`, or
    (None, None). The common state is read before the model is built: its args decide the
    model's vocabulary size."""
    path = find_checkpoint(root)
    return (path, dist_checkpointing.load_common_state_dict(path)) if path else (None, None)


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


def load_checkpoint(path: str, common: dict, chunks, optimizer, scheduler, load_optimizer: bool = True,
                    load_rng: bool = True, finetune: bool = False, strict: str = "assume_ok_unexpected") -> None:
    """Load the checkpoint `read_checkpoint` found into the model, optimizer and scheduler.

    `finetune`: weights only (required for a checkpoint without training state).
    `load_optimizer=False`: a fresh optimizer state, but the schedule position is kept (it
    follows the iteration, not the optimizer). `strict`: megatron-core's StrictHandling of keys
    the model and the checkpoint do not share (--dist-ckpt-strictness).
    """
    assert finetune or holds_training_state(common), f"{path} holds no training state: load it with finetune"
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
    state = _full_state(chunks, optimizer, scheduler, is_loading=True,
                        with_optimizer=with_optimizer, with_rng=with_rng)
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
