"""What a step really executed, read from the running model and from torch.profiler's events rather than from the
settings: which of the transformer layers' linears ran their forward in FP8, which packed-attention kernel each
attention module ran, and which calls of a step made the host wait for the GPU. The GPU tests (tests/gpu/) assert
with them; tests/test_execution_checks.py shows each one failing on a CPU.
"""

import contextlib
import dataclasses
import re
from functools import partial
from typing import Dict, List

import torch
from megatron.core.pipeline_parallel import get_forward_backward_func
from megatron.core.utils import get_model_config
from torch.autograd import DeviceType
from torch.profiler import ProfilerActivity, profile, record_function

from megatron_neobert.model.attention import BidirectionalAttention
from megatron_neobert.training.engine.forward_step import micro_batch_tensor_shape, mlm_forward_step

# The four GEMMs of every transformer layer, the ones FP8 applies to (attention itself, the norms and the MLM head
# stay in bf16).
LAYER_LINEARS = ("linear_qkv", "linear_proj", "linear_fc1", "linear_fc2")


class LinearPrecisions:
    """Records, for each linear of the transformer layers of `chunks`, whether each of its forwards ran in FP8.

    Read from the module itself as it ran: Transformer Engine's modules set their `fp8` flag from the FP8 autocast
    at every forward (`TransformerEngineBaseModule.init_fp8_metadata`) and take the FP8 GEMM path from it;
    megatron-core's local linears have no FP8 path (and no flag)."""

    def __init__(self, chunks):
        self.ran: Dict[str, dict] = {}
        self._handles = []
        for chunk in chunks:
            for name, module in chunk.named_modules():
                if name.rsplit(".", 1)[-1] in LAYER_LINEARS:
                    self.ran[name] = {"module": type(module).__name__, "fp8": []}
                    self._handles.append(module.register_forward_hook(partial(self._record, name)))
        if not self.ran:
            raise ValueError(f"no transformer-layer linear ({', '.join(LAYER_LINEARS)}) in the model")

    def _record(self, name, module, args, output):
        flags = self.ran[name]["fp8"]
        fp8 = bool(getattr(module, "fp8", False))
        if fp8 not in flags:
            flags.append(fp8)

    def remove(self) -> Dict[str, dict]:
        """Stops recording; returns {linear: {"module": its class, "fp8": the flags its forwards ran with}}."""
        for handle in self._handles:
            handle.remove()
        return self.ran


def assert_linears_ran(ran: Dict[str, dict], fp8: bool) -> None:
    """Every linear of `ran` (LinearPrecisions.remove()) ran, each forward in FP8 (`fp8`) or each without it;
    the assertion names every one that did not."""
    wrong = []
    for name, record in ran.items():
        if not record["fp8"]:
            wrong.append(f"{name} ({record['module']}) never ran")
        elif record["fp8"] != [fp8]:
            did = " and ".join("in FP8" if flag else "without FP8" for flag in record["fp8"])
            wrong.append(f"{name} ({record['module']}) ran {did}")
    assert not wrong, (f"{len(wrong)} of the {len(ran)} transformer-layer linears did not run "
                       f"{'in' if fp8 else 'without'} FP8: " + "; ".join(wrong))


@contextlib.contextmanager
def packed_kernels(chunks):
    """Yields {attention module: the packed-attention kernels its forwards ran}, filled as `chunks` (the local spec)
    run packed input: the `packed_backend` each `BidirectionalAttention` dispatches on, fixed when the module was
    built (so NEOBERT_PACKED_ATTENTION set afterwards changes nothing), read as each packed forward starts."""
    ran: Dict[str, set] = {}

    def record(name, module, args, kwargs):
        if kwargs.get("packed_seq_params") is not None:
            ran.setdefault(name, set()).add(module.packed_backend)

    handles = [module.register_forward_pre_hook(partial(record, name), with_kwargs=True)
               for chunk in chunks for name, module in chunk.named_modules()
               if isinstance(module, BidirectionalAttention)]
    if not handles:
        raise ValueError("no BidirectionalAttention (the local spec's attention) in the model")
    try:
        yield ran
    finally:
        for handle in handles:
            handle.remove()


def assert_packed_kernel_ran(ran: Dict[str, set], kernel: str, modules: int) -> None:
    """Each of `modules` attention modules ran packed input, with `kernel` alone (`ran`: from packed_kernels)."""
    wrong = [f"{name} ran {', '.join(sorted(kernels))}" for name, kernels in ran.items() if kernels != {kernel}]
    assert len(ran) == modules and not wrong, (
        f"{len(ran)} of {modules} attention modules ran packed input, expected all with {kernel}: " + "; ".join(wrong))


# Where the sync check looks: from the first forward of a step to the end of its last backward (before
# megatron-core's finalize_model_grads, whose `if num_tokens > 0` reads a device value once per step).
FIRST_FORWARD, BACKWARD_DONE = "sync check: first forward", "sync check: last backward done"

# CUDA runtime calls that block the calling host thread until the device (or a stream) is done: the synchronize
# calls, the copies without Async (they wait for the stream, and a copy from the device for the copy), and the frees
# (cudaFree synchronizes the device). Runtime calls alone: Kineto (torch.profiler's CUDA activity) records every
# runtime call but a few noisy ones (cudaGetDevice, cudaSetDevice, cudaGetLastError, cudaEventCreate*, cudaEventDestroy;
# cudaEventSynchronize only since kineto 4df86b0, September 2023), and of the driver calls only the kernel launches
# and the cuMem* mapping calls (CuptiActivityProfiler::handleDriverActivity, CuptiCbidRegistry.cpp): a blocking
# driver call (cuStreamSynchronize, cuMemcpyDtoH, ...) never appears in a profile. PyTorch's own reads of a device
# value (`.item()`, `.tolist()`, a copy to the host) go through at::cuda::memcpy_and_sync: cudaMemcpyAsync, then
# cudaStreamSynchronize.
HOST_BLOCKING_CALLS = frozenset({
    "cudaDeviceSynchronize", "cudaThreadSynchronize", "cudaStreamSynchronize", "cudaEventSynchronize",
    "cudaMemcpy", "cudaMemcpy2D", "cudaMemcpy3D", "cudaMemcpyPeer", "cudaMemcpy3DPeer", "cudaMemcpyToSymbol",
    "cudaMemcpyFromSymbol", "cudaMemcpyToArray", "cudaMemcpyFromArray", "cudaMemcpy2DToArray",
    "cudaMemcpy2DFromArray", "cudaFree", "cudaFreeHost",
})
# A CUDA runtime or driver call as the profiler names it (CUPTI's name, perhaps with a version or per-thread
# default-stream suffix: cudaStreamSynchronize_v3020, cudaMemcpy_ptds; a driver call: cuLaunchKernel, Triton's).
_RUNTIME_CALL = re.compile(r"(cu(?:da)?[A-Z][A-Za-z0-9]*?)((?:_v\d+|_ptsz|_ptds)*)")
# Operators whose CUDA kernels read device values on the host: `item()`, `bool()`, `int()`, `float()`, `if t:`
# and torch.equal go through _local_scalar_dense; nonzero (boolean indexing) must learn its output's size.
# On a CPU profile, which has no runtime calls, they stand for the syncs a GPU would make there, but for the
# scalar that `t[mask] = value` reads: index_put_ takes its masked_fill_ path only for a value on the host.
HOST_READ_OPS = frozenset({"aten::_local_scalar_dense", "aten::nonzero"})
HOST_VALUE_READERS = frozenset({"aten::_index_put_impl_"})


# The sync check's positive control: profiler ranges around the host reads `planted_host_reads` makes.
PLANTED_ITEM, PLANTED_TOLIST = "planted .item()", "planted .tolist()"


@contextlib.contextmanager
def planted_host_reads(module):
    """An `.item()` and a `.tolist()` of `module`'s output in its forward (a forward hook, inside the module's
    profiler range), each in a range named PLANTED_ITEM or PLANTED_TOLIST: two syncs per forward on a GPU. On a CPU
    only the `.item()` shows (aten::_local_scalar_dense); `.tolist()` of a host tensor calls no operator."""
    def read(module, args, output):
        hidden = output[0] if isinstance(output, tuple) else output
        with record_function(PLANTED_ITEM):
            hidden.float().sum().item()
        with record_function(PLANTED_TOLIST):
            hidden.flatten()[:4].tolist()

    handle = module.register_forward_hook(read)
    try:
        yield
    finally:
        handle.remove()


def runtime_call(name: str):
    """The CUDA runtime or driver function a profiler event `name` records, or None for any other event."""
    match = _RUNTIME_CALL.fullmatch(name)
    return match.group(1) if match else None


@dataclasses.dataclass
class HostSyncReport:
    runtime_calls: int  # CUDA runtime and driver calls in the window: 0 on a CPU, or if the profiler saw no GPU
    syncs: List[str]  # each call that made the host wait, with the operators and modules it ran under


def _describe(event) -> str:
    chain, parent = [event.name], event.cpu_parent
    # Deep enough to name the layer under a copy's operators, DDP and megatron-core's Float16Module.
    while parent is not None and len(chain) < 12:
        chain.append(parent.name)
        parent = parent.cpu_parent
    return " < ".join(chain) + f" (thread {event.thread})"


def _reads_a_host_value(event) -> bool:
    parent = event.cpu_parent
    while parent is not None and parent.name.startswith("aten::"):
        if parent.name in HOST_VALUE_READERS:
            return True
        parent = parent.cpu_parent
    return False


def host_syncs(events) -> HostSyncReport:
    """The host syncs among torch.profiler `events` between the FIRST_FORWARD and BACKWARD_DONE markers: the
    host-blocking CUDA runtime calls (CUPTI records them from every library: PyTorch, Transformer Engine, cuDNN,
    Triton, NCCL), or on a profile without any runtime call (a CPU) the HOST_READ_OPS."""
    starts = {name: [e.time_range.start for e in events if e.name == name] for name in (FIRST_FORWARD, BACKWARD_DONE)}
    missing = [name for name, times in starts.items() if not times]
    if missing:
        raise ValueError(f"the profile has no {' and no '.join(map(repr, missing))} marker: run the step "
                         f"through profiled_step")
    begin, end = min(starts[FIRST_FORWARD]), max(starts[BACKWARD_DONE])
    window = [e for e in events if begin <= e.time_range.start < end]
    calls = [e for e in window if e.device_type == DeviceType.CPU and runtime_call(e.name)]  # not the kernels
    syncs = ([e for e in calls if runtime_call(e.name) in HOST_BLOCKING_CALLS] if calls
             else [e for e in window if e.name in HOST_READ_OPS and not _reads_a_host_value(e)])
    return HostSyncReport(len(calls), [_describe(e) for e in sorted(syncs, key=lambda e: e.time_range.start)])


@contextlib.contextmanager
def module_scopes(chunks):
    """Each module's forward as a profiler range named by its path in the model, so that a sync is reported with
    the module it happened in."""
    handles = []

    def enter(name, module, args):
        module._sync_check_scope = record_function(f"module: {name}")
        module._sync_check_scope.__enter__()

    def leave(module, args, output):
        module._sync_check_scope.__exit__(None, None, None)

    for chunk in chunks:
        for name, module in chunk.named_modules():
            handles += [module.register_forward_pre_hook(partial(enter, name or type(module).__name__)),
                        module.register_forward_hook(leave)]
    try:
        yield
    finally:
        for handle in handles:
            handle.remove()


def profiled_step(chunks, batches: List[dict], forward_step=mlm_forward_step) -> HostSyncReport:
    """One training step's forward and backward passes over `batches` (micro-batches) through megatron-core's
    schedule (get_forward_backward_func), as the trainer runs them, under torch.profiler (CPU and, on a GPU, CUDA
    activity); returns the host syncs between the start of the first forward and the end of the last backward."""
    config = get_model_config(chunks[0])
    finalize = config.finalize_model_grads_func
    first = [True]

    def marked_forward_step(data_iterator, model):
        if first:
            first.clear()
            with record_function(FIRST_FORWARD):
                pass
        return forward_step(data_iterator, model)

    def marked_finalize(*args, **kwargs):  # megatron-core calls it once the last backward has run
        with record_function(BACKWARD_DONE):
            pass
        if finalize is not None:
            finalize(*args, **kwargs)

    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if torch.cuda.is_available() else [])
    seq_length, micro_batch_size = micro_batch_tensor_shape(batches[0])
    for chunk in chunks:
        if hasattr(chunk, "zero_grad_buffer"):
            chunk.zero_grad_buffer()
    config.finalize_model_grads_func = marked_finalize
    try:
        with module_scopes(chunks), profile(activities=activities) as prof:
            get_forward_backward_func()(
                forward_step_func=marked_forward_step, data_iterator=iter(batches), model=chunks,
                num_microbatches=len(batches), seq_length=seq_length, micro_batch_size=micro_batch_size,
                forward_only=False)
    finally:
        config.finalize_model_grads_func = finalize
    return host_syncs(prof.events())
