"""Set up torch.distributed and megatron-core's parallel state; run a function on N local ranks."""

import gc
import os
import pickle
import queue
import time
import traceback
from datetime import timedelta
from multiprocessing import reduction
from typing import Any, Callable, List, Optional, Tuple

import torch
import torch.multiprocessing as mp

from megatron_neobert.errors import TrainingError
from megatron_neobert.kernels import quiet_import_warnings_option
from megatron_neobert.megatron_core_compat import destroy_model_parallel_groups
from megatron_neobert.parallel.cpu import cpu_execution
from megatron_neobert.parallel.rendezvous import attempt_store, uses_agent_store

# Set to 1 to train on the CPU with a CUDA build of torch that sees no GPU.
ALLOW_CPU_ENV = "NEOBERT_ALLOW_CPU"


def check_gpus_for_training() -> None:
    """Training where a CUDA build of torch sees no GPU is a broken node (a container started without GPUs, a wrong
    CUDA_VISIBLE_DEVICES): refused, unless asked for, so that a run meant for GPUs never crawls on the CPU unnoticed.
    A CPU build of torch trains on the CPU. Only the trainer asks: conversion, export, evaluation and the benchmarks'
    CPU modes are ordinary work on a node without GPUs (a login node, a CPU job), whatever torch's build."""
    if torch.version.cuda is None or torch.cuda.is_available() or os.environ.get(ALLOW_CPU_ENV) == "1":
        return
    raise TrainingError(
        f"torch {torch.__version__} is built for CUDA {torch.version.cuda} but sees no GPU "
        f"(CUDA_VISIBLE_DEVICES={os.environ.get('CUDA_VISIBLE_DEVICES', '<unset>')}): was the container started "
        f"with GPUs? To train on the CPU anyway, set {ALLOW_CPU_ENV}=1")


def init_distributed(timeout_minutes: float = 30, store: Optional[torch.distributed.Store] = None) -> None:
    """Initialise torch.distributed: NCCL on GPUs, gloo on the CPU (megatron-core's CUDA calls then need
    `parallel.cpu.cpu_execution`, which the caller switches on).

    Ranks meet through `store` when given (`run_on_ranks`), else through torchrun's environment
    (RANK, MASTER_ADDR/MASTER_PORT): on the agent's store under a name of this attempt's own when torchrun
    shares its store, so that a restarted attempt never reads the keys of the one before (`rendezvous`). A
    lone process that no launcher started (no RANK: a tool, a notebook) needs no rendezvous and takes an
    in-memory store, so it never looks for a free port, even when the shell exports MASTER_PORT, as cluster
    shells often do.
    """
    if torch.distributed.is_initialized():
        return
    if torch.cuda.is_available():
        torch.cuda.set_device(int(os.environ.get("LOCAL_RANK", 0)))
        backend = "nccl"
    else:
        backend = "gloo"
    rank, world_size = int(os.environ.get("RANK", 0)), int(os.environ.get("WORLD_SIZE", 1))
    timeout = timedelta(minutes=timeout_minutes)
    if store is None and world_size == 1 and "RANK" not in os.environ:
        store = torch.distributed.HashStore()
    elif store is None and uses_agent_store():
        store = attempt_store(rank, world_size, timeout)
    if store is None:
        torch.distributed.init_process_group(backend=backend, timeout=timeout)
    else:
        torch.distributed.init_process_group(backend=backend, store=store, rank=rank, world_size=world_size,
                                             timeout=timeout)


def initialize_model_parallel(tensor_model_parallel_size: int = 1,
                              pipeline_model_parallel_size: int = 1,
                              virtual_pipeline_model_parallel_size: Optional[int] = None,
                              seed: Optional[int] = 1234, distributed_timeout_minutes: float = 30) -> None:
    """megatron-core's parallel groups (their collectives time out after
    `distributed_timeout_minutes`) and its tensor-parallel RNG tracker, seeded with `seed` (None: left to the
    caller, as the trainer seeds every generator per pipeline stage). Joins the process group first unless this
    process is in one already."""
    from megatron.core import parallel_state, tensor_parallel

    if not torch.distributed.is_initialized():  # a tool or a test alone; the trainer has joined already
        init_distributed(distributed_timeout_minutes)
    if parallel_state.model_parallel_is_initialized():
        destroy_model_parallel_groups()
    parallel_state.initialize_model_parallel(
        tensor_model_parallel_size=tensor_model_parallel_size,
        pipeline_model_parallel_size=pipeline_model_parallel_size,
        virtual_pipeline_model_parallel_size=virtual_pipeline_model_parallel_size,
        distributed_timeout_minutes=distributed_timeout_minutes,
    )
    if seed is not None:
        tensor_parallel.model_parallel_cuda_manual_seed(seed)


class DistributedState:
    """Whether the process group and megatron-core's parallel state exist (now, or as given); `release()` destroys
    those that did not, so that a caller leaves the process as it found it (each gloo group holds threads and
    sockets until destroyed)."""

    def __init__(self, process_group: Optional[bool] = None, parallel_state: Optional[bool] = None):
        from megatron.core import parallel_state as mcore_parallel_state

        self.process_group = torch.distributed.is_initialized() if process_group is None else process_group
        self.parallel_state = (mcore_parallel_state.model_parallel_is_initialized() if parallel_state is None
                               else parallel_state)

    def release(self) -> None:
        from megatron.core import parallel_state

        if not self.parallel_state and parallel_state.model_parallel_is_initialized():
            destroy_model_parallel_groups()
        if not self.process_group and torch.distributed.is_initialized():
            torch.distributed.destroy_process_group()
        # A destroyed group lives on while the model or optimizer of a finished run refers to it, and those sit in
        # reference cycles (modules and their hooks): collected now, their groups' threads end now.
        gc.collect()


# The modules named by `preload_on_ranks`, for the server that CPU ranks are forked from to import as it starts.
_preloaded: List[str] = []


def preload_on_ranks(*modules: str) -> None:
    """Name modules that the ranks of `run_on_ranks` will run (the trainer, the converter), for the server that CPU
    ranks are forked from to import once as it starts, at this process's first `run_on_ranks`: a rank then starts
    in under a second, where importing torch, megatron-core and the trainer itself takes seconds. Named after the
    server has started, they are imported by each rank. The callers name them: this layer knows none above it."""
    _preloaded.extend(name for name in modules if name not in _preloaded)


def _rank_context():
    """How the ranks start. On the CPU they are forked from a server that has imported torch, megatron-core and the
    modules named by `preload_on_ranks` once (multiprocessing's forkserver, kept for the life of this process), and
    as clean as a spawned one, since the server did nothing but import. With a GPU they are spawned: a fresh
    interpreter each, so that no process before them has touched CUDA."""
    if torch.cuda.is_available():
        return mp.get_context("spawn")
    context = mp.get_context("forkserver")
    context.set_forkserver_preload([__name__, *_preloaded])  # its `_worker` runs every rank
    return context


class _HandedStream:
    """One of the caller's standard streams, handed to a rank as multiprocessing hands over a socket: the rank gets
    the same open file, its offset shared as a spawned rank's inherited stdout shares it (a reopened copy would write
    where the caller writes next, and be overwritten). It arrives as a file descriptor number."""

    def __init__(self, fd: int):
        self.fd = fd

    def __reduce__(self):  # runs while the rank is being started: the one time a descriptor can be handed over
        return _received_descriptor, (reduction.DupFd(self.fd),)


def _received_descriptor(handle) -> int:
    return handle.detach()


def _take_callers_environment(environ: dict, streams: Tuple[int, int]) -> None:
    """A rank forked from the server has the environment and the standard output and error the server had when it
    started: it takes its caller's, as a spawned rank has them (a variable set since, a test's captured output)."""
    os.environ.clear()
    os.environ.update(environ)
    for target, fd in zip((1, 2), streams):
        if fd != target:  # a spawned rank's are its own already
            os.dup2(fd, target)
            os.close(fd)


def _worker(rank: int, world_size: int, port: int, fn: Callable, args: tuple, kwargs: dict,
            results, environ: dict, streams: Tuple[int, int]) -> None:
    _take_callers_environment(environ, streams)
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), RANK=str(rank),
                      LOCAL_RANK=str(rank), WORLD_SIZE=str(world_size), LOCAL_WORLD_SIZE=str(world_size))
    torch.set_num_threads(1)  # N ranks share the machine's cores
    try:
        store = torch.distributed.TCPStore("127.0.0.1", port, world_size, is_master=False,
                                           timeout=timedelta(minutes=5))
        init_distributed(timeout_minutes=5, store=store)
        with cpu_execution():
            result = fn(*args, **kwargs)
        # Plain pickle bytes: torch's queue pickler would share tensors through memory that
        # disappears when this process exits.
        results.put((rank, True, pickle.dumps(result)))
    except BaseException:  # report every failure to the parent, with its traceback
        results.put((rank, False, traceback.format_exc()))
    finally:
        DistributedState(process_group=False, parallel_state=False).release()


def run_on_ranks(fn: Callable, world_size: int, *args, timeout_s: float = 900, **kwargs) -> List[Any]:
    """Run `fn(*args, **kwargs)` on `world_size` local processes joined by gloo (NCCL on GPUs).

    `fn` must be importable (a module-level function); what it returns must pickle. It runs inside
    `cpu_execution()` (a no-op with CUDA). Returns the
    list of return values by rank; raises with every failing rank's traceback.
    """
    ctx = _rank_context()
    results = ctx.Queue()
    # The parent holds the rendezvous store on a port the OS picked and keeps it bound, so no
    # other process can take the port between choosing it and the ranks joining.
    store = torch.distributed.TCPStore("127.0.0.1", 0, world_size, is_master=True, wait_for_workers=False)
    port = store.port
    # Spawned ranks import megatron-core as they unpickle `fn`, and the forkserver as it starts, before any code of
    # ours runs in them.
    os.environ["PYTHONWARNINGS"], before = quiet_import_warnings_option(), os.environ.get("PYTHONWARNINGS")
    streams = (_HandedStream(1), _HandedStream(2))
    procs = [ctx.Process(target=_worker, args=(r, world_size, port, fn, args, kwargs, results, dict(os.environ),
                                               streams))
             for r in range(world_size)]
    try:
        for p in procs:
            p.start()
    finally:
        if before is None:
            del os.environ["PYTHONWARNINGS"]
        else:
            os.environ["PYTHONWARNINGS"] = before
    # Read results before joining: a child blocks on a large result until it is read.
    outcomes, deadline = {}, time.monotonic() + timeout_s
    while len(outcomes) < world_size and time.monotonic() < deadline:
        try:
            rank, ok, value = results.get(timeout=1.0)
            outcomes[rank] = (ok, value)
        except queue.Empty:
            if not any(p.is_alive() for p in procs) and results.empty():
                break
    for p in procs:
        p.join(max(1.0, deadline - time.monotonic()))
        if p.is_alive():
            p.kill()
    failures = [f"rank {r}:\n{v}" for r, (ok, v) in sorted(outcomes.items()) if not ok]
    missing = [r for r in range(world_size) if r not in outcomes]
    if failures or missing:
        raise RuntimeError(f"{fn.__name__} failed on {world_size} ranks (no result from ranks "
                           f"{missing})\n" + "\n".join(failures))
    return [pickle.loads(outcomes[r][1]) for r in range(world_size)]
