"""Each megatron-core patch of megatron_neobert/megatron_core_compat.py still applies to the installed release:
these fail when upstream moved or changed what a patch leans on (then review that patch, see its "On 0.17")."""

import errno
import inspect
import os
import queue
import subprocess
import sys
import types

import pytest
import torch

from megatron_neobert import megatron_core_compat as compat


def test_another_megatron_core_release_is_refused_in_one_line():
    probe = ("import importlib.metadata as m; m.version = lambda name: '0.17.0'; "
             "import megatron_neobert.megatron_core_compat")
    out = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, timeout=300,
                         env={**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)})
    assert out.returncode == 1
    assert out.stderr.strip().splitlines()[-1] == (
        "ImportError: megatron_neobert supports megatron-core 0.16.x and 0.19.x (megatron_neobert/"
        "megatron_core_compat.py holds what differs between them), found 0.17.0")


def test_torch_adam_state_loads_with_a_step_per_parameter(monkeypatch):
    from megatron.core.optimizer import distrib_optimizer

    if distrib_optimizer.HAVE_APEX_OR_TE:
        pytest.skip("TE's or apex's FusedAdam keeps the step in the param groups: the patch is not applied")
    cls = distrib_optimizer.DistributedOptimizer
    upstream = cls._set_main_param_and_optimizer_states
    upstream = getattr(upstream, "__wrapped__", upstream)
    monkeypatch.setattr(cls, "_set_main_param_and_optimizer_states", upstream)
    assert list(inspect.signature(upstream).parameters) == ["self", "model_param", "tensors"]

    params = [torch.nn.Parameter(torch.zeros(3)) for _ in range(2)]
    fake = cls.__new__(cls)  # the attributes the state load reads, as DistributedOptimizer.__init__ sets them
    fake.optimizer = torch.optim.AdamW(params)
    fake.config = types.SimpleNamespace(use_precision_aware_optimizer_no_fp8_or_ds_fp8=False)
    fake.model_param_group_index_map = {i: (0, i) for i in range(2)}
    fake.init_state_fn = lambda opt, config: [opt.state[p].update(exp_avg=torch.zeros(3), exp_avg_sq=torch.zeros(3))
                                              for p in params]
    saved = {"param": torch.ones(3), "exp_avg": torch.full((3,), 2.0), "exp_avg_sq": torch.full((3,), 3.0)}

    fake.init_state_fn(fake.optimizer, None)
    for p in params:
        fake.optimizer.state[p]["step"] = torch.tensor(0.0)
    with pytest.raises(KeyError, match="step"), torch.no_grad():  # upstream copies every key, "step" included
        cls._set_main_param_and_optimizer_states(fake, 0, saved)

    compat.prepare_torch_adam_for_state_load(fake)
    with torch.no_grad():  # as upstream's load calls it
        for i in range(2):
            cls._set_main_param_and_optimizer_states(fake, i, saved)
    states = [fake.optimizer.state[p] for p in params]
    assert all(torch.equal(params[i], saved["param"]) for i in range(2))
    assert all(torch.equal(s["exp_avg"], saved["exp_avg"]) and torch.equal(s["exp_avg_sq"], saved["exp_avg_sq"])
               for s in states)
    assert states[0]["step"] is not states[1]["step"]  # one step tensor each, as torch's Adam increments them


def test_synchronous_save_results_stay_in_the_process(monkeypatch):
    from megatron.core.dist_checkpointing.strategies import filesystem_async

    monkeypatch.setattr(filesystem_async, "_results_queue", None)  # restored after the test
    compat.keep_write_results_with_the_rank(False, None)
    results = compat.write_results_queue()
    assert isinstance(results, queue.Queue) and results is filesystem_async._results_queue


ASYNC_RESULTS_SERVER = """
import os, signal, time
import psutil
from megatron_neobert import megatron_core_compat as compat
from megatron_neobert.training.resilience.guards.children import ChildrenTie
from megatron_neobert.training.resilience.guards.signals import ignore_exit_signals
ChildrenTie().__enter__()
compat.keep_write_results_with_the_rank(True, ignore_exit_signals)
results = compat.write_results_queue()
(server,) = psutil.Process().children()
os.kill(server.pid, signal.SIGTERM)  # what a pre-emption signal to the rank's process group does to it
time.sleep(0.5)
results.put("written")
assert results.get(timeout=10) == "written"
print(server.pid, flush=True)
os.kill(os.getpid(), signal.SIGKILL)
"""


@pytest.mark.integration
def test_an_asynchronous_saves_results_server_outlives_exit_signals_but_not_its_rank():
    import signal
    import time

    import psutil
    out = subprocess.run([sys.executable, "-c", ASYNC_RESULTS_SERVER], capture_output=True, text=True, timeout=120)
    assert out.returncode == -signal.SIGKILL, out.stderr
    server, deadline = int(out.stdout), time.monotonic() + 10
    while psutil.pid_exists(server) and psutil.Process(server).status() != psutil.STATUS_ZOMBIE:
        assert time.monotonic() < deadline, f"the results server {server} outlived its rank (kill -9)"
        time.sleep(0.1)


def test_a_full_disk_in_a_writer_reaches_the_rank_as_enospc(monkeypatch):
    from megatron.core.dist_checkpointing.strategies import filesystem_async

    # The writers call the module's _write_item by name, so that replacing it reaches them.
    assert "_write_item(" in inspect.getsource(filesystem_async.FileSystemWriterAsync.write_preloaded_data)

    def write_item_on_a_full_disk(*args, **kwargs):  # what torch.save raises there
        try:
            raise OSError(errno.ENOSPC, "No space left on device")
        except OSError as full:
            raise RuntimeError("unexpected pos 1234 vs 1200") from full

    monkeypatch.setattr(filesystem_async, "_write_item", write_item_on_a_full_disk)
    compat.keep_disk_full_in_writer_errors(lambda err: isinstance(err.__cause__, OSError))
    with pytest.raises(OSError) as raised:
        filesystem_async._write_item()
    assert raised.value.errno == errno.ENOSPC


def test_a_process_without_a_group_is_rank_0_for_blends_and_the_rank_helper():
    from megatron.core.datasets.blended_dataset import BlendedDataset

    # Upstream asks for the rank on a cache miss: unguarded up to 0.17 (the reason for the patch), guarded from 0.18.
    guarded = "not torch.distributed.is_initialized() or torch.distributed.get_rank() == 0"
    assert (guarded in inspect.getsource(BlendedDataset._build_indices)) == (compat.RELEASE >= (0, 18))
    # In a process of its own: this one may be in a process group already.
    probe = """
import warnings
import torch
from megatron.core._rank_utils import safe_get_rank
from megatron_neobert.megatron_core_compat import rank_zero_without_process_group
def rank():
    try:
        return torch.distributed.get_rank()
    except ValueError:
        return "no process group"
def warnings_of_the_rank_helper():
    with warnings.catch_warnings(record=True) as caught:
        warnings.filterwarnings("always", append=True)  # after the block's own filter, which comes first
        assert safe_get_rank() == 0
    return len(caught)
inside = None
with rank_zero_without_process_group():
    inside = rank()
    inside_warned = warnings_of_the_rank_helper()
print(rank(), inside, rank(), sep="|")
print(warnings_of_the_rank_helper(), inside_warned, warnings_of_the_rank_helper(), sep="|")
"""
    out = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, timeout=300,
                         env={**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)})
    assert out.returncode == 0, out.stderr[-2000:]
    inside = "0" if compat.RELEASE < (0, 18) else "no process group"  # rank 0 inside the block alone, where needed
    ranks, warned = out.stdout.strip().splitlines()
    assert ranks == f"no process group|{inside}|no process group"
    # 0.19's rank helper (each line megatron-core logs on one rank) warns that it defaults to rank 0 without a group;
    # inside the block, which says the same, it does not.
    assert warned == ("1|0|1" if compat.RELEASE >= (0, 19) else "0|0|0")


def test_the_tensor_parallel_rng_tracker_forks_the_cpu_generator(cpu_execution):
    from megatron.core.tensor_parallel import random as mcore_random

    if torch.cuda.is_available():
        pytest.skip("a CUDA device: the tracker forks the CUDA generator itself")
    assert "_get_cuda_rng_state" in inspect.getsource(mcore_random.CudaRNGStatesTracker)
    assert "_set_cuda_rng_state" in inspect.getsource(mcore_random.CudaRNGStatesTracker)

    tracker = mcore_random.CudaRNGStatesTracker()
    tracker.add(mcore_random._MODEL_PARALLEL_RNG_TRACKER_NAME, 5)
    outside = torch.get_rng_state()
    with tracker.fork():
        first = torch.rand(4)
    assert torch.equal(torch.get_rng_state(), outside)  # the fork swapped the CPU generator's state, and back
    with tracker.fork():
        assert not torch.equal(torch.rand(4), first)  # the tracker's stream went on
    assert not torch.equal(torch.rand(4), first)  # the CPU generator's own stream is another one


def test_model_parallel_groups_are_destroyed_and_every_reference_dropped(cpu_execution):
    from megatron.core import parallel_state
    from megatron.core.models.common.embeddings.rotary_pos_embedding import RotaryEmbedding

    from megatron_neobert.parallel.launch import DistributedState, initialize_model_parallel

    found = DistributedState()
    initialize_model_parallel(1, 1)
    created = [group for group in parallel_state._global_process_group_list if group is not None]
    assert created and parallel_state._INTRA_PARTIAL_DATA_PARALLEL_GROUP_WITH_CP is not None
    RotaryEmbedding(kv_channels=8, rotary_percent=1.0).forward(4)
    assert RotaryEmbedding.forward.cache_info().currsize > 0

    compat.destroy_model_parallel_groups()
    assert not parallel_state.model_parallel_is_initialized()
    assert not [name for name, value in vars(parallel_state).items() if isinstance(value, torch.distributed.ProcessGroup)]
    assert not [group for group in created if group in torch.distributed.distributed_c10d._world.pg_map]
    assert RotaryEmbedding.forward.cache_info().currsize == 0
    found.release()


def test_tensor_metadata_of_torch_2_15_reads_as_placeholders(single_rank, tmp_path, monkeypatch):
    """torch 2.15 writes (and reads back) a `strides` field in each tensor's metadata, which megatron-core passed on
    to `torch.empty`: without the patch its metadata read fails there; with it, the placeholders have the saved
    shapes and dtypes. On a torch without the field the patch leaves megatron-core's reader as it is."""
    import dataclasses

    from megatron.core import dist_checkpointing
    from megatron.core.dist_checkpointing.mapping import ShardedTensor
    from megatron.core.dist_checkpointing.strategies import torch as torch_strategy
    from torch.distributed.checkpoint.metadata import TensorProperties

    import megatron_neobert.checkpoint.state  # noqa: F401  (its import applies the patch)

    saved = {"weight": torch.arange(6, dtype=torch.float32).reshape(2, 3), "step": torch.tensor([7], dtype=torch.int64)}
    dist_checkpointing.save({k: ShardedTensor.from_rank_offsets(k, v) for k, v in saved.items()}, str(tmp_path))

    loaded = dist_checkpointing.load_tensors_metadata(str(tmp_path))
    assert {k: (tuple(v.global_shape), v.dtype) for k, v in loaded.items()} == {
        k: (tuple(v.shape), v.dtype) for k, v in saved.items()}

    patched = torch_strategy.TorchDistLoadShardedStrategy.load_tensors_metadata
    if "strides" not in {field.name for field in dataclasses.fields(TensorProperties)}:
        assert not getattr(patched, "drops_strides", False)
        return
    assert patched.drops_strides
    monkeypatch.setattr(torch_strategy.TorchDistLoadShardedStrategy, "load_tensors_metadata", patched.__wrapped__)
    with pytest.raises(TypeError, match="strides"):
        dist_checkpointing.load_tensors_metadata(str(tmp_path))
