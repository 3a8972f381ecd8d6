"""Run megatron-core's tensor, pipeline and data parallel code on CPU, over gloo.

megatron-core is written for CUDA and calls it directly in a handful of places: the current
device, the CUDA RNG state of the tensor-parallel RNG tracker, `torch.cuda.synchronize`,
factory calls with `device="cuda"` (or a device index), `Tensor.cuda()`, and `Tensor.type()`
names checked by the optimizers and grad clipping. `enable_cpu_execution()` redirects each of
those to the CPU so that the same code paths (TP/PP/DP, the distributed optimizer, distributed
checkpoints) run unchanged with several gloo processes: in CI, and on a laptop to debug a run.
On a machine with CUDA it does nothing.
"""

import logging

import torch
from torch.overrides import TorchFunctionMode

logger = logging.getLogger(__name__)

_mode = None


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


def _patch_cuda_rng():
    """Point the CUDA RNG functions megatron-core uses at the CPU default generator.

    The tensor-parallel RNG tracker forks "CUDA" RNG states around dropout and initialisation;
    on CPU the generator those kernels use is the CPU one, so the fork swaps that state.
    """
    from megatron.core.tensor_parallel import random as mcore_random

    def get_state(device="cuda", *args, **kwargs):
        return torch.get_rng_state()

    def set_state(new_state, device=-1, *args, **kwargs):
        torch.set_rng_state(new_state)

    torch.cuda.get_rng_state = get_state
    torch.cuda.set_rng_state = set_state
    torch.cuda.manual_seed = torch.manual_seed
    torch.cuda.random.get_rng_state = get_state
    mcore_random._get_cuda_rng_state = get_state
    mcore_random._set_cuda_rng_state = set_state


def enable_cpu_execution() -> bool:
    """Redirect megatron-core's CUDA calls to the CPU, once per process.

    Returns True when the redirection is active (no CUDA device), False on a CUDA machine.
    """
    global _mode
    if torch.cuda.is_available():
        return False
    if _mode is not None:
        return True
    # The device itself rather than an index: megatron-core passes it as `device=` also inside
    # autograd backward functions, where the function mode below is not active.
    torch.cuda.current_device = lambda: torch.device("cpu")
    torch.cuda.synchronize = lambda *args, **kwargs: None
    torch.cuda.empty_cache = lambda: None
    torch.cuda.memory_allocated = lambda *args, **kwargs: 0
    torch.cuda.max_memory_allocated = lambda *args, **kwargs: 0
    _patch_cuda_rng()
    _mode = _CudaToCpuMode()
    _mode.__enter__()  # stays active for the life of the process
    logger.info("No CUDA device: megatron-core runs on CPU (CUDA calls redirected, gloo backend)")
    return True

