"""Training steps in FP8 (Transformer Engine) against bf16 from the same weights and batches: every linear of the
transformer layers ran in FP8 in the FP8 run and in none in the bf16 run (read from TE's modules as they ran), the
two runs' losses differ, track each other step by step once the FP8 scales are set (from step 3:
evaluation/throughput.py FP8_COMPARED_FROM_STEP says why), and both fall by far more than they differ."""

import math

import pytest
import torch

from execution_checks import LAYER_LINEARS, LinearPrecisions, assert_linears_ran
from megatron_neobert.evaluation.throughput import FP8_COMPARED_FROM_STEP, fp8_loss_gap, mlm_micro_batches
from megatron_neobert.parallel.launch import run_on_ranks
from gpu_cases import ARCH, MICRO_BATCH, SEQ, SHAPE, needs_fp8, needs_te

pytestmark = [needs_te, pytest.mark.integration]

STEPS = 8


def losses_over_steps(fp8: bool, packed: bool):
    """(the loss of each of STEPS optimizer steps on the same two micro-batches, what each layer linear's forwards
    ran in) through the trainer's set-up: a constant learning rate from the first step (no warmup, which would
    start it at 0) and the scheduler stepped as the loop does."""
    from megatron_neobert.training.config.arguments import parse_settings
    from megatron_neobert.training.engine.model_setup import setup_model_and_optimizer
    from megatron_neobert.training.engine.forward_step import run_micro_batches

    flags = ["--mock-data", "--micro-batch-size", str(MICRO_BATCH), "--seq-length", str(SEQ),
             "--bf16", "--transformer-impl", "transformer_engine", "--lr", "1e-3", "--lr-warmup-iters", "0",
             "--lr-decay-style", "constant"]
    flags += ["--fp8-format", "hybrid"] if fp8 else []
    settings = parse_settings(flags)
    _, chunks, optimizer, scheduler = setup_model_and_optimizer(settings, SHAPE)
    device = torch.device("cuda") if torch.cuda.is_available() else torch.device("cpu")
    batches = mlm_micro_batches(SEQ, MICRO_BATCH, 2, ARCH.vocab_size, packed, 0.2, device)
    precisions = LinearPrecisions(chunks)
    losses = []
    for _ in range(STEPS):
        for c in chunks:
            c.zero_grad_buffer()
        optimizer.zero_grad()
        assert optimizer.param_groups[0]["lr"] == 1e-3
        losses.append(run_micro_batches(chunks, batches, forward_only=False).loss)
        stepped, _, _ = optimizer.step()
        assert stepped
        scheduler.step(increment=1)
    return losses, precisions.remove()


def bf16_and_fp8_runs(packed: bool) -> dict:
    """Both runs in one process: one start of Python, CUDA and Transformer Engine for the pair."""
    return {fp8: losses_over_steps(fp8, packed) for fp8 in (False, True)}


@needs_fp8
@pytest.mark.parametrize("packed", [False, True])
def test_fp8_steps_run_in_fp8_and_track_bf16(packed):
    runs = run_on_ranks(bf16_and_fp8_runs, 1, packed)[0]
    (bf16, bf16_linears), (fp8, fp8_linears) = runs[False], runs[True]
    assert len(fp8_linears) == len(LAYER_LINEARS) * ARCH.num_layers
    assert_linears_ran(fp8_linears, fp8=True)
    assert_linears_ran(bf16_linears, fp8=False)
    assert fp8 != bf16, "FP8 gave bf16's losses bit for bit"
    assert all(math.isfinite(x) for x in fp8 + bf16)
    # The same weights and batches: an optimizer that did not step would repeat the first loss.
    # Repeating the batches, the loss falls from 6.9 by 1.2-1.3 nats in 8 steps (the local spec in bf16
    # on a CPU); the floor checked is 0.5 nat, well above FP8's allowed 2% (0.14 nat) from bf16.
    assert bf16[0] - bf16[-1] > 0.5 and fp8[0] - fp8[-1] > 0.5, (fp8, bf16)
    # Steps 1 and 2 ran at, or learnt from, TE's initial scale of 1; the bound holds from the step after.
    gap = fp8_loss_gap(fp8, bf16)
    assert gap < 0.02, f"FP8 {gap:.1%} from bf16 from step {FP8_COMPARED_FROM_STEP} on: {fp8} against {bf16}"
