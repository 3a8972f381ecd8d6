"""Every difference between the supported megatron-core releases (`install/releases.py`), and every private internal
the package patches or reads, in one file: nothing else tests the version, so a new release means reviewing this file.

Importing it refuses another series in one line. Each entry sits under a numbered comment and says what upstream does,
why we need it and which release changed it; tests/test_megatron_core_compat.py fails when a patched name moved.
- On both releases: 1 `prepare_torch_adam_for_state_load`, 2 `keep_write_results_with_the_rank`,
  3 `keep_disk_full_in_writer_errors`, 4 `rank_zero_without_process_group`, 5 `cuda_rng_on_cpu`, 6 the private names
  read (`.idx` header, RoPE's rotation, apex's wgrad flag), 7 `destroy_model_parallel_groups`.
- Between the releases: 8 `micro_batch_calculator`, 9 `write_results_queue`, 10 `mlp_submodule`,
  11 `whole_layer_cuda_graphs`, 12 `load_common_state`, 13 the asynchronous save (`async_save_strategy`,
  `async_save_arguments`, `async_calls_queue`), 14 the warnings dropped (`IMPORT_WARNINGS`, `QUIET_IMPORTS`,
  `drop_the_sync_save_deprecation`, `ignore_no_process_group_warnings`).
- torch 2.15 under both: 15 `placeholders_without_strides`.
Transformer Engine's path reads the same on 0.16 with TE 2.9-2.11 and on 0.19 with TE 2.17: nothing to branch on.
"""

import contextlib
import copy
import dataclasses
import errno
import functools
import importlib.metadata
import json
import logging
import math
import multiprocessing
import multiprocessing.managers
import os
import queue
import warnings
from typing import Callable, List, Optional, Tuple

import torch

from megatron_neobert.install.releases import RELEASES

SUPPORTED = tuple(sorted(release.series for release in RELEASES))  # ("0.16", "0.19")
# Read from the installed package's metadata: importing megatron.core itself takes seconds, and the patches
# import their modules only when applied.
MEGATRON_CORE_VERSION = importlib.metadata.version("megatron-core")
RELEASE = tuple(int(part) for part in MEGATRON_CORE_VERSION.split(".")[:2])

if ".".join(map(str, RELEASE)) not in SUPPORTED:
    raise ImportError(f"megatron_neobert supports megatron-core {' and '.join(v + '.x' for v in SUPPORTED)} "
                      f"(megatron_neobert/megatron_core_compat.py holds what differs between them), "
                      f"found {MEGATRON_CORE_VERSION}")


# 1. ------------------------------------------------------------------------------------------------------
def prepare_torch_adam_for_state_load(optimizer) -> None:
    """Let megatron-core's distributed optimizer load per-parameter state into torch's Adam (the CPU case: no TE, no
    apex), before `optimizer.sharded_state_dict(..., is_loading=True)`; TE's and apex's FusedAdam need none of it."""
    # Upstream (optimizer/distrib_optimizer.py): the state dict to load into reads "step" from every parameter's state;
    # `_set_main_param_and_optimizer_states` then copies every key from the checkpoint's tensors, which hold no "step"
    # (KeyError), after setting "step" as one tensor shared by all parameters. torch's Adam keeps a step per parameter
    # (a shared one would be incremented once per parameter), so a fresh optimizer gets its state, the copy skips "step"
    # and each parameter keeps its own. Still so on 0.19 (the method, `model_param_group_index_map`, `init_state_fn`,
    # `HAVE_APEX_OR_TE`).
    from megatron.core.optimizer import distrib_optimizer

    if not distrib_optimizer.HAVE_APEX_OR_TE:
        _skip_step_in_state_copy(distrib_optimizer.DistributedOptimizer)
    for opt in getattr(optimizer, "chained_optimizers", [optimizer]):
        inner = opt.optimizer
        if isinstance(inner, torch.optim.Adam | torch.optim.AdamW):
            opt.init_state_fn(inner, opt.config)
            for state in inner.state.values():
                state.setdefault("step", torch.tensor(0.0))


def _skip_step_in_state_copy(optimizer_class) -> None:
    original = optimizer_class._set_main_param_and_optimizer_states
    if getattr(original, "keeps_per_parameter_step", False):
        return

    @functools.wraps(original)
    def set_states(self, model_param, tensors):
        group_index, group_order = self.model_param_group_index_map[model_param]
        state = self.optimizer.state[self.optimizer.param_groups[group_index]["params"][group_order]]
        step = state.pop("step", None)
        try:
            original(self, model_param, tensors)
        finally:
            if step is not None:
                state["step"] = step.clone()

    set_states.keeps_per_parameter_step = True
    optimizer_class._set_main_param_and_optimizer_states = set_states


# 2. ------------------------------------------------------------------------------------------------------
_async_results_manager = None  # the server behind an asynchronous save's queue, kept as long as the rank


def keep_write_results_with_the_rank(async_save: bool, server_initializer: Callable[[], None]) -> None:
    """The write results of a distributed-checkpoint save go through a queue that lives and dies with the rank: the
    default one's server dies of a pre-emption signal mid-save and outlives a rank killed with -9."""
    # Upstream (dist_checkpointing/strategies/filesystem_async.py, and nvidia-resiliency-ext's for 0.19's "nvrx"):
    # `get_write_results_queue` (`_get_write_results_queue` up to 0.16) makes the global `_results_queue` on first use,
    # a queue of a spawned `multiprocessing.Manager` server (~370 MB, out of the rank's reach). A synchronous save
    # writes from the rank: an in-process queue is enough. An asynchronous save's writer is forked by the rank: the
    # server is forked too, after the rank's fork hooks (call this after registering them), and runs
    # `server_initializer` first (the trainer's: ignore the exit signals, as the rank's other helpers do).
    global _async_results_manager

    if not async_save:
        from megatron.core.dist_checkpointing.strategies import filesystem_async

        if not isinstance(filesystem_async._results_queue, queue.Queue):
            filesystem_async._results_queue = queue.Queue()
        return
    if _async_results_manager is None:
        manager = multiprocessing.managers.SyncManager(ctx=multiprocessing.get_context("fork"))
        manager.start(initializer=server_initializer)
        _async_results_manager = manager
        results = manager.Queue()
        for module in _filesystem_async_modules():
            module._results_queue = results


def _filesystem_async_modules() -> list:
    """The writer modules a save may go through: megatron-core's, and nvidia-resiliency-ext's where it imports."""
    from megatron.core.dist_checkpointing.strategies import filesystem_async

    modules = [filesystem_async]
    if async_save_strategy() == "nvrx":
        from nvidia_resiliency_ext.checkpointing.async_ckpt import filesystem_async as nvrx_filesystem_async

        modules.append(nvrx_filesystem_async)
    return modules


# 3. ------------------------------------------------------------------------------------------------------
def keep_disk_full_in_writer_errors(is_disk_full: Callable[[BaseException], bool]) -> None:
    """A checkpoint writer that runs out of disk space raises an OSError(ENOSPC), so that the trainer (`is_disk_full`)
    says a full disk in one line."""
    # Upstream (filesystem_async.py): torch.save turns a full disk into RuntimeError "unexpected pos" with the OSError
    # as its context, lost when the error is pickled back to the rank: `_write_item` is wrapped to raise the OSError
    # itself. From 0.17 the writer that runs in the calling thread (`write_preloaded_data` without a results queue, this
    # package's one-bucket save) returns its error and the caller reports only its type: there it is raised instead.
    for module in _filesystem_async_modules():
        _keep_disk_full(module, is_disk_full)


def _keep_disk_full(filesystem_async, is_disk_full: Callable[[BaseException], bool]) -> None:
    write_item = filesystem_async._write_item
    if not getattr(write_item, "keeps_disk_full", False):
        @functools.wraps(write_item)  # upstream reads its signature
        def keeping_disk_full(*args, **kwargs):
            try:
                return write_item(*args, **kwargs)
            except RuntimeError as err:
                if is_disk_full(err):
                    raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC)) from err
                raise

        keeping_disk_full.keeps_disk_full = True
        filesystem_async._write_item = keeping_disk_full

    writer = filesystem_async.FileSystemWriterAsync
    write_bucket = writer.write_preloaded_data
    if RELEASE < (0, 17) or getattr(write_bucket, "raises_its_error", False):
        return

    @functools.wraps(write_bucket)
    def raising_its_error(*args, **kwargs):
        output = write_bucket(*args, **kwargs)
        if kwargs.get("results_queue") is None and output is not None and isinstance(output[1], Exception):
            raise output[1]
        return output

    raising_its_error.raises_its_error = True
    writer.write_preloaded_data = staticmethod(raising_its_error)


# 4. ------------------------------------------------------------------------------------------------------
@contextlib.contextmanager
def rank_zero_without_process_group():
    """Inside the block a process without a process group is rank 0, to torch and to megatron-core's rank helper,
    without a warning: the data tools build blends and read indexed datasets alone, as the rank that writes caches."""
    # Upstream (datasets/blended_dataset.py): `BlendedDataset._build_indices` asks `torch.distributed.get_rank() == 0`
    # on a cache miss, which raises without a group; 0.18 guards the call itself. 0.19's `log_single_rank` asks
    # `_rank_utils.safe_get_rank`, which warns "Could not determine rank" before answering 0.
    if torch.distributed.is_initialized():
        yield
        return
    if RELEASE >= (0, 18):
        with warnings.catch_warnings():
            ignore_no_process_group_warnings()
            yield
        return
    get_rank = torch.distributed.get_rank
    torch.distributed.get_rank = lambda group=None: 0
    try:
        yield
    finally:
        torch.distributed.get_rank = get_rank


# 5. ------------------------------------------------------------------------------------------------------
@contextlib.contextmanager
def cuda_rng_on_cpu():
    """Inside the block (CPU execution only), the CUDA RNG functions megatron-core uses draw on the CPU generator,
    which the CPU kernels use; restored after it."""
    # Upstream (tensor_parallel/random.py): the tensor-parallel RNG tracker forks "CUDA" RNG states around dropout and
    # initialisation through the private `_get_cuda_rng_state` / `_set_cuda_rng_state` (looked up at call time), and
    # `torch.cuda.get_rng_state` / `set_rng_state` / `manual_seed`. Still so on 0.19.
    from megatron.core.tensor_parallel import random as mcore_random

    def get_state(device="cuda", *args, **kwargs):
        return torch.get_rng_state()

    def set_state(new_state, device=-1, *args, **kwargs):
        torch.set_rng_state(new_state)

    patches = [(torch.cuda, "get_rng_state", get_state), (torch.cuda, "set_rng_state", set_state),
               (torch.cuda, "manual_seed", torch.manual_seed), (torch.cuda.random, "get_rng_state", get_state),
               (mcore_random, "_get_cuda_rng_state", get_state), (mcore_random, "_set_cuda_rng_state", set_state)]
    with patched(patches):
        yield


@contextlib.contextmanager
def patched(patches):
    """Inside the block, each (owner, name, value) of `patches` set; the previous values restored after it."""
    saved = [(owner, name, getattr(owner, name)) for owner, name, _ in patches]
    for owner, name, value in patches:
        setattr(owner, name, value)
    try:
        yield
    finally:
        for owner, name, value in reversed(saved):
            setattr(owner, name, value)


# 6. ------------------------------------------------------------------------------------------------------
# Private names this package reads (no patch): each is what upstream itself uses for the same thing.
# Each unchanged on 0.19 (tests/test_megatron_core_compat.py imports them).

def index_header() -> bytes:
    """The magic bytes that open a Megatron `.idx` file (datasets/indexed_dataset.py's `_INDEX_HEADER`)."""
    from megatron.core.datasets.indexed_dataset import _INDEX_HEADER

    return _INDEX_HEADER


def rotate_half(t: torch.Tensor, interleaved: bool) -> torch.Tensor:
    """RoPE's rotation of the last dimension, as megatron-core's unfused RoPE applies it
    (models/common/embeddings/rope_utils.py's `_rotate_half`)."""
    from megatron.core.models.common.embeddings.rope_utils import _rotate_half

    return _rotate_half(t, interleaved)


def linear_wgrad_fusion_available() -> bool:
    """Whether megatron-core's own linear layers can fuse the weight-gradient accumulation (apex's extension;
    tensor_parallel/layers.py's `_grad_accum_fusion_available`)."""
    from megatron.core.tensor_parallel import layers

    return layers._grad_accum_fusion_available


# 7. ------------------------------------------------------------------------------------------------------
def destroy_model_parallel_groups() -> None:
    """Destroy every process group megatron-core's parallel state created and drop every reference to them: a process
    that sets it up again and again (a test worker, a tool in a loop) would otherwise gather thousands of threads."""
    # Upstream (parallel_state.py): `destroy_model_parallel` destroys only the gloo copies of the data-parallel groups
    # and leaves `_INTRA_PARTIAL_DATA_PARALLEL_GROUP_WITH_CP` set; `create_group` lists every group in the private
    # `_global_process_group_list` (None for the default group); RotaryEmbedding.forward is an lru_cache keyed on the
    # module, which holds its context-parallel group. torch keeps a group alive while anything refers to it. Still so on
    # 0.19.
    from megatron.core import parallel_state
    from megatron.core.models.common.embeddings.rotary_pos_embedding import RotaryEmbedding

    for group in parallel_state._global_process_group_list or []:
        if group is not None:
            # destroy_model_parallel below skips the gloo groups destroyed here: it checks torch's registry.
            torch.distributed.destroy_process_group(group)
    parallel_state.destroy_model_parallel()
    for name, value in list(vars(parallel_state).items()):
        if isinstance(value, torch.distributed.ProcessGroup):
            setattr(parallel_state, name, None)
    RotaryEmbedding.forward.cache_clear()


# 8. ------------------------------------------------------------------------------------------------------
def micro_batch_calculator(global_batch_size: int, rampup_batch_size: Optional[List[int]], micro_batch_size: int,
                           data_parallel_size: int):
    """megatron-core's micro-batch calculator for a fixed global batch, or for Megatron-LM's
    `--rampup-batch-size START INCREMENT SAMPLES` (its own object, not megatron-core's process-wide one; rank -1:
    megatron-core's lines about it are not printed).

    0.16: `RampupBatchsizeNumMicroBatchesCalculator` takes the ramp as it is.
    0.18 removed it for `StepBatchsizeNumMicroBatchesCalculator`, driven by a "SAMPLES:SIZE ..." schedule: the ramp
    becomes the schedule of the sizes 0.16's calculator gives, sample for sample (`ramp_schedule`).
    """
    from megatron.core import num_microbatches_calculator as calculators

    if rampup_batch_size is None:
        return calculators.ConstantNumMicroBatchesCalculator(global_batch_size, micro_batch_size,
                                                             data_parallel_size, False, -1)
    if RELEASE < (0, 18):
        return calculators.RampupBatchsizeNumMicroBatchesCalculator(
            global_batch_size, micro_batch_size, data_parallel_size, False, -1, *rampup_batch_size)
    schedule = " ".join(f"{samples}:{size}" for samples, size in ramp_schedule(global_batch_size, *rampup_batch_size))
    return calculators.StepBatchsizeNumMicroBatchesCalculator(micro_batch_size, data_parallel_size, False, -1,
                                                              schedule)


def ramp_schedule(global_batch_size: int, start: int, increment: int, samples: int) -> List[Tuple[int, int]]:
    """(consumed samples from which it holds, global batch size) of each size of Megatron-LM's ramp, as 0.16's
    calculator computes them: `start + int(consumed / (samples / steps)) * increment` while `consumed <= samples`,
    then `global_batch_size` (a float division: each threshold is found with that very expression, not
    re-derived). Sizes the ramp skips (more steps than samples) are left out."""
    steps = (global_batch_size - start) // increment
    per_step = samples / steps

    def size_at(consumed: int) -> int:
        return global_batch_size if consumed > samples else start + int(consumed / per_step) * increment

    schedule = {0: start}
    for step in range(1, steps + 1):
        size = start + step * increment
        threshold = math.ceil(step * per_step)
        while threshold > 0 and size_at(threshold - 1) >= size:
            threshold -= 1
        while size_at(threshold) < size:
            threshold += 1
        schedule[threshold] = max(schedule.get(threshold, 0), size)
    return sorted(schedule.items())


# 9. ------------------------------------------------------------------------------------------------------
def write_results_queue():
    """The queue a distributed-checkpoint save's writers report through (filesystem_async's `_results_queue`,
    created on first use): `_get_write_results_queue()` on 0.16, `get_write_results_queue()` from 0.17."""
    from megatron.core.dist_checkpointing.strategies import filesystem_async

    if RELEASE < (0, 17):
        return filesystem_async._get_write_results_queue()
    return filesystem_async.get_write_results_queue()


# 10. -----------------------------------------------------------------------------------------------------
def mlp_submodule(submodules):
    """A TransformerLayer's `mlp` built as megatron-core's MLP with `submodules` (fc1, fc2).

    0.16: `ModuleSpec(module=MLP, submodules=...)`. 0.18 made a layer's submodules typed builders: a ModuleSpec of
    MLP is rewrapped (in place, with a warning) to `MLP.as_mlp_submodule`, which is given here directly.
    """
    from megatron.core.transformer.mlp import MLP
    from megatron.core.transformer.spec_utils import ModuleSpec

    if RELEASE < (0, 18):
        return ModuleSpec(module=MLP, submodules=submodules)
    return functools.partial(MLP.as_mlp_submodule, submodules=submodules)


# 11. -----------------------------------------------------------------------------------------------------
def whole_layer_cuda_graphs() -> dict:
    """TransformerConfig's setting for CUDA graphs of whole layers (the only scope this package uses, when
    --cuda-graph-impl turns graphs on): `cuda_graph_scope=[]` on 0.16, whose default "full" is the deprecated
    spelling of it (and warns); 0.18 renamed the field `cuda_graph_modules` and deprecates the old name."""
    return {"cuda_graph_scope": []} if RELEASE < (0, 18) else {"cuda_graph_modules": []}


# 12. -----------------------------------------------------------------------------------------------------
COMMON_STATE_FILE = "common.pt"  # where 0.16 to 0.18 save a checkpoint's common (non-sharded) state
# From 0.19 the common state is a "common_state" sharded object in the .distcp files, and no common.pt is written.
COMMON_STATE_IN_SHARDS = RELEASE >= (0, 19)


def load_common_state(folder: str) -> dict:
    """The common state of the distributed checkpoint in `folder`: the one reader of it for code, converters and
    tests, whichever release saved it.

    0.19 reads both layouts (common.pt when the folder has one). 0.16 reads common.pt alone; a folder saved by 0.19
    (no common.pt, and a metadata.json without 0.16's "common_backend") is refused in one line that says why, where
    0.16 itself fails with an AttributeError from its error path.
    """
    from megatron.core import dist_checkpointing

    if not COMMON_STATE_IN_SHARDS and not os.path.exists(os.path.join(folder, COMMON_STATE_FILE)):
        try:
            with open(os.path.join(folder, "metadata.json")) as f:
                saved_by_0_19 = "common_backend" not in json.load(f)
        except (OSError, ValueError):
            saved_by_0_19 = False
        if saved_by_0_19:
            raise CheckpointReleaseError(
                f"saved by megatron-core 0.19 or later (its common state is in the .distcp files, there is no "
                f"{COMMON_STATE_FILE}), which megatron-core {MEGATRON_CORE_VERSION} cannot read: load it with "
                f"megatron-core 0.19 (CPython 3.12)")
    # 0.19 reads an older checkpoint's common.pt through its own load_common, and logs that this function of its
    # is deprecated: a note about its API, not about the checkpoint, which it reads.
    legacy_reader = logging.getLogger("megatron.core.dist_checkpointing.strategies.common")
    quiet = _MessagesDropped("load_common is deprecated")
    legacy_reader.addFilter(quiet)
    try:
        with warnings.catch_warnings():
            ignore_no_process_group_warnings()
            return dist_checkpointing.load_common_state_dict(folder)
    finally:
        legacy_reader.removeFilter(quiet)


class _MessagesDropped(logging.Filter):
    """A logger's records whose message holds `text`, dropped."""

    def __init__(self, text: str):
        super().__init__()
        self.text = text

    def filter(self, record: logging.LogRecord) -> bool:
        return self.text not in record.getMessage()


class CheckpointReleaseError(ValueError):
    """A checkpoint saved in a layout that the installed megatron-core cannot read."""


# 13. -----------------------------------------------------------------------------------------------------
@functools.lru_cache(maxsize=None)
def async_save_strategy() -> str:
    """How an asynchronous save writes: "mcore", megatron-core's own forked writer (0.16's only one), or, from
    0.19 where nvidia-resiliency-ext imports (NGC's images from 26.06; its wheels need glibc 2.39), "nvrx", the
    one 0.19 defaults to (its "mcore" path is deprecated there, and 0.19's default raises without the package)."""
    if RELEASE < (0, 19):
        return "mcore"
    try:
        from megatron.core.dist_checkpointing.strategies.nvrx import has_nvrx_async_support

        return "nvrx" if has_nvrx_async_support() else "mcore"
    except (ImportError, AssertionError):  # AssertionError: megatron-core's check of an nvidia-resiliency-ext < 0.6
        return "mcore"


def async_save_arguments() -> dict:
    """`dist_checkpointing.save`'s arguments for an asynchronous save by `async_save_strategy()` (0.16's save has no
    choice to make)."""
    return {} if RELEASE < (0, 19) else {"async_strategy": async_save_strategy()}


def async_calls_queue():
    """The queue that runs asynchronous saves' requests: nvidia-resiliency-ext's for "nvrx" requests,
    megatron-core's otherwise. Not persistent (nvidia-resiliency-ext's default): a persistent writer is a spawned
    process that escapes the rank's fork hooks (it outlives a rank killed with -9, still writing) and the
    write patches above, and does not run on CPU ranks; with one forked writer per save, both paths are the same
    fork-per-save design as megatron-core's."""
    if async_save_strategy() == "nvrx":
        from nvidia_resiliency_ext.checkpointing.async_ckpt.core import AsyncCallsQueue

        return AsyncCallsQueue(persistent=False)
    from megatron.core.dist_checkpointing.strategies.async_utils import AsyncCallsQueue

    return AsyncCallsQueue()


# 14. -----------------------------------------------------------------------------------------------------
# Warnings of megatron-core's that say nothing to a user of this package, silenced where they are raised:
# - 0.19's `get_megatron_optimizer` imports its experimental MiMo model at each call (to check the model's type),
#   which warns "MimoModelConfig is experimental" once per process: imported quietly with megatron-core;
# - 0.19's synchronous save goes through the asynchronous one, so every save logged "MCore's async save is
#   deprecated" (the trainer itself says which writer an asynchronous save uses);
# - 0.19 reads a checkpoint's common state with `torch.distributed.checkpoint.load(no_dist=True)`, which warns that
#   there is no process group, the case it was asked for (`load_common_state`);
# - 0.19's `log_single_rank` (each line megatron-core logs on one rank) warns "Could not determine rank" without a
#   process group before it answers 0, the rank a single process is (`rank_zero_without_process_group`).
IMPORT_WARNINGS = (".*MimoModelConfig is experimental.*",)
QUIET_IMPORTS = () if RELEASE < (0, 19) else ("megatron.core.models.mimo.model.base",)
NO_PROCESS_GROUP_WARNINGS = (".*torch.distributed is disabled, unavailable or uninitialized.*",
                             ".*The argument order of load has been changed.*",
                             ".*Could not determine rank from torch.distributed.*")


def ignore_no_process_group_warnings() -> None:
    """Inside a `warnings.catch_warnings()` block: the warnings that there is no process group, where a single
    process works without one on purpose, not shown."""
    for message in NO_PROCESS_GROUP_WARNINGS:
        warnings.filterwarnings("ignore", message=message)


def drop_the_sync_save_deprecation() -> None:
    """From 0.19: megatron-core's log of every save no longer says its async writer is deprecated."""
    logger = logging.getLogger("megatron.core.dist_checkpointing.strategies.torch")
    deprecation = "MCore's async save is deprecated"
    if RELEASE >= (0, 19) and not any(getattr(f, "text", None) == deprecation for f in logger.filters):
        logger.addFilter(_MessagesDropped(deprecation))


# 15. -----------------------------------------------------------------------------------------------------
def placeholders_without_strides() -> None:
    """megatron-core's placeholders for a checkpoint's tensors made without torch 2.15's `strides` property, which
    `torch.empty` does not take (every read of tensor metadata failed); a no-op on an older torch. Applied by
    `checkpoint.state`'s import, which every checkpoint read goes through."""
    # Upstream (dist_checkpointing/strategies/torch.py, 0.16.1 and 0.19.2 alike): `load_tensors_metadata` builds each
    # placeholder as `torch.empty(size, **properties.__dict__, device='meta')`; torch 2.15 added `strides` to
    # `TensorProperties` (None when it reads an older checkpoint). A meta tensor holds no data: its strides say nothing.
    # Reads the private `_get_filesystem_reader`, as upstream does, when no metadata is given.
    from torch.distributed.checkpoint.metadata import TensorProperties

    if "strides" not in {field.name for field in dataclasses.fields(TensorProperties)}:
        return
    from megatron.core.dist_checkpointing.strategies import torch as torch_strategy

    strategy = torch_strategy.TorchDistLoadShardedStrategy
    original = strategy.load_tensors_metadata
    if getattr(original, "drops_strides", False):
        return

    @functools.wraps(original)
    def load_tensors_metadata(self, checkpoint_dir, metadata=None):
        if metadata is None:
            metadata = torch_strategy._get_filesystem_reader(checkpoint_dir).read_metadata()
        return original(self, checkpoint_dir, _metadata_without_strides(metadata))

    load_tensors_metadata.drops_strides = True
    strategy.load_tensors_metadata = load_tensors_metadata


def _metadata_without_strides(metadata):
    """A shallow copy of a checkpoint's metadata whose tensor properties have no `strides` of their own (reading one
    still answers None, the field's default): the caller's copy, which torch's own load reads, keeps them."""
    from torch.distributed.checkpoint.metadata import TensorStorageMetadata

    entries = {}
    for key, entry in metadata.state_dict_metadata.items():
        if isinstance(entry, TensorStorageMetadata):
            properties = copy.copy(entry.properties)
            properties.__dict__.pop("strides", None)
            entry = dataclasses.replace(entry, properties=properties)
        entries[key] = entry
    stripped = copy.copy(metadata)
    stripped.state_dict_metadata = entries
    return stripped
