"""One training step in FP8 (Transformer Engine): a finite loss close to bf16's from the same weights."""

import math

import pytest
import torch

from megatron_neobert.evaluation.throughput import mlm_micro_batches
from megatron_neobert.parallel.launch import run_on_ranks
from gpu_cases import ARCH, MICRO_BATCH, SEQ, needs_te

pytestmark = needs_te


def first_step(fp8: bool, packed: bool):
    """(loss before the step, loss of the same batches after it) through the trainer's set-up."""
    from megatron_neobert.training.arguments import parse_args
    from megatron_neobert.training.model_setup import resolve_padded_vocab_size, setup_model_and_optimizer
    from megatron_neobert.training.step import run_micro_batches

    flags = ["--data-path", "synthetic", "--micro-batch-size", str(MICRO_BATCH), "--seq-length", str(SEQ),
             "--bf16", "--transformer-impl", "transformer_engine", "--lr", "1e-3"]
    flags += ["--fp8-format", "hybrid"] if fp8 else []
    args = parse_args(flags)
    _, chunks, optimizer, _ = setup_model_and_optimizer(args, ARCH, resolve_padded_vocab_size(args, ARCH, None, None))
    batches = mlm_micro_batches(SEQ, MICRO_BATCH, 2, ARCH.vocab_size, packed, 0.2, torch.device("cuda"))
    losses = []
    for _ in range(2):
        for c in chunks:
            c.zero_grad_buffer()
        optimizer.zero_grad()
        stats = run_micro_batches(chunks, batches, forward_only=False)
        losses.append(stats.loss)
        optimizer.step()
    return losses


@pytest.mark.skipif(not torch.cuda.is_available() or torch.cuda.get_device_capability() < (8, 9),
                    reason="needs FP8 tensor cores")
@pytest.mark.parametrize("packed", [False, True])
def test_fp8_step_has_a_finite_loss_close_to_bf16(packed):
    bf16 = run_on_ranks(first_step, 1, False, packed)[0]
    fp8 = run_on_ranks(first_step, 1, True, packed)[0]
    assert all(math.isfinite(x) for x in fp8 + bf16)
    for a, b in zip(fp8, bf16):
        assert abs(a - b) / b < 0.02, (fp8, bf16)
    assert fp8[1] < fp8[0]  # the step learned
