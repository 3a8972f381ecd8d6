"""Every megatron-core private internal this package patches or reads, in one file, for megatron-core 0.16.x only.

Importing it refuses any other megatron-core release in one line: each patch below leans on a private
name or on the exact behaviour of 0.16, so moving to 0.17 means reviewing this file (and
tests/test_megatron_core_compat.py, which fails when a patched name moved), not the whole package.
Each patch says what upstream does, why we patch it, and what to check on 0.17.

1. `prepare_torch_adam_for_state_load`: the distributed optimizer's state load into torch's Adam.
2. `keep_write_results_with_the_rank`: the write-results queue of a distributed-checkpoint save.
3. `keep_disk_full_in_writer_errors`: a full disk as an OSError from the checkpoint writers.
4. `rank_zero_without_process_group`: BlendedDataset's index cache built in a process without a group.
5. `cuda_rng_on_cpu`: the tensor-parallel RNG tracker's CUDA RNG states, on CPU, for a block
   (`parallel/cpu.py` redirects the rest of megatron-core's CUDA calls, through torch's own hooks).
6. Private names read, not patched: the `.idx` header, RoPE's rotation, apex's wgrad fusion flag.
7. `destroy_model_parallel_groups`: megatron-core's parallel groups destroyed, not only forgotten.
"""

import contextlib
import errno
import functools
import importlib.metadata
import multiprocessing
import multiprocessing.managers
import os
import queue
from typing import Callable

import torch

SUPPORTED = "0.16"
# Read from the installed package's metadata: importing megatron.core itself takes seconds, and the patches
# import their modules only when applied.
MEGATRON_CORE_VERSION = importlib.metadata.version("megatron-core")

if MEGATRON_CORE_VERSION.split(".")[:2] != SUPPORTED.split("."):
    raise ImportError(f"megatron_neobert needs megatron-core {SUPPORTED}.x (its patches in "
                      f"megatron_neobert/megatron_core_compat.py are for that release), found {MEGATRON_CORE_VERSION}")


# 1. ------------------------------------------------------------------------------------------------------
def prepare_torch_adam_for_state_load(optimizer) -> None:
    """Let megatron-core's distributed optimizer load per-parameter state into torch's Adam (no TE, no apex:
    the CPU case), before `optimizer.sharded_state_dict(..., is_loading=True)`.

    Upstream (optimizer/distrib_optimizer.py): building the state dict to load into reads "step" from every
    parameter's state and fills in only the moments of a fresh optimizer; at load,
    `DistributedOptimizer._set_main_param_and_optimizer_states` copies every key of a parameter's state from
    the checkpoint tensors, which hold no "step" (KeyError), after setting "step" from the param groups as
    one tensor shared by all parameters.
    Why: torch's Adam keeps "step" per parameter. We give a fresh optimizer its state (the load overwrites
    it), skip "step" in the copy and give each parameter its own step tensor: with one shared tensor torch's
    Adam would increment it once per parameter at every step. TE's and apex's FusedAdam keep the step in
    the param groups and need none of this (`HAVE_APEX_OR_TE`).
    On 0.17: check that `_set_main_param_and_optimizer_states(self, model_param, tensors)`,
    `model_param_group_index_map`, `init_state_fn` and `HAVE_APEX_OR_TE` still exist, and whether the load
    now handles torch's per-parameter "step" itself (then drop this).
    """
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
    """The write results of a distributed-checkpoint save go through a queue that lives and dies with the rank.

    Upstream (dist_checkpointing/strategies/filesystem_async.py): `_get_write_results_queue` creates the
    module global `_results_queue` on first use as a queue of a spawned `multiprocessing.Manager` server.
    Why: that server is a process outside the rank's reach: it dies of the scheduler's pre-emption signal in
    the middle of a save (BrokenPipeError), and survives a rank killed with -9 (~370 MB each).
    - A synchronous save writes from the rank itself: an in-process queue is enough.
    - An asynchronous save's writer is a process the rank forks: the queue's server is forked from the rank
      too, so that the rank's fork hooks tie it to the rank (call this after registering them), and runs
      `server_initializer` first (the trainer's: ignore the exit signals, as the rank's other helpers do).
    On 0.17: check that `_get_write_results_queue` still returns the global `_results_queue` when it is set.
    """
    global _async_results_manager
    from megatron.core.dist_checkpointing.strategies import filesystem_async

    if not async_save:
        if not isinstance(filesystem_async._results_queue, queue.Queue):
            filesystem_async._results_queue = queue.Queue()
        return
    if _async_results_manager is None:
        manager = multiprocessing.managers.SyncManager(ctx=multiprocessing.get_context("fork"))
        manager.start(initializer=server_initializer)
        _async_results_manager = manager
        filesystem_async._results_queue = manager.Queue()


# 3. ------------------------------------------------------------------------------------------------------
def keep_disk_full_in_writer_errors(is_disk_full: Callable[[BaseException], bool]) -> None:
    """A checkpoint writer that runs out of disk space raises an OSError(ENOSPC) the rank can recognise.

    Upstream (filesystem_async.py): the writers call the module's `_write_item`, where torch.save turns a
    full disk into RuntimeError "unexpected pos" with the OSError only as its context; the error is sent
    back to the rank pickled, which loses the context.
    Why: the trainer tells a full disk from other save failures (`is_disk_full`, its predicate) to say so in
    one line; wrapping `_write_item` raises the OSError itself in the writer.
    On 0.17: check that the writers still call the module-level `_write_item` by name.
    """
    from megatron.core.dist_checkpointing.strategies import filesystem_async

    write_item = filesystem_async._write_item
    if getattr(write_item, "keeps_disk_full", False):
        return

    @functools.wraps(write_item)
    def keeping_disk_full(*args, **kwargs):
        try:
            return write_item(*args, **kwargs)
        except RuntimeError as err:
            if is_disk_full(err):
                raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC)) from err
            raise

    keeping_disk_full.keeps_disk_full = True
    filesystem_async._write_item = keeping_disk_full


# 4. ------------------------------------------------------------------------------------------------------
@contextlib.contextmanager
def rank_zero_without_process_group():
    """Inside the block, a process without a process group is rank 0 to `torch.distributed.get_rank()`.

    Upstream (datasets/blended_dataset.py): `BlendedDataset._build_indices` asks
    `torch.distributed.get_rank() == 0` on a cache miss, to let one rank write the index cache; without a
    process group that call raises.
    Why: the data tools and the dataset checks build blends in a single process without a group; that
    process is the only one, so it is rank 0 and writes the cache.
    On 0.17: check whether `_build_indices` still calls `torch.distributed.get_rank()` unguarded (upstream's
    own `log_single_rank` checks `is_initialized` first); if it no longer does, drop this.
    """
    if torch.distributed.is_initialized():
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
    """Inside the block, the CUDA RNG functions megatron-core uses are pointed at the CPU default generator (CPU
    execution only); restored after it.

    Upstream (tensor_parallel/random.py): the tensor-parallel RNG tracker forks "CUDA" RNG states around
    dropout and initialisation through the private `_get_cuda_rng_state` / `_set_cuda_rng_state`, and seeds
    with `torch.cuda.manual_seed`.
    Why: on CPU the kernels draw from the CPU generator, so the fork must swap that state.
    On 0.17: check that the tracker still goes through `_get_cuda_rng_state` / `_set_cuda_rng_state`
    (module functions, looked up at call time) and `torch.cuda.get_rng_state` / `set_rng_state`.
    """
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
# On 0.17: check that each still exists with the same meaning (tests/test_megatron_core_compat.py imports them).

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
    """Destroy every process group megatron-core's parallel state created, and drop every reference it keeps to them.

    Upstream (parallel_state.py): `destroy_model_parallel` sets most of its group globals to None and destroys only
    its gloo copies of the data-parallel groups; it leaves `_INTRA_PARTIAL_DATA_PARALLEL_GROUP_WITH_CP` (and its gloo
    copy) set. `create_group` lists every group it made in the private `_global_process_group_list` (None standing
    for the default group). RotaryEmbedding.forward is an lru_cache keyed on the module, which holds its
    context-parallel group.
    Why: torch keeps a group alive while anything refers to it, a gloo group with its threads and sockets, so a
    process that sets the parallel state up again and again (the test suite's workers, a tool called in a loop)
    gathered thousands of threads.
    On 0.17: check that `_global_process_group_list` still lists the groups `create_group` made, whether
    `destroy_model_parallel` now destroys them and resets every group global itself (then call it alone), and
    whether RotaryEmbedding.forward is still cached that way.
    """
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
