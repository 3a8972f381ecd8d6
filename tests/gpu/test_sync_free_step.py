"""A micro-batch step (copy in, forward, MLM loss, backward) makes no host-device synchronisation."""

import pytest
import torch

from megatron_neobert.model.attention import flash_attn_varlen
from megatron_neobert.training.step import mlm_loss_func, model_inputs
from gpu_cases import batch, build, needs, needs_gpu, needs_te

pytestmark = needs_gpu


def step(model, host_batch):
    inputs = model_inputs(host_batch)
    loss, _, _ = mlm_loss_func(inputs["num_masked"], model(**inputs))
    loss.backward()


@pytest.mark.parametrize("impl, packed", [
    ("local", False),
    pytest.param("transformer_engine", False, marks=needs_te),
    pytest.param("transformer_engine", True, marks=needs_te),
    # Packed, the local spec's RoPE (by position, or TE's fused) and flash-attn's varlen kernel make no sync;
    # its segmented-SDPA fallback reads the document lengths once per step.
    pytest.param("local", True, marks=needs("flash", flash_attn_varlen() is not None, "flash-attn")),
])
def test_step_makes_no_host_sync(single_rank, impl, packed):
    model = build(impl).train()
    host_batch = batch(packed, pinned=True)
    step(model, host_batch)  # the first step compiles the fused kernels and picks the backends
    torch.cuda.synchronize()
    torch.cuda.set_sync_debug_mode("error")
    try:
        step(model, host_batch)
    finally:
        torch.cuda.set_sync_debug_mode("default")
    torch.cuda.synchronize()
