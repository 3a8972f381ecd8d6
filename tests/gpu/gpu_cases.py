"""Shared pieces of the GPU tests: tiny models on one GPU, weights moved between layer specs,
synthetic MLM batches as the loader makes them, relative errors for bf16 comparisons."""

import pytest
import torch
from megatron.core import tensor_parallel

from megatron_neobert.evaluation.throughput import mlm_batch
from megatron_neobert.model import build_model, resolve_model_shape, transformer_config
from megatron_neobert.model.attention import PACKED_ATTENTION_ENV
from megatron_neobert.kernels import transformer_engine_available
from megatron_neobert.model.layer_specs import _LOCAL_TO_TE_CHECKPOINT_KEYS


def needs(kernel: str, available: bool, what: str):
    """Skips a test when `kernel` (a name REQUIRE_GPU_KERNELS may list; conftest.py then fails the skip) is
    not `available`."""
    return pytest.mark.skipif(not available, reason=f"needs {kernel}: {what}")


GPU = torch.cuda.is_available()
needs_gpu = needs("gpu", GPU, "a CUDA GPU")
needs_te = needs("te", GPU and transformer_engine_available(), "a GPU and Transformer Engine")
needs_fp8 = needs("fp8", GPU and torch.cuda.get_device_capability() >= (8, 9), "FP8 tensor cores (sm89+)")

# Multiples of 16 everywhere (FP8 GEMMs), small enough to run in seconds.
SHAPE = resolve_model_shape("neobert-tiny", dict(num_layers=2, hidden_size=128, num_attention_heads=4,
                                                  ffn_hidden_size=256, vocab_size=1024))
ARCH = SHAPE.arch
SEQ, MICRO_BATCH = 128, 4


def build(impl: str, dtype=torch.bfloat16, seed: int = 0, packed_kernel: str = None):
    """A NeoBERTModel on the GPU with `impl`'s layer spec, initialised from `seed`; on the local spec, running
    `packed_kernel` (flash, flex or sdpa; by default the best available) for packed input: each attention module
    reads NEOBERT_PACKED_ATTENTION once, when it is built."""
    config = transformer_config(ARCH, bf16=dtype == torch.bfloat16, params_dtype=dtype, pipeline_dtype=dtype)
    torch.manual_seed(seed)
    tensor_parallel.model_parallel_cuda_manual_seed(seed)
    with pytest.MonkeyPatch.context() as env:
        if packed_kernel:
            env.setenv(PACKED_ATTENTION_ENV, packed_kernel)
        return build_model(ARCH, config, transformer_impl=impl).cuda()


def loss_and_grads(model, inputs):
    model.zero_grad()
    loss, _ = model(**inputs)
    loss.sum().backward()
    return loss.detach(), {n: p.grad.detach().clone() for n, p in model.named_parameters()}


def te_key(local_key: str) -> str:
    for local, te in _LOCAL_TO_TE_CHECKPOINT_KEYS.items():
        local_key = local_key.replace(local, te)
    return local_key


def copy_local_to_te(local, te) -> None:
    state = {te_key(k): v for k, v in local.state_dict().items() if "_extra_state" not in k}
    missing, unexpected = te.load_state_dict(state, strict=False)
    assert not unexpected and all(k.endswith("_extra_state") for k in missing), (missing, unexpected)


def batch(packed: bool, seed: int = 0, pinned: bool = False):
    """A micro-batch with the loader's fields (masked-position list included), on the host."""
    lengths = [SEQ // 3, SEQ, SEQ // 2, 17][:MICRO_BATCH]
    out = mlm_batch(lengths, SEQ, ARCH.vocab_size, packed, mask_rate=0.2, seed=seed)
    return {k: v.pin_memory() if pinned and torch.is_tensor(v) else v for k, v in out.items()}


def relative_error(actual: torch.Tensor, expected: torch.Tensor) -> float:
    return float((actual.float() - expected.float()).norm() / expected.float().norm().clamp_min(1e-12))
