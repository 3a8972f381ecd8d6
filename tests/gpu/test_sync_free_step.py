"""A training step makes no host-device synchronisation from its first forward to the end of its last backward:
two micro-batches (copy in, forward, MLM loss, backward, DDP's gradient hooks) through megatron-core's schedule as
the trainer runs them, checked on the CUDA runtime calls CUPTI records from every library (PyTorch, Transformer
Engine, cuDNN, Triton, NCCL), which `torch.cuda.set_sync_debug_mode` does not see. First the check's positive
control: an `.item()` and a `.tolist()` planted in a layer must be reported.

Outside the window, by design: megatron-core's finalize_model_grads reads the global token count once per step
(`if num_tokens > 0`), and the trainer then reads the loss and the gradients' finiteness."""

import pytest
import torch

from execution_checks import PLANTED_ITEM, PLANTED_TOLIST, planted_host_reads, profiled_step, runtime_call
from megatron_neobert.model.attention import PACKED_ATTENTION_ENV, flash_attn_varlen
from megatron_neobert.training.config.arguments import parse_settings
from megatron_neobert.training.engine.model_setup import setup_model_and_optimizer
from megatron_neobert.training.engine.forward_step import run_micro_batches
from gpu_cases import MICRO_BATCH, SEQ, SHAPE, batch, needs, needs_fp8, needs_gpu, needs_te

pytestmark = needs_gpu


def warm_trainer_step(monkeypatch, impl: str, packed: bool, kernel=None, flags=()):
    """(the model chunks as the trainer sets them up, two pinned micro-batches), one step already run: the fused
    kernels compiled, the attention backends picked."""
    if kernel:
        monkeypatch.setenv(PACKED_ATTENTION_ENV, kernel)  # before the build, which fixes the kernel
    settings = parse_settings(["--mock-data", "--micro-batch-size", str(MICRO_BATCH), "--seq-length", str(SEQ),
                               "--bf16", "--transformer-impl", impl, "--lr-warmup-iters", "0", *flags])
    _, chunks, _, _ = setup_model_and_optimizer(settings, SHAPE)
    batches = [batch(packed, seed=i, pinned=True) for i in range(2)]
    run_micro_batches(chunks, batches, forward_only=False)
    torch.cuda.synchronize()
    return chunks, batches


def test_the_check_reports_an_item_and_a_tolist_planted_in_a_layer(monkeypatch):
    """The positive control: a GPU profile shows each planted read as a blocking runtime call under it (the CPU
    stand-in, tests/test_execution_checks.py, sees the .item() alone)."""
    chunks, batches = warm_trainer_step(monkeypatch, "local", packed=False)
    # Under DDP and, in bf16, megatron-core's Float16Module: module.module.decoder.layers.0
    name, layer = next((n, m) for n, m in chunks[0].named_modules() if n.endswith("decoder.layers.0"))
    with planted_host_reads(layer):
        report = profiled_step(chunks, batches)
    micro_batches = len(batches)
    for plant in (PLANTED_ITEM, PLANTED_TOLIST):
        found = [sync for sync in report.syncs
                 if runtime_call(sync.split(" < ")[0]) in ("cudaStreamSynchronize", "cudaMemcpy")
                 and f" < {plant} < module: {name}" in sync]
        assert len(found) >= micro_batches, (f"{plant}: {len(found)} cudaStreamSynchronize/cudaMemcpy lines under it, "
                                            f"expected one per micro-batch; the check reported:\n"
                                            + "\n".join(report.syncs))


@pytest.mark.parametrize("impl, packed, kernel, flags", [
    pytest.param("transformer_engine", False, None, (), marks=needs_te),
    pytest.param("transformer_engine", True, None, (), marks=needs_te),
    pytest.param("transformer_engine", True, None, ("--fp8-format", "hybrid"), marks=[needs_te, needs_fp8]),
    ("local", False, None, ()),
    # Packed on the local spec: FlexAttention where flash-attn is absent (as on the GPU host), flash-attn's
    # varlen kernel where it is installed. Its segmented-SDPA fallback reads the document lengths once a step.
    ("local", True, "flex", ()),
    pytest.param("local", True, "flash", (), marks=needs("flash", flash_attn_varlen() is not None, "flash-attn")),
], ids=["te-padded", "te-packed", "te-packed-fp8", "local-padded", "local-packed-flex", "local-packed-flash"])
def test_step_makes_no_host_sync(monkeypatch, impl, packed, kernel, flags):
    report = profiled_step(*warm_trainer_step(monkeypatch, impl, packed, kernel, flags))
    assert report.runtime_calls > 0, "the profiler recorded no CUDA runtime call: the check saw nothing"
    assert not report.syncs, f"{len(report.syncs)} host syncs:\n" + "\n".join(report.syncs)
