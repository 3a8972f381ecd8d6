"""Run megatron-core's tensor, pipeline and data parallel code on CPU, over gloo.

megatron-core is written for CUDA and calls it directly in a handful of places: the current device, the CUDA RNG
state of the tensor-parallel RNG tracker, `torch.cuda.synchronize`, factory calls with `device="cuda"` (or a device
index), `Tensor.cuda()`, and `Tensor.type()` names checked by the optimizers and grad clipping. Inside
`with cpu_execution():` each of those goes to the CPU, so that the same code paths (TP/PP/DP, the distributed
optimizer, distributed checkpoints) run unchanged with several gloo processes: in CI, and on a laptop to debug a
run. The trainer's entry point and the commands that run megatron-core switch it on for their run (and say so),
`run_on_ranks` for each rank, the tests as a fixture; everything is restored when the block ends. On a machine with
CUDA it changes nothing.
"""

import contextlib
import logging

import torch
from torch.overrides import TorchFunctionMode

from megatron_neobert.megatron_core_compat import cuda_rng_on_cpu, patched

logger = logging.getLogger(__name__)


def _is_cuda_device(device) -> bool:
    if device is None or isinstance(device, bool):  # Tensor.to(device, dtype, non_blocking): a bool is no index
        return False
    if isinstance(device, int):  # a CUDA device index
        return True
    return torch.device(device).type == "cuda"


class _CudaToCpuMode(TorchFunctionMode):
    """Maps every tensor placement on a CUDA device to the CPU."""

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = dict(kwargs or {})
        if func is torch.Tensor.cuda:
            return args[0]
        if func is torch.Tensor.type and len(args) == 1 and not kwargs:
            # Optimizers and grad clipping assert names such as 'torch.cuda.FloatTensor'.
            return func(*args).replace("torch.", "torch.cuda.", 1)
        if _is_cuda_device(kwargs.get("device")):
            kwargs["device"] = "cpu"
        if func is torch.Tensor.to and len(args) > 1 and isinstance(args[1], (str, int, torch.device)) \
                and _is_cuda_device(args[1]):  # tensor.to(device, ...)
            args = (args[0], "cpu") + tuple(args[2:])
        return func(*args, **kwargs)


_active = False  # inside a cpu_execution() block: a nested one changes nothing


@contextlib.contextmanager
def cpu_execution():
    """Inside the block, megatron-core's CUDA calls run on the CPU; yields True, or False (and changes nothing) on a
    machine with a CUDA device."""
    global _active
    if torch.cuda.is_available() or _active:
        yield _active
        return
    # The device itself rather than an index: megatron-core passes it as `device=` also inside autograd backward
    # functions, where the function mode below is not active.
    cuda_calls = [(torch.cuda, "current_device", lambda: torch.device("cpu")),
                  (torch.cuda, "synchronize", lambda *args, **kwargs: None),
                  # DDP's gradient sync waits on the current stream's events from megatron-core 0.19 on
                  (torch.cuda, "current_stream", lambda device=None: torch.cpu.current_stream()),
                  (torch.cuda, "empty_cache", lambda: None),
                  (torch.cuda, "memory_allocated", lambda *args, **kwargs: 0),
                  (torch.cuda, "max_memory_allocated", lambda *args, **kwargs: 0)]
    with patched(cuda_calls), cuda_rng_on_cpu(), _CudaToCpuMode():
        logger.debug("No CUDA device: megatron-core runs on CPU (CUDA calls redirected, gloo backend)")
        _active = True
        try:
            yield True
        finally:
            _active = False
