"""Precision flags against the machine, checked when the command line becomes the settings: every rule, with
the GPU and Transformer Engine as parameters."""

import pytest

from megatron_neobert.training.config.arguments import parse_settings

H100, A100, B200 = (9, 0), (8, 0), (10, 0)


def check(extra, gpu=H100, te=True):
    return parse_settings(["--data-path", "x", *extra], gpu_capability=gpu, te_available=te).precision


def test_bf16_is_the_default_on_a_gpu_and_fp32_on_cpu():
    assert check([], gpu=H100).bf16 is True
    assert check([], gpu=False, te=False).bf16 is False
    assert check(["--no-bf16", "--no-packed"], gpu=H100).bf16 is False  # fp32 stays available
    assert check(["--no-bf16", "--transformer-impl", "local"], gpu=H100).bf16 is False
    assert check(["--bf16"], gpu=False, te=False).bf16 is True
    assert parse_settings(["--data-path", "x"]).precision.bf16 is False  # this machine: no GPU


@pytest.mark.parametrize("extra, gpu, te, names", [
    # Transformer Engine attention with packed (THD) input has no fp32 backend.
    (["--no-bf16"], H100, True, ["--bf16", "--no-packed", "--transformer-impl"]),
    (["--no-bf16", "--transformer-impl", "transformer_engine"], H100, True, ["--bf16"]),
    (["--transformer-impl", "transformer_engine"], H100, False, ["--transformer-impl"]),
    # FP8 without Transformer Engine (absent, or not the layer spec in use).
    (["--fp8-format", "hybrid"], H100, False, ["--fp8-format", "Transformer Engine"]),
    (["--fp8-format", "hybrid"], False, False, ["--fp8-format"]),
    (["--fp8-format", "e4m3", "--transformer-impl", "local"], H100, True, ["--fp8-format", "--transformer-impl"]),
    # FP8 without bf16.
    (["--fp8-format", "hybrid", "--no-bf16", "--no-packed"], H100, True, ["--fp8-format", "--bf16"]),
    # No FP8 tensor cores; MXFP8 before Blackwell.
    (["--fp8-format", "hybrid"], A100, True, ["--fp8-format", "8.0"]),
    (["--fp8-format", "hybrid", "--fp8-recipe", "mxfp8"], H100, True, ["--fp8-recipe mxfp8", "9.0"]),
    # Tokens per micro-batch (per TP rank with sequence parallelism) not a multiple of 16.
    (["--fp8-format", "hybrid", "--micro-batch-size", "1", "--seq-length", "1000"], H100, True,
     ["--micro-batch-size 1", "--seq-length 1000", "16"]),
    (["--fp8-format", "hybrid", "--micro-batch-size", "1", "--seq-length", "1040",
      "--tensor-model-parallel-size", "2", "--sequence-parallel"], H100, True,
     ["--tensor-model-parallel-size 2", "--seq-length 1040", "16"]),
])
def test_impossible_combinations_are_rejected_naming_the_flags(extra, gpu, te, names):
    with pytest.raises(ValueError) as err:
        check(extra, gpu=gpu, te=te)
    for name in names:
        assert name in str(err.value)


@pytest.mark.parametrize("extra, gpu", [
    (["--fp8-format", "hybrid"], H100),
    (["--fp8-format", "e4m3", "--fp8-recipe", "tensorwise", "--micro-batch-size", "2", "--seq-length", "8"], H100),
    (["--fp8-format", "hybrid", "--fp8-recipe", "mxfp8"], B200),
    # 1 x 1040 tokens split over TP 2 is 520: not a multiple of 16, but without sequence
    # parallelism every TP rank holds all 1040.
    (["--fp8-format", "hybrid", "--micro-batch-size", "1", "--seq-length", "1040",
      "--tensor-model-parallel-size", "2"], H100),
    (["--no-bf16", "--no-packed"], H100),  # TE's unfused attention takes fp32 padded input
    (["--no-bf16"], False),  # CPU: the local spec
])
def test_possible_combinations_pass(extra, gpu):
    check(extra, gpu=gpu, te=True)
